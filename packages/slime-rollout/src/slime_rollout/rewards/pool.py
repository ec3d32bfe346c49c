"""The process pool that grades math answers off the rollout's event loop (`--rm-num-workers`).

Why a process pool: symbolic grading (math-verify, sympy) is CPU-bound Python that can take seconds, and
its timeouts use SIGALRM, which only works on a process's main thread; the rollout's event loop runs on a
background thread. A worker process grades on its own main thread, so the timeouts hold there, and the
event loop only awaits a future.

One pool per process, created lazily (spawn context: forking a process that already runs threads can
deadlock the child), resized when `--rm-num-workers` changes and shut down at interpreter exit.

Stuck workers: a worker can hang in C code that never returns to the interpreter (a huge integer power
inside sympy), where no signal handler runs. `run_in_pool` therefore puts a parent-side deadline on every
call; a call past it *retires* the pool: the pool is dropped from the process-wide slot (the next call
starts a fresh one) and its workers are killed, which also frees their memory. Other calls that were in
flight on the retired pool see `BrokenProcessPool` and are retried once on the fresh pool.

Start-up: a fresh pool first starts all its workers (spawn, import sympy and math-verify, one warm-up
comparison: seconds, far more on a loaded machine) under its own budget, `STARTUP_DEADLINE_S`; each worker reports
in once warm. No call is submitted before every worker has, so a call's deadline measures grading only. A pool
that does not start in time is retired with its own error (`PoolStartupError`), never a verdict.

Cancellation: a caller cancelled while the pool starts stops waiting; the start-up it shared with other
callers goes on (the shared start-up future cannot be cancelled), so later calls still use the pool.

Queueing: at most `num_workers` calls per event loop are submitted at a time (an asyncio semaphore), so
the deadline measures grading, not waiting behind other calls.
Several event loops sharing the pool may still queue behind each other.

Owner death: each worker kills itself within `PARENT_CHECK_S` of the death of the process that owns the pool (a
rollout manager killed mid-rollout), rather than living on as an orphan.

As with every spawn-based pool, the main module of the program must be import-safe
(`if __name__ == "__main__":`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DEADLINE_S",
    "STARTUP_DEADLINE_S",
    "PoolStartupError",
    "has_returned",
    "pool_generation",
    "run_in_pool",
    "shutdown_pool",
]

# Parent-side deadline of one call: a safety net for hangs that SIGALRM cannot interrupt. A math grading
# has a 10 s budget in the worker (`slime_rollout.rewards.math.WORKER_TIMEOUT_S`); worker start-up is not in it.
DEFAULT_DEADLINE_S = 60.0
# Budget of a fresh pool's start-up (every worker spawned and warm), read when the pool is created. Generous:
# on a loaded 2-core machine one worker's imports took over 20 s, and the workers start concurrently.
STARTUP_DEADLINE_S = 300.0

_BROKEN_TWICE = (
    "the reward grading pool broke twice under one call (a worker died; if every call fails, check that the "
    "program's main module is import-safe: spawn imports it in each worker)"
)

_lock = threading.Lock()
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_workers = 0
_generation = 0  # bumped whenever a pool is created; names the pool a call ran on
_exit_hook_registered = False
_returned = threading.Event()  # set once any call has returned from a worker in this process
_startup: concurrent.futures.Future | None = None  # the current pool's start-up: done once every worker is warm
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


class PoolStartupError(RuntimeError):
    """A fresh grading pool's workers did not all start within `STARTUP_DEADLINE_S` (or died while starting)."""


def _warm_up_worker() -> None:
    # Import the graders once per worker, at start-up, rather than inside the first call's deadline.
    from slime_rollout.rewards.math_utils import prepare_worker

    prepare_worker()


# How often a worker checks that the process owning its pool is still alive.
PARENT_CHECK_S = 1.0


def _exit_with_parent(parent_pid: int, period_s: float) -> None:
    """Kills this worker once `parent_pid` is no longer its parent (the pool's owner died; runs on a thread).

    Why: a worker waits on its call queue, whose write end it holds itself, so the owner's death (a rollout manager
    killed with SIGKILL, or by Ray) never ends that wait: the workers lived on as orphans (ppid 1), holding their
    memory. `PR_SET_PDEATHSIG` does not fit: it fires when the *thread* that spawned the worker ends, and workers are
    spawned from short-lived threads (the start-up watcher). A worker stuck in C code that holds the GIL is only
    killed once that code returns (a double fault: the owner's deadline kills a stuck worker while it lives).
    """
    while os.getppid() == parent_pid:
        time.sleep(period_s)
    os.kill(os.getpid(), signal.SIGKILL)  # no exit handlers: they would wait on queues whose other end is gone


