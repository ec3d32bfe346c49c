"""Request scheduler of the reference engine: continuous batching over concurrent HTTP requests.

Requests queue up; the scheduler waits `batch_wait_s` after the first arrival to collect more, then runs
them in a worker thread (torch releases the GIL, so the event loop keeps serving control endpoints). While
that generation loop runs it admits queued requests between decode steps (up to `max_running_requests` in
flight) and hands each request back as soon as it finishes.

Pause modes follow SGLang's `PauseGenerationReqInput.mode`: "abort" aborts everything queued or running and
holds new batches; "in_place" and "retract" hold new batches and stall the running one between decode steps
until /continue_generation (the reference engine keeps its KV cache in both cases).

A batch runs one LoRA adapter (or the base model): requests for other adapters wait for the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.reference.request import GenRequest, queued_abort_reason

__all__ = ["Scheduler"]

logger = logging.getLogger(__name__)

_FIRST = object()  # `_take`: the adapter of the oldest waiting request


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
        self._running: dict[GenRequest, asyncio.Future] = {}
        self._lock = threading.Lock()  # guards _waiting/_running between the event loop and the model thread
        self._loop_ref: asyncio.AbstractEventLoop | None = None
        self._wakeup = asyncio.Event()
        self._resumed = threading.Event()
        self._resumed.set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-engine")
        self._task: asyncio.Task | None = None
        self.paused = False
        self._paused_since: float | None = None  # time.monotonic() of the pause in force
        # time.monotonic() of the last decode step: SGLang's /health_generate calls a busy engine healthy only when
        # output arrives after the probe began (`last_receive_tstamp`), not because requests are running.
        self.last_step_at = time.monotonic()

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Starts the batching loop on the running event loop."""
        self._loop_ref = asyncio.get_running_loop()
        self._task = self._loop_ref.create_task(self._loop())

    async def stop(self) -> None:
        """Aborts everything and stops the loop."""
        self.abort(abort_all=True, held_too=True)
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
        with self._lock:
            self._waiting.append((req, fut))
        self._wakeup.set()
        return await fut

    def abort(self, *, rid: str | None = None, abort_all: bool = False, held_too: bool = False) -> int:
        """Aborts queued and running requests (all, or those with `rid`); returns how many were hit.

        A request that arrived while generation is paused is not hit (unless `held_too`): SGLang's tokenizer manager
        holds it before its scheduler, where aborts act (`TokenizerManager.abort_request` -> `Scheduler.abort_request`),
        so it survives and runs after `/continue_generation`.
        """
        hit = 0
        with self._lock:
            still_waiting = []
            for req, fut in self._waiting:
                if (abort_all or req.rid == rid) and (held_too or not self._held(req)):
                    req.aborted = True
                    req.finish_reason = queued_abort_reason()
                    if not fut.done():
                        fut.set_result(req)
                    hit += 1
                else:
                    still_waiting.append((req, fut))
            self._waiting = still_waiting
            for req in self._running:
                if abort_all or req.rid == rid:
                    req.aborted = True  # the model thread finishes it at its next step
                    hit += 1
        return hit

    def pause(self, mode: str) -> None:
        """Pauses generation (SGLang modes "abort", "retract", "in_place").

        Raises:
            ValueError: unknown mode.
        """
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause_generation: mode must be abort|retract|in_place, got {mode!r}")
        if not self.paused:
            self._paused_since = time.monotonic()
        self.paused = True
        if mode == "abort":
            self.abort(abort_all=True)
        else:
            self._resumed.clear()

    def resume(self) -> None:
        """Continues generation after `pause`."""
        self.paused = False
        self._paused_since = None
        self._resumed.set()
        self._wakeup.set()

    @property
    def num_running(self) -> int:
        """Requests admitted to the generation loop and not finished yet."""
        with self._lock:
            return sum(1 for r in self._running if not r.finished)

    @property
    def num_scheduled(self) -> int:
        """Requests SGLang's scheduler would hold: running ones, and queued ones that arrived before the pause.

        SGLang's tokenizer manager holds back what arrives while generation is paused (`is_pause_cond`), so those
        requests never reach its scheduler (and do not keep `/flush_cache` from succeeding).
        """
        with self._lock:
            waiting = sum(1 for req, _ in self._waiting if not self._held(req))
            return waiting + sum(1 for req in self._running if not req.finished)

    @property
    def num_queued(self) -> int:
        """Queued requests SGLang's scheduler would hold (its loads' `num_waiting_reqs`): none held by a pause."""
        with self._lock:
            return sum(1 for req, _ in self._waiting if not self._held(req))

    def _held(self, req: GenRequest) -> bool:
        """Whether `req` arrived while generation is paused (SGLang holds it before its scheduler)."""
        return self._paused_since is not None and req.created >= self._paused_since

    @property
    def num_waiting(self) -> int:
        """Requests queued and not admitted yet."""
        with self._lock:
            return len(self._waiting)

    # ------------------------------------------------------------------------------------------- internal

    def _take(self, n: int, lora: Any = _FIRST) -> list[GenRequest]:
        """Moves up to n queued requests of one LoRA adapter into the running set (called from the model thread too).

        Args:
            n: most requests to take.
            lora: the adapter of the running batch (None: the base model); by default the adapter of the oldest
                waiting request. Requests of other adapters keep their place for a later batch.
        """
        if self.paused or n <= 0:
            return []
        with self._lock:
            if not self._waiting:
                return []
            want = self._waiting[0][0].lora if lora is _FIRST else lora
            taken, rest = [], []
            for item in self._waiting:
                (taken if item[0].lora == want and len(taken) < n else rest).append(item)
            self._waiting = rest
            for req, fut in taken:
                self._running[req] = fut
        return [req for req, _ in taken]

    def _stepped(self) -> None:
        """Called by the model thread after each decode step: records progress, then blocks while paused in place."""
        self.last_step_at = time.monotonic()
        self._resumed.wait()

    def _finish(self, req: GenRequest) -> None:
        """Resolves a finished request's future (called from the model thread)."""
        assert self._loop_ref is not None
        with self._lock:
            fut = self._running.pop(req, None)
        if fut is not None:
            self._loop_ref.call_soon_threadsafe(lambda: fut.done() or fut.set_result(req))

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self.paused or not self.num_waiting:
                continue
            if self.batch_wait_s > 0 and self.num_waiting < self.max_running_requests:
                await asyncio.sleep(self.batch_wait_s)
            first = self._take(self.max_running_requests)
            lora = first[0].lora if first else None  # one batch, one adapter
            try:
                await loop.run_in_executor(
                    self._executor,
                    functools.partial(
                        self.model.generate,
                        first,
                        self._stepped,
                        notify=self._finish,
                        take_new=functools.partial(self._take, lora=lora),
                        max_batch=self.max_running_requests,
                        lora=lora,
                    ),
                )
            except Exception as exc:  # a failed batch must not kill the server: fail its requests
                logger.exception("generation failed")
                with self._lock:
                    failed, self._running = list(self._running.values()), {}
                for fut in failed:
                    if not fut.done():
                        fut.set_exception(exc)
            if self.num_waiting:
                self._wakeup.set()
