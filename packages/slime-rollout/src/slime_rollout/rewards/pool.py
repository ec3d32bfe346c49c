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

Queueing: at most `num_workers` calls per event loop are submitted at a time (an asyncio semaphore), so
the deadline measures grading (plus, for a fresh pool, worker start-up), not waiting behind other calls.
Several event loops sharing the pool may still queue behind each other.

As with every spawn-based pool, the main module of the program must be import-safe
(`if __name__ == "__main__":`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import threading
import weakref
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_DEADLINE_S", "has_returned", "pool_generation", "run_in_pool", "shutdown_pool"]

# Parent-side deadline of one call: a safety net for hangs that SIGALRM cannot interrupt. A math grading
# has a 10 s budget in the worker (`slime_rollout.rewards.math.WORKER_TIMEOUT_S`); the first call on a fresh
# worker also pays its start-up (spawn + imports of sympy and math-verify, several seconds on a loaded
# 2-core machine).
DEFAULT_DEADLINE_S = 60.0

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
_semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _warm_up_worker() -> None:
    # Import the graders once per worker, at start-up, rather than inside the first call's deadline.
    from slime_rollout.rewards.math_utils import prepare_worker

    prepare_worker()


def _kill(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Kills a pool's workers without waiting for their current calls, then shuts it down."""
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
    pool.shutdown(wait=False, cancel_futures=True)


def _acquire(num_workers: int) -> tuple[concurrent.futures.ProcessPoolExecutor, int]:
    """The process-wide pool with `num_workers` workers (created or resized here) and its generation."""
    global _pool, _pool_workers, _generation, _exit_hook_registered
    old = None
    with _lock:
        if _pool is None or _pool_workers != num_workers:
            old = _pool
            _pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=num_workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_warm_up_worker,
            )
            _pool_workers = num_workers
            _generation += 1
            logger.info("started the reward grading pool (%d worker processes, spawned on demand)", num_workers)
            if not _exit_hook_registered:
                _register_exit_hook()
                _exit_hook_registered = True
        pool, generation = _pool, _generation
    if old is not None:
        _kill(old)
    return pool, generation


def _retire(generation: int) -> None:
    """Drops the pool of `generation` (if still current) and kills its workers; the next call starts a new one."""
    global _pool
    with _lock:
        if _pool is None or _generation != generation:
            return  # already replaced by another call
        old, _pool = _pool, None
    logger.warning("retiring the reward grading pool (a worker is stuck or crashed); the next call starts a new one")
    _kill(old)


def shutdown_pool() -> None:
    """Kills the process-wide grading pool, if any (a later call starts a new one). Idempotent."""
    global _pool
    with _lock:
        old, _pool = _pool, None
    if old is not None:
        _kill(old)


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
            (default `DEFAULT_DEADLINE_S`, read at call time).

    Returns:
        `fn(*args)`.

    Raises:
        ValueError: `num_workers` < 1.
        TimeoutError: the call ran past `deadline_s` (the pool was retired; later calls get a new one).
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
            pool, generation = _acquire(num_workers)
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
