"""The training loop: one `step(rollout_id)` (rollout → train → save → weight sync → log → eval) for both schedules.

Sync (default): each step generates its rollout with the weights the previous step pushed, so every
rollout is on-policy. Async (`--async`): rollout N+1 is generated while rollout N trains (one step
off-policy); the engines change weights only between generations, every `--update-weights-interval`
rollouts. `slime_app.rollout_schedule.Rollouts` holds that difference; `Run.step` is the same for both.

`Run` builds the placement, the rollout manager and the trainer ranks, pushes the initial weights, then
calls `step` for every rollout id. Everything is torn down in `close`, also on errors and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import ray

from slime_app.actor_critic import make_trainers
from slime_app.actor_watch import ActorWatch, Watched, kill_stopped
from slime_app.cluster import create_placement, init_ray
from slime_app.failures import refused_input, weight_write_errors
from slime_app.goodput import GoodputMeter
from slime_app.guards import RunStopped, first_step_logprob_gate
from slime_app.instability import InstabilityMonitor
from slime_app.progress import RunProgress
from slime_app.ray_start import ray_address
from slime_app.reaper import start_reaper
from slime_app.restore import EngineRestorer
from slime_app.rollout_manager import RolloutManager
from slime_app.rollout_schedule import Rollouts
from slime_app.run_saves import SAVE_GRACE_S, SavePhase
from slime_app.run_state import EvalAfterSave, load_run_state, save_run_state
from slime_app.save_schedule import should_run
from slime_app.tracking import Tracker
from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["SAVE_GRACE_S", "Run"]  # SAVE_GRACE_S: defined with the save phase (`slime_app.run_saves`)

_TRANSPORTS = {  # --weight-sync after validation resolved "auto"
    "tensor": "tensor (tensor handles to colocated engines)",
    "disk": "disk (safetensors the engines reload)",
    "distributed": "distributed (broadcast group with the engines: NCCL on GPUs, gloo on CPU)",
}


def _timed(metrics: dict[str, float], key: str, fn: Callable[[], Any]) -> None:
    """Runs `fn` and records its wall seconds under `key` (the colocated memory swaps: `perf/*_time`)."""
    t0 = time.perf_counter()
    fn()
    metrics[key] = time.perf_counter() - t0


class Run(SavePhase):
    """The components of one run, built in order and torn down in reverse.

    Args:
        cfg: the validated run config.

    Attributes:
        progress: the phase display (`slime_app.progress`): live from the first phase in a terminal, log lines
            elsewhere; None in tests that build a `Run` by hand.
    """

    progress: RunProgress | None = None
    rollouts: Rollouts | None = None  # set by `run`; None before (a save then has no generation in flight)
    _cursor_saved: int | None = None  # `--async`: the rollout whose data cursor was saved before the next one drew
    train_end: float | None = None  # when the trainer last finished a train call (`run` sets it at start-up)
    watch: ActorWatch | None = None  # None in tests that build a `Run` by hand: plain `ray.get`s
    manager_watched: Watched | None = None  # the rollout manager's process, watched by every wait on it
    # The flag under which the trainer compiled its layers (their first step compiles), as its `init` reported it
    # (`TrainerStart.compile_layers_flag`); None: eager, or no trainer. PPO: the critic's, whose first step is the
    # run's first (`TrainerStart.critic_compile_layers_flag`).
    compile_layers_flag: str | None = None
    critic_compile_layers_flag: str | None = None

    def __init__(self, cfg: SlimeArgs):
        self.cfg = cfg
        self.output_dir = cfg.output_dir
        os.makedirs(self.output_dir, exist_ok=True)
        self.progress = RunProgress()
        self.tracker = Tracker(cfg, self.output_dir, self.progress)
        self.progress.start()  # live before Ray starts, not when the first rollout does
        self.goodput = GoodputMeter(cfg)
        self.watch = ActorWatch.of(cfg)  # a stopped manager or rank ends a wait (--actor-stopped-timeout-secs)
        self.instability = InstabilityMonitor(cfg)
        self.manager = None
        self.trainer = None
        self.restorer: EngineRestorer | None = None
        self.start_rollout_id = 0
        self.last_hf_export: str | None = None
        # A local Ray instance lives under this process: make sure it dies with it (slime_app.reaper).
        self.reaper = None if ray_address(cfg) else start_reaper()
        try:
            with self._phase("ray", detail="local node and placement group"):
                init_ray(cfg)
                self.placement = create_placement(cfg)
        except BaseException:  # the caller gets no Run to close: tear down what started here
            self.progress.stop()
            ray.shutdown()  # a no-op when Ray did not start, or when ray.init was interrupted before its node was set
            if self.reaper is not None:
                self.reaper.sweep()  # and what an interrupted ray.init left (its agents, orphaned)
            raise

    def _phase(self, name: str, rollout_id: int | None = None, detail: str = "") -> contextlib.AbstractContextManager:
        """`RunProgress.phase`, or nothing when the run has no display."""
        if self.progress is None:
            return contextlib.nullcontext()
        return self.progress.phase(name, rollout_id, detail)

    @property
    def swap_trainer(self) -> bool:
        """Colocated with --offload-train (the default): the trainer sleeps while the engines generate."""
        return bool(self.cfg.colocate and self.cfg.offload_train)

    @property
    def swap_engines(self) -> bool:
        """Colocated with --offload-rollout (the default): the engines release their memory while it trains."""
        return bool(self.cfg.colocate and self.cfg.offload_rollout)

    @property
    def per_epoch(self) -> int | None:
        """Rollouts per epoch with --num-epoch (num_rollout was counted as epochs × that, slime_app.resolve)."""
        return self.cfg.num_rollout // self.cfg.num_epoch if self.cfg.num_epoch else None

    def build(self) -> int:
        """Starts engines and trainer ranks, pushes the initial weights; returns the start rollout id.

        The start rollout id is the one after `--load`'s checkpoint (0 without one), or `--start-rollout-id`; the
        rollout manager restores the data cursor saved for the rollout before it (the original's order).

        Raises:
            StartRefused: a trainer rank refused its input (`ValueError`/`FileNotFoundError`, e.g. a damaged
                `--load` checkpoint); the message is that error's, in one line.
        """
        cfg = self.cfg
        self.manager = RolloutManager.options(num_cpus=0).remote(cfg, self.placement)
        self.manager_watched = Watched("the rollout manager", self.manager)
        # --debug-train-only (the SFT recipe, a replay) starts none: the phase then only builds the data source.
        engines = "none: --debug-train-only" if cfg.debug_train_only else f"--rollout-engine {cfg.rollout_engine}"
        with self._phase("engines", detail=engines):
            engines_up = self.manager.start.remote()
            if not cfg.debug_rollout_only:
                # The trainer ranks' processes start and import their backend while the engines come up; no
                # device memory is touched before `init` (+ the PPO critic's ranks: actor_critic.py).
                self.trainer = make_trainers(cfg, self.placement)
                self.trainer.preload(cfg)
                # Colocated it waits at its gate before touching the GPU (imports and its stand-in meanwhile).
                self.trainer.start_compile_warm_up(cfg, gated=bool(cfg.colocate))
            engine_urls = self.manager_get(engines_up, "the start of the engines")
            if self.swap_engines:
                self.manager_get(self.manager.offload.remote(), "the engines' offload")  # the trainer loads next
            if cfg.colocate and self.trainer is not None:
                # Only now: an engine sizes its KV cache from the free memory it measures at start-up, which a
                # warm-up on the same GPU would take (resident engines: it then runs next to them).
                self.trainer.release_compile_warm_up()
        start = 0
        if self.trainer is not None:
            with self._phase("model load", detail=f"--train-backend {cfg.train_backend}"):
                with refused_input("the trainer ranks did not start"):
                    started = self.trainer.init(cfg)  # the actor pins --load's iteration (pin_load_step)
            start, self.compile_layers_flag = started.rollout_id, started.compile_layers_flag
            self.critic_compile_layers_flag = started.critic_compile_layers_flag
            if start > 0 and cfg.load:
                logger.info("resumed model, optimizer and scheduler from --load %s; next rollout %d", cfg.load, start)
        if cfg.start_rollout_id is not None:
            start = cfg.start_rollout_id
        if cfg.num_rollout > 0:  # before the first point: the rollouts done again hide their earlier points
            self.tracker.begin_at(start)
        else:  # an eval-only run: its eval at rollout 0 goes beside an earlier run's events, not into them
            self.tracker.begin_eval_only()
        if start > 0 and cfg.num_rollout > 0:  # an eval-only run (--num-rollout 0) draws no prompt
            # As the original: the data cursor of the rollout before the one the run starts at, --start-rollout-id
            # included (it was the checkpoint's, so the prompts did not follow the rollout ids).
            with refused_input("the data cursor was not restored"):  # a damaged data_source_<id>.json
                self.manager_get(self.manager.load.remote(start - 1), "the load of the data cursor")
        self.restorer = EngineRestorer(cfg, self.manager, self.trainer, get=self.manager_get)
        if self.trainer is not None and engine_urls:
            transport = _TRANSPORTS.get(cfg.weight_sync, cfg.weight_sync)
            logger.info("weight sync: %s, %d engine(s)", transport, len(engine_urls))
            self.trainer.connect_engines(engine_urls)
            # Engines always serve the trainer's weights, also after a resume.
            self.tracker.log(start, self.sync_weights(start))
        elif self.swap_engines:
            self.manager_get(self.manager.onload.remote(), "the engines' onload")
        return start

    def manager_get(
        self,
        ref: ray.ObjectRef,
        what: str,
        *,
        timeout: float | None = None,
        every_slice: Callable[[], None] | None = None,
    ) -> Any:
        """The value of the rollout manager's call `ref`; `what` names the call in the error of a stopped manager.

        Raises:
            slime_app.actor_watch.ActorStopped: the manager's process stayed stopped past
                `--actor-stopped-timeout-secs`.
            ray.exceptions.GetTimeoutError: `timeout` seconds passed.
        """
        if self.watch is None or self.manager_watched is None:
            while every_slice is not None and not ray.wait([ref], timeout=1.0)[0]:
                every_slice()
            return ray.get(ref, timeout=timeout)
        return self.watch.get(ref, [self.manager_watched], what, timeout=timeout, every_slice=every_slice)

    def run(self) -> None:
        """The whole run: build, evaluate the starting model, then one `step` per rollout id."""
        cfg = self.cfg
        self.start_rollout_id = start = self.build()
        self.train_end = time.perf_counter()  # the original's perf/train_wait_time starts when the trainer is up
        if start >= cfg.num_rollout > 0:  # as the original, nothing runs; it said nothing either
            # (--start-rollout-id past --num-rollout is refused with the flags: only a checkpoint's id gets here.)
            logger.warning(
                "nothing to train: the run starts at rollout %d (--load %s) and --num-rollout is %d; raise "
                "--num-rollout to train on", start, cfg.load, cfg.num_rollout,
            )  # fmt: skip
        if start > 0 and cfg.load and start < cfg.num_rollout:
            load_run_state(cfg.load, start - 1, self._state_keepers)  # goodput/cum/*, instability baselines go on
        self.tracker.start(start, cfg.num_rollout)
        # Only with --eval-interval, as the original's train.py: its scripts turn eval off by leaving that flag out
        # (run-qwen3-235B-A22B.sh keeps --eval-prompt-data with `#--eval-interval 20`).
        # (--eval-interval without eval data is refused when the config is read.)
        if cfg.eval_interval is not None and cfg.num_rollout == 0:
            # The original's eval-only run (train.py): one eval of the loaded weights at rollout 0, whatever the
            # checkpoint's rollout id and --skip-eval-before-train.
            self.evaluate(0)
        elif cfg.eval_interval is not None and start == 0 and not cfg.skip_eval_before_train:
            self.evaluate(0)
        elif self._eval_due_at_resume(start):
            self.evaluate(start)
        self.rollouts = Rollouts(
            self.manager,
            cfg.num_rollout,
            ahead=cfg.async_train,
            update_weights_interval=cfg.update_weights_interval,
            get=lambda ref, what: self.restorer.get(ref, what, serve_restores=True),
            before_next=self._save_cursor_early,
        )
        for rollout_id in range(start, cfg.num_rollout):
            self.step(rollout_id)

    @property
    def _state_keepers(self) -> dict[str, Any]:
        """The driver's parts of a checkpoint (`slime_app.run_state`): objects with `state()` and `restore(state)`."""
        return {"goodput": self.goodput, "instability": self.instability, "tracker": self.tracker,
                "eval": self.eval_after_save}  # fmt: skip

    @functools.cached_property
    def eval_after_save(self) -> EvalAfterSave:
        """Whether the eval after the last saved rollout was due (`EvalAfterSave`)."""
        return EvalAfterSave()

    def _eval_due_at_resume(self, start: int) -> bool:
        """Whether a run resumed from `--load` at `start` evaluates the loaded weights before its first step.

        When the eval after rollout `start - 1` was due (`--eval-interval`, an epoch's end, the last rollout): it runs
        after that rollout's commit (`_commit`), so a run stopped during the eval committed the checkpoint
        without it, and the resumed run went on to the next one: no `eval/*` point for the checkpoint
        (the original's train.py too). Run again where the stopped run had logged it, it repeats the same point (the
        same weights, the same sampling seeds; the run state saved with the checkpoint holds none of it). Not with
        `--start-rollout-id`, whose weights are not that rollout's.
        """
        cfg = self.cfg
        if not (cfg.load and 0 < start <= cfg.num_rollout and cfg.start_rollout_id is None):
            return False
        # Or due in the run that saved it (`EvalAfterSave`): its last rollout, when this run extends it.
        due_then = cfg.eval_interval is not None and self.eval_after_save.due_when_saved
        return due_then or should_run(cfg.eval_interval, start - 1, cfg.num_rollout, self.per_epoch)

    def step(self, rollout_id: int) -> None:
        """One rollout, top to bottom: samples → train → save → weight sync → log (→ run state) → eval."""
        cfg = self.cfg
        t0 = time.perf_counter()
        sync: dict[str, float] = {}
        with self._phase("rollout", rollout_id):
            batch_refs, metrics = self.rollouts.take(rollout_id)
        metrics["perf/rollout_wait_time"] = time.perf_counter() - t0
        if not cfg.debug_rollout_only:
            phase = self._train_phase(rollout_id)
            with self._phase(phase[0], rollout_id, phase[1]):
                metrics.update(self.train(rollout_id, batch_refs))
            # As the original's save_model: the HF export goes with every save (each --save-interval, each
            # epoch's end, the last rollout), and the last rollout also exports without --save. The export comes
            # first: the checkpoint's tracker commits both, so a run killed during the export resumes before this
            # rollout and exports it again (after the tracker, the resumed run started past it: never exported).
            # The tracker is written last, after the run state (`_commit`).
            if self._saves_after(rollout_id) or rollout_id == cfg.num_rollout - 1:
                if cfg.save_hf:
                    with self._phase("save", rollout_id, "--save-hf"):
                        metrics["perf/save_hf_time"] = self.save_hf(rollout_id)
                if cfg.save:
                    with self._phase("save", rollout_id):
                        metrics["perf/save_time"] = self.save(rollout_id)
            if self.rollouts.weights_due(rollout_id):
                self.rollouts.settle()  # async: the engines never change weights mid-generation
                sync = self.sync_weights(rollout_id + 1)
                metrics.update(sync)
        metrics["perf/step_time"] = time.perf_counter() - t0
        metrics.update(self.goodput.update(metrics))
        findings = self.instability.observe(rollout_id, metrics)
        metrics.update(InstabilityMonitor.metrics_of(findings))
        # A push is logged at the weight version it pushed, as `build` logs the first one: at x = N the push of the
        # weights rollout N generated with (the original's perf/update_weights_time at N). Logged here, the first
        # push and the one after rollout 0 were two points at x = 0. (This step's goodput counts its own push.)
        self.tracker.log(rollout_id, {k: v for k, v in metrics.items() if k not in sync})
        if sync:
            self.tracker.log(rollout_id + 1, sync)
        self.tracker.rollout_done(rollout_id, metrics)
        if not cfg.debug_rollout_only and self._saves_after(rollout_id):
            self._commit(rollout_id)
        if rollout_id == self.first_actor_step and not cfg.debug_rollout_only:
            first_step_logprob_gate(cfg, metrics)  # after logging: the offending step stays on record
        self._stop_on(findings)
        if should_run(cfg.eval_interval, rollout_id, cfg.num_rollout, self.per_epoch):  # None: never
            self.rollouts.settle()
            self.evaluate(rollout_id + 1)

    @property
    def first_actor_step(self) -> int:
        """The actor's first step: the run's first, or after the critic-only warm-up (`--num-critic-only-steps`)."""
        return max(self.start_rollout_id, self.cfg.num_critic_only_steps if self.cfg.use_critic else 0)

    def _train_phase(self, rollout_id: int) -> tuple[str, str]:
        """The progress phase (name, detail) of rollout `rollout_id`'s training.

        "compile+train" where a model's first step compiles its layers (as the trainers reported in `init`): the
        critic's in the run's first step, the actor's in its own first step; else "train".
        """
        compiling = []
        if self.critic_compile_layers_flag and rollout_id == self.start_rollout_id:
            compiling.append((self.critic_compile_layers_flag, "the critic's"))
        if self.compile_layers_flag and rollout_id == self.first_actor_step:
            compiling.append((self.compile_layers_flag, "the actor's" if self.cfg.use_critic else "the"))
        if not compiling:
            return "train", ""
        flags = " ".join(dict.fromkeys(flag for flag, _ in compiling))
        whose = " and ".join(who for _, who in compiling)
        verb = "steps compile" if len(compiling) > 1 else "step compiles"
        return "compile+train", f"{flags}: {whose} first {verb}"

    def _commit(self, rollout_id: int) -> None:
        """Writes the run state of the saved `rollout_id`, then names its checkpoint in the tracker (the resume point).

        In this order, a run stopped between the two (SIGKILL) resumes from the checkpoint before, whose run state is
        there; the tracker written first (in the trainer's save) left a checkpoint without it, and the resumed run
        restarted `goodput/cum/*`, the instability baselines and the curve from zero. The rollout is accounted by
        now. The eval after it is not in this state: a resume runs it again (`_eval_due_at_resume`), so its point is
        in the curve and the rules once.

        Raises:
            SaveFailed: either write failed (one line: `slime_app.failures`).
        """
        cfg = self.cfg
        self.eval_after_save.due = should_run(cfg.eval_interval, rollout_id, cfg.num_rollout, self.per_epoch)
        with self._save_errors(rollout_id, "run-state save and commit"):
            save_run_state(cfg.save, rollout_id, {k: v.state() for k, v in self._state_keepers.items()})
            self.trainer.commit_save(rollout_id)

    def _stop_on(self, findings: list) -> None:
        if findings and self.cfg.stop_on_instability:
            raise RunStopped(f"{findings[0].message} (--stop-on-instability)")

    def train(self, rollout_id: int, batch_refs: list[ray.ObjectRef]) -> dict[str, float]:
        """Trains on one rollout's per-DP-rank batches; returns `train/*` and `perf/*` times (seconds).

        `perf/train_time` is the trainer's call; the original's `perf/train_wait_time` / `perf/wait_time_ratio`
        are the trainer's idle time since its last train call (or since start-up) and its share.

        Colocated, the engines release their memory first and the trainer wakes up. (`step` checks the first
        step's trainer log-probs against the engine's: `slime_app.guards.first_step_logprob_gate`.)
        """
        begin = time.perf_counter()
        swap: dict[str, float] = {}
        if self.swap_engines:
            _timed(swap, "perf/engine_release_time",
                   lambda: self.manager_get(self.manager.offload.remote(), "the engines' offload"))  # fmt: skip
        if self.swap_trainer:
            _timed(swap, "perf/wake_up_time", self.trainer.wake_up)
            self.restorer.trainer_awake = True
        t0 = time.perf_counter()
        train_metrics = self.trainer.train(rollout_id, batch_refs)
        self.restorer.trained(rollout_id + 1)  # a restore before the next sync pushes these weights, as that version
        metrics = self._prefix("train", train_metrics)
        metrics["perf/train_time"] = time.perf_counter() - t0
        metrics.update(swap)
        # The original's idle share of the trainer: from the end of its last train call to the start of this one.
        end = time.perf_counter()
        if self.train_end is not None:
            wait = metrics["perf/train_wait_time"] = begin - self.train_end
            metrics["perf/wait_time_ratio"] = wait / (end - self.train_end)
        self.train_end = end
        return metrics

    def sync_weights(self, weight_version: int) -> dict[str, float]:
        """Pushes the trainer's weights (trainer awake); returns `perf/update_weights_*`.

        Colocated, the two sides then swap GPU memory: engine weights memory back → push → trainer
        sleeps → engine KV cache back.
        """
        if self.cfg.debug_train_only:
            # No engine, nothing pushed (`_sync_weights`): a "weight sync ... done in 0.0 s" line said otherwise.
            return self._sync_weights(weight_version)
        with self._phase("weight sync", detail=f"weight version {weight_version}"):
            return self._sync_weights(weight_version)

    def _sync_weights(self, weight_version: int) -> dict[str, float]:
        swap: dict[str, float] = {}
        if self.swap_engines:
            onload = functools.partial(self.manager_get, what="the engines' weights onload")
            _timed(swap, "perf/engine_resume_weights_time", lambda: onload(self.manager.onload.remote(["weights"])))
        metrics: dict[str, float] = {}
        # No engine runs with --debug-train-only (the SFT recipe, a replay): as the original's update_weights, nothing
        # is pushed (the push gathered every weight across the ranks for no reader); a colocated trainer still sleeps.
        if not self.cfg.debug_train_only:
            with weight_write_errors(self.cfg, weight_version):  # a full disk under a disk push: one line, exit 5
                metrics = self._prefix("perf", self.restorer.push(weight_version))
        if self.swap_trainer:
            _timed(swap, "perf/sleep_time", self.trainer.sleep)
            self.restorer.trainer_awake = False
        if self.swap_engines:
            _timed(swap, "perf/engine_resume_kv_cache_time",
                   lambda: self.manager_get(self.manager.onload.remote(["kv_cache", "cuda_graph"]),
                                            "the engines' KV cache onload"))  # fmt: skip
        return {**metrics, **swap}

    @staticmethod
    def _prefix(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
        return {k if "/" in k else f"{prefix}/{k}": v for k, v in metrics.items()}

    def evaluate(self, rollout_id: int) -> None:
        """Runs the eval datasets and logs `eval/*` (nothing with --debug-train-only: no engines run)."""
        if self.cfg.debug_train_only:
            # As the original's RolloutManager.eval (said once when the config is read): the eval asked the absent
            # engines and stopped the run with "neither a router nor engine URLs are configured".
            return
        with self._phase("eval", rollout_id):
            # Restarted engines get their weights while the eval waits for them.
            metrics = self.restorer.get(self.manager.eval.remote(rollout_id), f"the eval of rollout {rollout_id}",
                                        serve_restores=True)  # fmt: skip
        self.goodput.add_eval(metrics.get("perf/eval_time"))
        findings = self.instability.observe_eval(rollout_id, metrics)
        metrics.update(InstabilityMonitor.metrics_of(findings))
        self.tracker.log(rollout_id, metrics)
        self.tracker.eval_line(rollout_id, metrics)
        self._stop_on(findings)

    def finish(self) -> dict[str, str]:
        """The curve PNG; returns the output paths (the last HF export among them)."""
        outputs: dict[str, str] = {}
        if self.last_hf_export is not None:
            outputs["hf_checkpoint"] = self.last_hf_export
        if self.tracker.history:
            outputs["curve"] = self.tracker.save_curve(os.path.join(self.output_dir, "reward_curve.png"))
        if self.tracker.tensorboard_dir:
            outputs["tensorboard"] = self.tracker.tensorboard_dir
        if self.goodput.num_rollouts:
            outputs["goodput"] = self.goodput.save(os.path.join(self.output_dir, "goodput.json"))
        if self.cfg.save:
            outputs["checkpoints"] = self.cfg.save
        engine_logs = os.path.join(self.output_dir, "engine_logs")
        if os.path.isdir(engine_logs):
            outputs["engine logs"] = engine_logs
        return outputs

    def close(self) -> None:
        """Tears everything down; safe to call after a partial build."""
        try:
            self.tracker.close()
            if self.manager_watched is not None:  # a stopped manager answers no dispose: killed (its engines follow)
                kill_stopped([self.manager_watched])
            if self.manager is not None:
                try:
                    ray.get(self.manager.dispose.remote(), timeout=60)
                except ray.exceptions.RayActorError:  # its process is gone (what ended the run, said in one line)
                    logger.info("rollout manager: its process is gone; nothing to dispose")
                except Exception:  # noqa: BLE001 - teardown must go on
                    logger.exception("rollout manager did not shut down cleanly")
            if self.trainer is not None:
                try:
                    self.trainer.shutdown()
                except Exception:  # noqa: BLE001
                    logger.exception("trainer did not shut down cleanly")
        finally:
            ray.shutdown()
            if self.reaper is not None:
                self.reaper.release()