def _start_worker(ready: Any, warm_up: Callable[[], None], parent_pid: int) -> None:
    """A worker's initializer: follow the pool owner `parent_pid` out, warm up, then report in on `ready`."""
    threading.Thread(
        target=_exit_with_parent, args=(parent_pid, PARENT_CHECK_S), name="exit-with-parent", daemon=True
    ).start()
    warm_up()
    ready.put(os.getpid())


def _watch_startup(
    pool: concurrent.futures.ProcessPoolExecutor, ready: Any, num_workers: int, budget_s: float, done: Any
) -> None:
    """Starts every worker of `pool` and resolves `done` once all reported in (a thread; bounded by `budget_s`)."""
    deadline = time.monotonic() + budget_s
    # One submission per worker: with no idle worker yet, each submit spawns one (workers start on demand).
    probes = [pool.submit(os.getpid) for _ in range(num_workers)]
    started: set[int] = set()
    error: str | None = None
    while len(started) < num_workers and error is None:
        left = deadline - time.monotonic()
        if left <= 0:
            error = (
                f"only {len(started)} of {num_workers} workers started within its {budget_s:g} s start-up budget "
                "(spawn + imports of sympy and math-verify; the machine may be overloaded)"
            )
            break
        try:
            started.add(ready.get(timeout=min(left, 0.2)))
        except queue.Empty:
            if any(p.done() and (p.cancelled() or p.exception() is not None) for p in probes):
                error = "a worker died while starting, or the pool was shut down"
        except (OSError, ValueError, EOFError):  # the queue was closed: the pool was shut down meanwhile
            error = "the pool was shut down while starting"
    ready.close()
    if not done.done():
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(PoolStartupError(f"reward grading pool: {error}"))


def _kill(pool: concurrent.futures.ProcessPoolExecutor, wait: bool = False) -> None:
    """Kills a pool's workers without waiting for their current calls, then shuts it down.

    `wait`: also join the pool's management thread (quick: the workers are dead), which holds its queues until it
    ends; only then can they be collected, which unlinks their named semaphores.
    """
    kill_workers = getattr(pool, "kill_workers", None)  # public since Python 3.14
    if kill_workers is not None:
        kill_workers()
    else:
        # Python < 3.14 has no public way to stop a busy worker; `_processes` maps pid -> Process.
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            try:
                process.kill()
            except (OSError, ValueError):  # already gone or closed
                pass
    pool.shutdown(wait=wait, cancel_futures=True)


def _acquire(num_workers: int) -> tuple[concurrent.futures.ProcessPoolExecutor, int, concurrent.futures.Future]:
    """The process-wide pool with `num_workers` workers (created or resized here), its generation and start-up."""
    global _pool, _pool_workers, _generation, _exit_hook_registered, _startup
    old = None
    with _lock:
        if _pool is None or _pool_workers != num_workers:
            old = _pool
            context = multiprocessing.get_context("spawn")
            ready = context.Queue()
            _pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=num_workers,
                mp_context=context,
                initializer=_start_worker,
                initargs=(ready, _warm_up_worker, os.getpid()),
            )
            _pool_workers = num_workers
            _generation += 1
            _startup = concurrent.futures.Future()
            # Shared by every caller: mark it running so no caller's cancellation can cancel it (`cancel()` is then
            # refused), which would make every later call of this process raise CancelledError.
            _startup.set_running_or_notify_cancel()
            threading.Thread(
                target=_watch_startup,
                args=(_pool, ready, num_workers, STARTUP_DEADLINE_S, _startup),
                name=f"grading-pool-{_generation}-startup",
                daemon=True,
            ).start()
            logger.info("starting the reward grading pool (%d worker processes)", num_workers)
            if not _exit_hook_registered:
                _register_exit_hook()
                _exit_hook_registered = True
        pool, generation, startup = _pool, _generation, _startup
    if old is not None:
        _kill(old)
    return pool, generation, startup


def _retire(generation: int, why: str = "a worker is stuck or crashed") -> None:
    """Drops the pool of `generation` (if still current) and kills its workers; the next call starts a new one."""
    global _pool
    with _lock:
        if _pool is None or _generation != generation:
            return  # already replaced by another call
        old, _pool = _pool, None
    logger.warning("retiring the reward grading pool (%s); the next call starts a new one", why)
    _kill(old)


