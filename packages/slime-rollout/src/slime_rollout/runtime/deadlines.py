"""Bounded, logged waits on user code and on engines (`await_with_deadline`, `call_plugin_with_deadline`).

A reward function that never returns, or an engine that froze, must not stall a run silently. Every such await
goes through `await_with_deadline`: while it runs, a warning every `warn_every_s` seconds says what is still
running and for how long; at `deadline_s` the work is cancelled and `DeadlineExceeded` names it, the deadline and
the flag that sets it. An optional `on_slow` check runs at each warning and may raise (the engine pool probes a
slow request's engine there, so a frozen engine fails the run at once rather than at the deadline).

A synchronous plugin is run in a thread of its own: on the event loop a call that never returns would block the
loop and with it every timer, so no deadline could fire. A thread cannot be killed: past the deadline the rollout
fails and the thread is abandoned. It is a daemon thread, not one of the loop's default executor, whose shutdown
(at the end of `asyncio.run`) would wait for it.

A plugin that raises `SystemExit` (a stray `sys.exit()`, `exit()` in a script turned into a plugin) or another
`BaseException` that is not an `Exception` would end the whole process from inside asyncio with no word of which
plugin or sample; `call_plugin_with_deadline` turns it into `PluginExit`, an ordinary error its caller names.
`KeyboardInterrupt` and `asyncio.CancelledError` still propagate: they are the user's and the loop's, not the
plugin's; but a `KeyboardInterrupt` raised in a sync plugin's thread is the plugin's own (signals reach only the
main thread), so it is a `PluginExit` too. A sync plugin's `StopIteration` (a stray `next()` on an empty iterator)
becomes a `RuntimeError`, as in a coroutine: a future cannot hold it.

Limitation: an `async def` plugin that blocks synchronously (`time.sleep`, CPU-bound work, blocking I/O) runs on
the event loop itself, and nothing on the loop can preempt it: no timer fires while it runs, so the warnings are
late and the deadline cannot cancel it. `slime_rollout.runtime.loop_watchdog` watches the loop from a thread: it logs
one warning naming the plugin once the loop has been blocked for `min(warn_every_s, deadline_s)`, one error if the block
outlasts the deadline, and a call that blocked the loop and comes back past its deadline fails with
`DeadlineExceeded` (its result discarded). Other calls in flight meanwhile lose that time too: one whose deadline
passes so fails with the culprit named in its error. A block that never ends keeps
the run stuck: only a plain `def` plugin (run in a thread) is truly bounded.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from slime_core.hook_deadline import hook_bounds, note_raised_by
from slime_rollout.runtime import async_utils
from slime_rollout.runtime.loop_watchdog import watching

__all__ = [
    "DeadlineExceeded",
    "PluginExit",
    "await_with_deadline",
    "backstop_timeout_s",
    "call_plugin_with_deadline",
    "call_in_thread_with_deadline",
    "call_plugin_with_deadline_sync",
    "in_daemon_thread",
    "plugin_bounds",
    "rollout_function_bounds",
]

logger = logging.getLogger(__name__)


class DeadlineExceeded(TimeoutError):
    """A bounded wait ran past its deadline; the message names what ran, for how long, and the flag."""


class PluginExit(Exception):  # noqa: N818 - it names what the plugin did, not an error of ours
    """A plugin raised `SystemExit` or another non-`Exception` `BaseException` (chained as `__cause__`).

    The message is the original's type and text (`SystemExit: 3`).
    """


def backstop_timeout_s(deadline_s: float | None) -> float | None:
    """A transport read timeout for work that `await_with_deadline` bounds at `deadline_s`.

    Set past the deadline (by 5 % and at least 10 s) so the deadline, whose message names the flag that sets it,
    fires first: a socket read timeout equal to the deadline would win the race whenever the loop was busy at the
    deadline (e.g. in `on_slow`) and fail with aiohttp's bare "Timeout on reading data from socket". It stays as a
    backstop in case the bounded wait is bypassed. None (no deadline) stays None.
    """
    return None if deadline_s is None else deadline_s + max(10.0, 0.05 * deadline_s)


async def await_with_deadline[T](
    aw: Awaitable[T],
    *,
    what: str,
    deadline_s: float | None,
    flag: str,
    warn_every_s: float,
    on_slow: Callable[[float], Awaitable[None]] | None = None,
    warn: Callable[[str], None] | None = None,
) -> T:
    """Awaits `aw`, warning while it runs and cancelling it at the deadline.

    Args:
        aw: the coroutine or future to wait for.
        what: names the work in messages, e.g. `"reward fn my.rm for sample 3"`.
        deadline_s: seconds before it is cancelled (None: no deadline, warnings only).
        flag: the flag that sets the deadline, named in messages.
        warn_every_s: seconds between "still running" warnings (> 0).
        on_slow: `await on_slow(elapsed_s)` at each warning; what it raises cancels the work and propagates.
        warn: `warn(message)` logs each "still running" warning instead of this module's logger (a caller with many
            such calls at once folds them into one line).

    Returns:
        What `aw` returns.

    Raises:
        DeadlineExceeded: `deadline_s` passed (the work was cancelled).
        ValueError: `warn_every_s` <= 0.
        Exception: what `aw` or `on_slow` raised.
    """
    if not warn_every_s > 0:
        raise ValueError(f"warn_every_s must be > 0, got {warn_every_s}")
    task = asyncio.ensure_future(aw)
    start = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - start
            wait_s = warn_every_s if deadline_s is None else min(warn_every_s, deadline_s - elapsed)
            done, _ = await asyncio.wait({task}, timeout=max(wait_s, 0.0))
            if done:
                return task.result()
            elapsed = time.monotonic() - start
            if deadline_s is not None and elapsed >= deadline_s:
                raise DeadlineExceeded(f"{what} did not finish within {deadline_s:g} s ({flag}); cancelled")
            message = f"{what} still running after {elapsed:.0f} s (deadline {_shown(deadline_s)}, {flag})"
            if warn is None:
                logger.warning("%s", message)
            else:
                warn(message)
            if on_slow is not None:
                await on_slow(elapsed)
    finally:
        if not task.done():
            task.cancel()


def in_daemon_thread(fn: Callable[..., Any], *args: Any, name: str, **kwargs: Any) -> asyncio.Future:
    """A future of `fn(*args, **kwargs)` run in a new daemon thread named `name` (resolved on the calling loop).

    Not `asyncio.to_thread`: `asyncio.run` joins the loop's default executor before it returns, so a call left
    waiting (a hung plugin past its deadline, a collective an engine refused its part of) would hold the run's end
    back. A daemon thread is abandoned instead.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if future.done():
            return
        if failed:
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def target() -> None:
        try:
            outcome, failed = fn(*args, **kwargs), False
        except StopIteration as e:
            # A future refuses StopIteration (TypeError in the loop's callback: the await never ended); a coroutine
            # turns it into RuntimeError (PEP 479), and so does this.
            outcome, failed = RuntimeError(f"{type(e).__name__} raised: {e}".rstrip(": ")), True
            outcome.__cause__ = e
        except KeyboardInterrupt as e:
            # Signals reach only the main thread: this one is the plugin's own `raise`, not the user's Ctrl-C.
            outcome, failed = PluginExit(f"{type(e).__name__}: {e}".rstrip(": ")), True
            outcome.__cause__ = e
        except BaseException as e:  # handed to the awaiting task, which raises it
            outcome, failed = e, True
        try:
            loop.call_soon_threadsafe(settle, outcome, failed)
        except RuntimeError:  # the loop closed meanwhile (the call was abandoned past its deadline)
            pass

    threading.Thread(target=target, name=f"plugin: {name}"[:60], daemon=True).start()
    return future


