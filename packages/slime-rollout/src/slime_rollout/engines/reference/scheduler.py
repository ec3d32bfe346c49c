"""Request scheduler of the reference engine: static batching over concurrent HTTP requests.

Requests queue up; the scheduler waits `batch_wait_s` after the first arrival to collect more, then runs up
to `max_running_requests` of them as one batch in a worker thread (torch releases the GIL, so the event
loop keeps serving control endpoints). Requests arriving during a batch form the next one.

Pause modes follow SGLang's `PauseGenerationReqInput.mode`: "abort" aborts everything queued or running and
holds new batches; "in_place" and "retract" hold new batches and stall the running one between decode steps
until /continue_generation (the reference engine keeps its KV cache in both cases).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from slime_rollout.engines.reference.model import GenRequest, ReferenceModel

__all__ = ["Scheduler"]

logger = logging.getLogger(__name__)


class Scheduler:
    """Collects /generate requests into batches and runs them on a `ReferenceModel`.

    Args:
        model: the model to run.
        max_running_requests: largest batch.
        batch_wait_s: how long to wait for more requests after the first one arrives (seconds).
        random_seed: seed of the per-request generators when a request gives no `sampling_seed`.
    """

    def __init__(self, model: ReferenceModel, *, max_running_requests: int, batch_wait_s: float, random_seed: int):
        if max_running_requests < 1:
            raise ValueError(f"--max-running-requests must be >= 1, got {max_running_requests}")
        self.model = model
        self.max_running_requests = max_running_requests
        self.batch_wait_s = batch_wait_s
        self.random_seed = random_seed
        self._seed_counter = itertools.count()
        self._waiting: list[tuple[GenRequest, asyncio.Future]] = []
        self._running: list[GenRequest] = []
        self._wakeup = asyncio.Event()
        self._resumed = threading.Event()
        self._resumed.set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-engine")
        self._task: asyncio.Task | None = None
        self.paused = False

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Starts the batching loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Aborts everything and stops the loop."""
        self.abort(abort_all=True)
        self._resumed.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=True, cancel_futures=True)

    # --------------------------------------------------------------------------------------------- public

    def make_generator(self, sampling_seed: int | None) -> torch.Generator:
        """A CPU generator seeded by the request's `sampling_seed`, else by `random_seed` and arrival order."""
        gen = torch.Generator()
        gen.manual_seed(
            sampling_seed if sampling_seed is not None else self.random_seed * 1_000_003 + next(self._seed_counter)
        )
        return gen

    async def submit(self, req: GenRequest) -> GenRequest:
        """Queues a request and waits until it is finished (stop, length or abort)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append((req, fut))
        self._wakeup.set()
        return await fut

    def abort(self, *, rid: str | None = None, abort_all: bool = False) -> int:
        """Aborts queued and running requests (all, or those with `rid`); returns how many were hit."""
        hit = 0
        still_waiting = []
        for req, fut in self._waiting:
            if abort_all or req.rid == rid:
                req.aborted = True
                req.finish_reason = {"type": "abort", "message": "Abort before prefill"}
                if not fut.done():
                    fut.set_result(req)
                hit += 1
            else:
                still_waiting.append((req, fut))
        self._waiting = still_waiting
        for req in self._running:
            if abort_all or req.rid == rid:
                req.aborted = True
                hit += 1
        return hit

    def pause(self, mode: str) -> None:
        """Pauses generation (SGLang modes "abort", "retract", "in_place").

        Raises:
            ValueError: unknown mode.
        """
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause_generation: mode must be abort|retract|in_place, got {mode!r}")
        self.paused = True
        if mode == "abort":
            self.abort(abort_all=True)
        else:
            self._resumed.clear()

    def resume(self) -> None:
        """Continues generation after `pause`."""
        self.paused = False
        self._resumed.set()
        self._wakeup.set()

    @property
    def num_running(self) -> int:
        """Requests in the batch being generated."""
        return sum(1 for r in self._running if not r.finished)

    @property
    def num_waiting(self) -> int:
        """Requests queued for a later batch."""
        return len(self._waiting)

    # ------------------------------------------------------------------------------------------- internal

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self.paused or not self._waiting:
                continue
            if self.batch_wait_s > 0 and len(self._waiting) < self.max_running_requests:
                await asyncio.sleep(self.batch_wait_s)
            batch = self._waiting[: self.max_running_requests]
            self._waiting = self._waiting[self.max_running_requests :]
            self._running = [req for req, _ in batch]
            try:
                await loop.run_in_executor(self._executor, self.model.generate, self._running, self._resumed.wait)
            except Exception as exc:  # a failed batch must not kill the server: fail its requests
                logger.exception("generation batch failed")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
            finally:
                self._running = []
            for req, fut in batch:
                if not fut.done():
                    fut.set_result(req)
            if self._waiting:
                self._wakeup.set()