def shutdown_pool(wait: bool = False) -> None:
    """Kills the process-wide grading pool, if any (a later call starts a new one). Idempotent.

    Args:
        wait: join the pool's management thread too, so that its queues (and their named semaphores in /dev/shm) go
            with the next garbage collection rather than at this process's orderly exit (a process killed with
            its children, the resource tracker among them, left them behind).
    """
    global _pool
    with _lock:
        old, _pool = _pool, None
    if old is not None:
        _kill(old, wait=wait)


def has_returned() -> bool:
    """Whether any call has come back from a worker in this process (the pool can run work at all)."""
    return _returned.is_set()


def pool_generation() -> int:
    """How many pools this process has created so far (grows when a stuck or broken pool is replaced)."""
    return _generation


def _register_exit_hook() -> None:
    # concurrent.futures joins its pools' worker processes from a `threading` exit hook, which would wait
    # forever on a worker stuck in C code. Hooks run last-registered first, so this one, registered after
    # concurrent.futures' own, kills our workers before that join.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(shutdown_pool)
            return
    except RuntimeError:  # interpreter already shutting down
        return
    import atexit

    atexit.register(shutdown_pool)


def _semaphore(num_workers: int) -> asyncio.Semaphore:
    # asyncio primitives bind to one loop; the rollout may run several loops (threads) in one process.
    loop = asyncio.get_running_loop()
    entry = _semaphores.get(loop)
    if entry is None or entry[0] != num_workers:
        entry = (num_workers, asyncio.Semaphore(num_workers))
        _semaphores[loop] = entry
    return entry[1]


async def run_in_pool[T](fn: Callable[..., T], *args: Any, num_workers: int, deadline_s: float | None = None) -> T:
    """Runs `fn(*args)` in the process-wide worker pool without blocking the event loop.

    Args:
        fn: a picklable, module-level function (it is imported by name in the worker).
        *args: picklable arguments.
        num_workers: pool size (`--rm-num-workers`); the pool is resized if it differs.
        deadline_s: seconds the call may run in a worker before it is abandoned and the pool retired
            (default `DEFAULT_DEADLINE_S`, read at call time); counted from submission to a started pool, so
            a fresh pool's start-up (`STARTUP_DEADLINE_S`) is not part of it.

    Returns:
        `fn(*args)`.

    Raises:
        ValueError: `num_workers` < 1.
        TimeoutError: the call ran past `deadline_s` (the pool was retired; later calls get a new one).
        PoolStartupError: a fresh pool did not start within `STARTUP_DEADLINE_S` (retired; nothing was graded).
        concurrent.futures.process.BrokenProcessPool: the pool broke twice under this call (its worker
            crashed, e.g. killed for memory).
        Exception: whatever `fn` raised in the worker.
    """
    if num_workers < 1:
        raise ValueError(f"--rm-num-workers must be >= 1 to grade in a pool, got {num_workers}")
    if deadline_s is None:
        deadline_s = DEFAULT_DEADLINE_S
    async with _semaphore(num_workers):
        for attempt in range(2):
            pool, generation, startup = _acquire(num_workers)
            try:
                # Bounded by the start-up budget (`_watch_startup`); shielded: a cancelled caller stops only its own
                # wait, never the start-up that other callers share.
                await asyncio.shield(asyncio.wrap_future(startup))
            except PoolStartupError as e:
                _retire(generation, why=str(e))
                raise
            try:
                future = pool.submit(fn, *args)
            except (BrokenProcessPool, RuntimeError):  # broken or retired between _acquire and submit
                _retire(generation)
                continue
            try:
                result = await asyncio.wait_for(asyncio.wrap_future(future), timeout=deadline_s)
                _returned.set()
                return result
            except TimeoutError:
                _retire(generation)
                raise TimeoutError(f"grading ran past its {deadline_s:g} s deadline") from None
            except BrokenProcessPool:
                # Either another call retired this pool (we are a bystander: retry on the new one) or a
                # worker died, perhaps on this very call (retry once; a second break is final).
                _retire(generation)
                if attempt == 1:
                    raise BrokenProcessPool(_BROKEN_TWICE) from None
                logger.debug("grading pool %d broke under a call; retrying once on a new pool", generation)
    raise BrokenProcessPool(_BROKEN_TWICE)