def _shown(deadline_s: float | None) -> str:
    return "none" if deadline_s is None else f"{deadline_s:g} s"


async def call_plugin_with_deadline(
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    deadline_s: float,
    flag: str,
    warn_every_s: float,
    convert: Callable[[Any], Any] | None = None,
    plain: Callable[[Any], bool] | None = None,
    **kwargs: Any,
) -> Any:
    """Calls a sync or async plugin under `await_with_deadline` (a sync one in a worker thread).

    Args:
        fn: the plugin (`async def` or plain function; a plain one returning an awaitable is awaited too).
        *args: its positional arguments.
        what: names the plugin and the sample in messages.
        deadline_s: seconds the call may take, awaiting included.
        flag: the flag that sets the deadline.
        warn_every_s: seconds between "still running" warnings.
        convert: applied to the plugin's value in a worker thread, within the same deadline: reading a returned
            object (its `__float__`, `__bool__`, `__iter__`) runs the plugin's code too. Returns what it returns.
        plain: `plain(value)` True means `value` runs no plugin code (an exact `float`): `convert` then runs
            inline, without a thread (a thread costs about 0.2 ms a call).
        **kwargs: its keyword arguments.

    Raises:
        DeadlineExceeded: the call ran past `deadline_s`, or it blocked the event loop and came back past it.
        PluginExit: the plugin raised `SystemExit` or another `BaseException` that is not an `Exception`
            (`KeyboardInterrupt` and `asyncio.CancelledError` propagate as they are).
        Exception: what the plugin raised, with a note `(raised by <what>)` shown in its traceback.
    """

    async def call() -> Any:
        try:
            if inspect.iscoroutinefunction(fn):
                result = await fn(*args, **kwargs)
            else:
                result = await in_daemon_thread(fn, *args, name=what, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            if convert is None:
                return result
            if plain is not None and plain(result):
                return convert(result)
            return await in_daemon_thread(convert, result, name=what)
        except DeadlineExceeded:  # its own: names the call already
            raise
        except Exception as e:
            # The type stays the caller's to catch; the traceback (Ray's included) says which plugin and sample.
            # Once only: the innermost call names it best, and a plugin re-raising one stored error object must not
            # grow its notes call after call.
            note_raised_by(e, what)
            raise
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise
        except BaseException as e:  # SystemExit & co.: inside a task they would stop the loop and the process
            raise PluginExit(f"{type(e).__name__}: {e}") from e

    task = asyncio.ensure_future(call())
    # An async plugin that blocks the loop cannot be cancelled at its deadline (see the module docstring).
    warn_after_s = min(warn_every_s, deadline_s)
    try:
        with watching(task, what=what, warn_after_s=warn_after_s, deadline_s=deadline_s, flag=flag) as watched:
            try:
                result = await await_with_deadline(
                    task, what=what, deadline_s=deadline_s, flag=flag, warn_every_s=warn_every_s
                )
            except DeadlineExceeded as e:
                if not watched.delayed_by:
                    raise
                # Its time ran out while another call held the loop: name the culprit, not only this victim.
                culprits = "; ".join(sorted(watched.delayed_by))
                raise DeadlineExceeded(f"{e} (the event loop was blocked meanwhile by {culprits})") from None
    finally:
        task.cancel()  # a no-op once done; otherwise (bad arguments) the call never runs
    if watched.blocked_s > 0 and time.monotonic() - watched.start > deadline_s:
        raise DeadlineExceeded(
            f"{what} did not finish within {deadline_s:g} s ({flag}): it blocked the event loop for "
            f"{watched.blocked_s:.0f} s (synchronous code in an async def), so it could not be cancelled in time; "
            "its result is discarded"
        )
    return result


def call_plugin_with_deadline_sync(
    fn: Callable[..., Any], *args: Any, what: str, deadline_s: float, flag: str, warn_every_s: float, **kwargs: Any
) -> Any:
    """`call_plugin_with_deadline` for synchronous callers (the rollout manager's thread), on the rollout loop.

    The plugin runs in a daemon thread (an `async def` one on the rollout loop), so a plugin that itself calls
    `async_utils.run` (the default rollout function does) still finds the loop free. Past the deadline its thread is
    abandoned, and work it handed to the loop goes on until the process ends: the caller is expected to fail the run.

    Args:
        fn: the plugin.
        *args: its positional arguments.
        what: names the plugin (its flag and import path) and the rollout in messages.
        deadline_s: seconds the call may take.
        flag: the flag that sets the deadline.
        warn_every_s: seconds between "still running" warnings.
        **kwargs: its keyword arguments.

    Returns:
        What the plugin returned.

    Raises:
        DeadlineExceeded: the call ran past `deadline_s`.
        PluginExit: the plugin raised `SystemExit` or another non-`Exception` `BaseException`.
        RuntimeError: called from the rollout loop's own thread (await `call_plugin_with_deadline` there).
        Exception: what the plugin raised.
    """
    bounds = {"what": what, "deadline_s": deadline_s, "flag": flag, "warn_every_s": warn_every_s}
    return async_utils.run(call_plugin_with_deadline(fn, *args, **bounds, **kwargs))


def call_in_thread_with_deadline(
    fn: Callable[..., Any], *args: Any, what: str, deadline_s: float, flag: str, warn_every_s: float, **kwargs: Any
) -> Any:
    """Calls `fn` in a daemon thread and waits for it from this thread, without the rollout loop.

    For user code that may itself hold the rollout loop (the fully-async producer's state is saved on the loop, in
    one step with the data source's `save`): `call_plugin_with_deadline_sync` keeps its timers on that loop, so
    they would not fire while it is held. Past the deadline the thread is abandoned; the caller fails the run.

    Args:
        fn: the user code (a plain callable; what it returns is returned as is).
        *args: its positional arguments.
        what: names it (flag and import path) in messages.
        deadline_s: seconds the call may take.
        flag: the flag that sets the deadline.
        warn_every_s: seconds between "still running" warnings.
        **kwargs: its keyword arguments.

    Raises:
        DeadlineExceeded: the call ran past `deadline_s`.
        PluginExit: it raised `SystemExit` or another non-`Exception` `BaseException`.
        Exception: what it raised, with a note `(raised by <what>)`.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, which raises it
            outcome["error"] = e

    thread = threading.Thread(target=target, name=f"plugin: {what}"[:60], daemon=True)
    start = time.monotonic()
    thread.start()
    while thread.is_alive():
        elapsed = time.monotonic() - start
        if elapsed >= deadline_s:
            raise DeadlineExceeded(f"{what} did not finish within {deadline_s:g} s ({flag})")
        thread.join(min(warn_every_s, deadline_s - elapsed))
        if thread.is_alive() and time.monotonic() - start < deadline_s:
            logger.warning("%s still running after %.0f s (deadline %s, %s)", what, time.monotonic() - start,
                           _shown(deadline_s), flag)  # fmt: skip
    error = outcome.get("error")
    if isinstance(error, Exception):
        note_raised_by(error, what)
        raise error
    if error is not None:
        raise PluginExit(f"{type(error).__name__}: {error}") from error
    return outcome.get("value")


def rollout_function_bounds(args: Any) -> dict[str, Any]:
    """The deadline of one `--rollout-function-path`/`--eval-function-path` call (`--rollout-timeout-secs`).

    A whole rollout runs for minutes as a matter of course, so its "still running" warnings come at each quarter
    of the deadline (never more often than `--slow-call-warning-secs`), not every `--slow-call-warning-secs`.

    Args:
        args: the run's config or plugin view; reads `rollout_timeout_secs`, `slow_call_warning_secs`.

    Returns:
        `call_plugin_with_deadline`'s `deadline_s`, `flag` and `warn_every_s`.
    """
    deadline_s = args.rollout_timeout_secs
    return {
        "deadline_s": deadline_s,
        "flag": "--rollout-timeout-secs",
        "warn_every_s": max(deadline_s / 4, args.slow_call_warning_secs),
    }


def plugin_bounds(args: Any) -> dict[str, Any]:
    """The deadline of one rollout plugin call (`--plugin-timeout-secs`), its flag and its warning interval.

    Args:
        args: the run's config or plugin view; reads `plugin_timeout_secs`, `slow_call_warning_secs`.

    Returns:
        `call_plugin_with_deadline`'s `deadline_s`, `flag` and `warn_every_s`.
    """
    return hook_bounds(args)  # the trainer-side hooks' bounds: one flag, one rule
