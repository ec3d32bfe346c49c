"""The training loops: synchronous (rollout → train → save → weight sync → eval) and one-step-ahead async.

Reads top to bottom: build the placement, the rollout manager and the trainer ranks, push weights,
then loop. Everything is torn down in `finally`, also on errors and Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray

from slime_app.cluster import create_placement, init_ray
from slime_app.rollout_manager import RolloutManager
from slime_app.tracking import Tracker
from slime_app.train_actor import TrainGroup

logger = logging.getLogger(__name__)

_TRANSPORTS = {  # --weight-sync after validation resolved "auto"
    "tensor": "tensor (tensor handles to colocated engines)",
    "disk": "disk (safetensors the engines reload)",
    "distributed": "distributed (broadcast group with the engines: NCCL on GPUs, gloo on CPU)",
}

# Above this mean |trainer log-prob − rollout log-prob| on the first step something is wrong with weight
# sync, temperature or masking (fp32 CPU runs agree to ~1e-6; bf16 GPU runs to ~1e-2).
LOGPROB_DIFF_WARN = 0.05


def _should_run(interval: int | None, rollout_id: int, num_rollout: int) -> bool:
    return bool(interval) and ((rollout_id + 1) % interval == 0 or rollout_id == num_rollout - 1)


class Run:
    """The components of one run, built in order and torn down in reverse."""

    def __init__(self, args: Any):
        self.args = args
        self.output_dir = args.output_dir
        os.makedirs(self.output_dir, exist_ok=True)
        self.tracker = Tracker(args, self.output_dir)
        self.manager = None
        self.trainer = None
        init_ray(args)
        self.placement = create_placement(args)

    def build(self) -> int:
        """Starts engines and trainer ranks, pushes the initial weights; returns the start rollout id."""
        args = self.args
        self.manager = RolloutManager.options(num_cpus=0).remote(
            args.to_dict(), self.placement.rollout_gpu_ids, self.placement.use_gpu
        )
        engine_urls = ray.get(self.manager.start.remote())
        if args.colocate:
            ray.get(self.manager.offload.remote())  # the trainer loads next, on the same GPUs
        start = 0
        if not args.debug_rollout_only:
            self.trainer = TrainGroup(args, self.placement)
            start = self.trainer.init(args.to_dict())
            if start > 0:
                logger.info("resumed model, optimizer and scheduler from --load %s; next rollout %d", args.load, start)
                ray.get(self.manager.load.remote(start - 1))
        if args.start_rollout_id is not None:
            start = args.start_rollout_id
        if self.trainer is not None and engine_urls:
            logger.info("weight sync: %s, %d engine(s)", _TRANSPORTS[args.weight_sync], len(engine_urls))
            self.trainer.connect_engines(engine_urls)
            # Engines always serve the trainer's weights, also after a resume.
            self.tracker.log(start, self._sync_weights(start))
        elif args.colocate:
            ray.get(self.manager.onload.remote())
        return start

    def _sync_weights(self, weight_version: int) -> dict[str, float]:
        """Pushes the trainer's weights (trainer awake); colocated, the two sides then swap GPU memory.

        Colocated order: engine weights memory back → push → trainer sleeps → engine KV cache back.
        """
        colocate = self.args.colocate
        if colocate:
            ray.get(self.manager.onload.remote(["weights"]))
        metrics = self._prefix("perf", self.trainer.update_weights(weight_version))
        if colocate:
            self.trainer.sleep()
            ray.get(self.manager.onload.remote(["kv_cache", "cuda_graph"]))
        return metrics

    @staticmethod
    def _prefix(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
        return {k if "/" in k else f"{prefix}/{k}": v for k, v in metrics.items()}

    def evaluate(self, rollout_id: int) -> None:
        """Runs the eval datasets and logs `eval/*`."""
        metrics = ray.get(self.manager.eval.remote(rollout_id))
        self.tracker.log(rollout_id, metrics)
        self.tracker.eval_line(rollout_id, metrics)

    def train_on(self, rollout_id: int, batch_refs: list[Any], rollout_metrics: dict[str, float]) -> dict[str, float]:
        """Trains on one rollout's batches, then saves and syncs weights."""
        args = self.args
        metrics = dict(rollout_metrics)
        if args.colocate:
            ray.get(self.manager.offload.remote())
            self.trainer.wake_up()
        t0 = time.perf_counter()
        train_metrics = self.trainer.train(rollout_id, batch_refs)
        metrics.update(self._prefix("train", train_metrics))
        metrics["perf/train_time"] = time.perf_counter() - t0
        diff = train_metrics.get("train/train_rollout_logprob_abs_diff")
        if diff is not None and rollout_id == self.start and diff > LOGPROB_DIFF_WARN:
            logger.warning(
                "FIRST-STEP CHECK FAILED: mean |trainer log-prob - rollout log-prob| = %.4g > %.2g. "
                "Engine weights, temperature or masks disagree with the trainer.",
                diff,
                LOGPROB_DIFF_WARN,
            )
        if args.save and (
            _should_run(args.save_interval, rollout_id, args.num_rollout) or rollout_id == args.num_rollout - 1
        ):
            t0 = time.perf_counter()
            # Data cursor first: the trainer's checkpoint tracker is the commit point of a resume.
            ray.get(self.manager.save.remote(rollout_id))
            self.trainer.save(rollout_id)
            metrics["perf/save_time"] = time.perf_counter() - t0
        metrics.update(self._sync_weights(rollout_id + 1))
        return metrics

    def run(self) -> None:
        """The loop itself (sync or async)."""
        args = self.args
        self.start = start = self.build()
        self.tracker.start(start, args.num_rollout)
        if args.eval_prompt_data and start == 0 and not args.skip_eval_before_train:
            self.evaluate(0)
        if args.async_train:
            self._run_async(start)
        else:
            self._run_sync(start)

    def _run_sync(self, start: int) -> None:
        args = self.args
        for rollout_id in range(start, args.num_rollout):
            t0 = time.perf_counter()
            batch_refs, metrics = ray.get(self.manager.generate.remote(rollout_id))
            if not args.debug_rollout_only:
                metrics = self.train_on(rollout_id, batch_refs, metrics)
            metrics["perf/step_time"] = time.perf_counter() - t0
            self.tracker.log(rollout_id, metrics)
            self.tracker.rollout_done(rollout_id, metrics)
            if args.eval_prompt_data and _should_run(args.eval_interval, rollout_id, args.num_rollout):
                self.evaluate(rollout_id + 1)

    def _run_async(self, start: int) -> None:
        """Rollout N+1 is generated while rollout N trains; weights change only between generations."""
        args = self.args
        pending = self.manager.generate.remote(start)
        for rollout_id in range(start, args.num_rollout):
            t0 = time.perf_counter()
            batch_refs, metrics = ray.get(pending)
            next_id = rollout_id + 1
            pending = self.manager.generate.remote(next_id) if next_id < args.num_rollout else None
            t_train = time.perf_counter()
            metrics.update(self._prefix("train", self.trainer.train(rollout_id, batch_refs)))
            metrics["perf/train_time"] = time.perf_counter() - t_train
            if args.save and (
                _should_run(args.save_interval, rollout_id, args.num_rollout) or rollout_id == args.num_rollout - 1
            ):
                ray.get(self.manager.save.remote(rollout_id))
                self.trainer.save(rollout_id)
            if pending is not None and (rollout_id + 1) % args.update_weights_interval == 0:
                # Never update mid-generation: wait for the in-flight rollout (its data stays one step stale).
                ray.wait([pending], num_returns=1)
                metrics.update(self._prefix("perf", self.trainer.update_weights(rollout_id + 1)))
            metrics["perf/step_time"] = time.perf_counter() - t0
            self.tracker.log(rollout_id, metrics)
            self.tracker.rollout_done(rollout_id, metrics)
            if args.eval_prompt_data and _should_run(args.eval_interval, rollout_id, args.num_rollout):
                if pending is not None:
                    ray.wait([pending], num_returns=1)
                self.evaluate(rollout_id + 1)

    def finish(self) -> dict[str, str]:
        """Final HF export and the curve PNG; returns the output paths."""
        outputs: dict[str, str] = {}
        if self.trainer is not None and self.args.save_hf:
            path = self.args.save_hf
            if self.args.colocate:
                ray.get(self.manager.offload.remote())
                self.trainer.wake_up()
            self.trainer.save_hf(path)
            outputs["hf_checkpoint"] = path
        if self.tracker.history:
            outputs["curve"] = self.tracker.save_curve(os.path.join(self.output_dir, "reward_curve.png"))
        if getattr(self.tracker, "tensorboard_dir", None):
            outputs["tensorboard"] = self.tracker.tensorboard_dir
        if self.args.save:
            outputs["checkpoints"] = self.args.save
        engine_logs = os.path.join(self.output_dir, "engine_logs")
        if os.path.isdir(engine_logs):
            outputs["engine logs"] = engine_logs
        return outputs

    def close(self) -> None:
        """Tears everything down; safe to call after a partial build."""
        try:
            self.tracker.close()
            if self.manager is not None:
                try:
                    ray.get(self.manager.dispose.remote(), timeout=60)
                except Exception:  # noqa: BLE001 - teardown must go on
                    logger.exception("rollout manager did not shut down cleanly")
            if self.trainer is not None:
                try:
                    self.trainer.shutdown()
                except Exception:  # noqa: BLE001
                    logger.exception("trainer did not shut down cleanly")
        finally:
            ray.shutdown()
