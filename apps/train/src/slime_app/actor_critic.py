"""PPO's trainers: the actor group and the critic group behind the one interface the loop drives.

`make_trainers(cfg, placement)` returns the actor's `TrainGroup`, or, with a critic
(`--advantage-estimator ppo`), an `ActorCritic` that the loop uses the same way. Its `train` reads like the
original's PPO step: the critic computes the rollout's values, trains on them and hands them over; the actor,
unless `--num-critic-only-steps` holds it back, trains with GAE advantages from those values.

Memory: when the critic shares the actor's GPUs (the default), only one of the two holds accelerator memory
at a time: the critic wakes for its step and sleeps after it, the actor sleeps while the critic runs. The actor
is woken when it is first needed (training, weight sync, checkpoint, export), so a colocated step swaps
engine → critic → actor without waking the actor in between. A critic on GPUs of its own never sleeps.
Checkpoints: the critic's (`--critic-save`, default `<--save>/critic`) is written before the actor's, whose
tracker file is the commit point of a resume: a resumed critic loads the actor's iteration (`critic_resume_step`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import time

import ray

from slime_app.cluster import Placement
from slime_app.train_actor import TrainerStart, TrainGroup, pin_load_step
from slime_core.checkpoint_dirs import complete_iterations, critic_dir, iteration_name, pinned_iteration, save_root
from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["ActorCritic", "critic_resume_step", "make_trainers"]


def make_trainers(cfg: SlimeArgs, placement: Placement) -> TrainGroup | ActorCritic:
    """The trainer ranks of the run: the actor group, plus the critic group when the estimator needs one."""
    actor = TrainGroup(cfg, placement)
    if not cfg.use_critic:
        return actor
    return ActorCritic(cfg, actor, TrainGroup(cfg, placement, role="critic"), shared=placement.critic_shares_actor_gpus)


def _own_critic(cfg: SlimeArgs, critic_save: str | None) -> bool:
    """Whether the critic resumes from this run's critic saves (not a `--critic-load` of another run's critic).

    Args:
        cfg: the run config (`--load`, `--critic-load`).
        critic_save: the critic's save directory (`slime_core.critic.critic_config(cfg).save`).
    """
    if not cfg.critic_load:
        return True  # <--load>/critic
    if not cfg.load:
        return False
    own = [critic_dir(str(save_root(cfg.load))), critic_save]
    return any(path and os.path.realpath(path) == os.path.realpath(cfg.critic_load) for path in own)


def critic_resume_step(cfg: SlimeArgs) -> int | None:
    """The iteration a resumed critic loads: the actor's, whose tracker file is the commit point of a save.

    The critic's checkpoint is written before the actor's, so a save cut in between (a kill, a full disk) left the
    critic's tracker one save ahead: each side resumed its own latest, the critic of rollout N with the actor of
    an earlier one (a warning said so).

    Args:
        cfg: the actor's config: `--load`, `--critic-load`, and `--ckpt-step` pinned to the iteration the actor
            loads (`slime_app.train_actor.pin_load_step`; None: the actor has no checkpoint to resume).

    Returns:
        The actor's iteration when the critic's checkpoint directory (`slime_core.critic.critic_config`'s `load`)
        is this run's (`<--load>/critic`, or `--critic-load` naming it or `--critic-save`; a `--load` naming one
        iteration folder, as Megatron takes it, pairs that iteration of `<save>/critic`) and holds complete
        iterations; None when there is nothing to pair (no actor checkpoint, no critic checkpoint: the critic starts
        from its weights as before), or for another run's `--critic-load`.

    Raises:
        ValueError: the critic's directory has complete iterations, not the actor's (names both directories, the
            iterations and a `--ckpt-step` both have, if any).
    """
    from slime_core.critic import critic_config  # torch: not at the driver's import

    step = pinned_iteration(cfg.load, cfg.ckpt_step)
    if not cfg.load or step is None:
        return None
    critic = critic_config(cfg)
    if not _own_critic(cfg, critic.save):
        return None
    critic_steps = complete_iterations(critic.load) if critic.load else []
    if not critic_steps:
        return None
    if step in critic_steps:
        return step
    load = pathlib.Path(cfg.load)
    both = sorted(set(critic_steps) & set(complete_iterations(save_root(load))))
    hint = f"resume both from one with --ckpt-step {both[-1]}" if both else "no iteration is in both"
    raise ValueError(
        f"--load {load}: the actor resumes from {iteration_name(step)}, which the critic's checkpoints in "
        f"{critic.load} do not have (they hold iterations {', '.join(map(str, critic_steps))}: a save cut between "
        f"the critic's and the actor's, or another run's critic); {hint}"
    )


class ActorCritic:
    """The actor and critic groups as one trainer (same methods as `TrainGroup`).

    Args:
        cfg: the run config.
        actor: the actor's ranks.
        critic: the critic's ranks (as many, same data-parallel layout).
        shared: whether the critic runs on the actor's GPUs (then the two are offloaded in turn).
    """

    def __init__(self, cfg: SlimeArgs, actor: TrainGroup, critic: TrainGroup, *, shared: bool):
        self.cfg, self.actor, self.critic, self.shared = cfg, actor, critic, shared
        self._actor_awake = self._critic_awake = True  # backends start awake
        self.num_undefined_ev = 0  # rollouts whose returns were all equal (no explained-variance point)

    def preload(self, cfg: SlimeArgs) -> None:
        """Both groups import their backends without waiting (`TrainGroup.preload`)."""
        self.actor.preload(cfg)
        self.critic.preload(cfg)

    def start_compile_warm_up(self, cfg: SlimeArgs, gated: bool = False) -> None:
        """The actor's ranks start their compile warm-up (`TrainGroup.start_compile_warm_up`); the critic none."""
        self.actor.start_compile_warm_up(cfg, gated)

    def release_compile_warm_up(self) -> None:
        """Opens the actor's gated warm-ups (`TrainGroup.release_compile_warm_up`)."""
        self.actor.release_compile_warm_up()

    # ------------------------------------------------------------------ memory
    def _set_actor(self, awake: bool) -> None:
        if awake != self._actor_awake:
            (self.actor.wake_up if awake else self.actor.sleep)()
            self._actor_awake = awake

    def _set_critic(self, awake: bool) -> None:
        if awake != self._critic_awake:
            (self.critic.wake_up if awake else self.critic.sleep)()
            self._critic_awake = awake

    def _use_actor(self) -> None:
        if self.shared:
            self._set_critic(False)
        self._set_actor(True)

    def _use_critic(self) -> None:
        if self.shared:
            self._set_actor(False)
        self._set_critic(True)

    def _release_critic(self) -> None:
        # A critic on its own GPUs keeps them; on the actor's (and, colocated, the engines') it gives them back.
        if self.shared:
            self._set_critic(False)

    def wake_up(self) -> None:
        """Nothing yet: the actor wakes on its first use, after the critic's step (which comes first)."""

    def sleep(self) -> None:
        """Frees the accelerator memory of both groups (colocated: the engines take the GPUs back)."""
        self._set_actor(False)
        self._release_critic()

    # ------------------------------------------------------------------ lifecycle
    def init(self, cfg: SlimeArgs) -> TrainerStart:
        """Initializes both groups; returns the actor's `TrainerStart` with the critic's compile report.

        A differing critic's start id is logged; the critic's `compile_layers_flag` comes back as
        `critic_compile_layers_flag` (the driver names the critic's first step from it).

        On shared GPUs the actor sleeps while the critic is built, so the two models never hold the accelerator
        at once (as the original's offloaded PPO initialization). A resumed critic loads the actor's iteration
        (`critic_resume_step`).

        Raises:
            ValueError: the critic's checkpoints lack the actor's iteration (`critic_resume_step`).
        """
        actor_cfg = pin_load_step(cfg)  # the iteration --load's tracker names now, read once
        step = critic_resume_step(actor_cfg)  # before anything loads: a refusal costs no model load
        start = self.actor.init(actor_cfg)
        if self.shared:
            self._set_actor(False)
        # Paired: the actor's iteration, whatever the critic's tracker says. Another run's --critic-load (or no
        # critic checkpoint): the run config as given (a --ckpt-step given reaches both, as the original's).
        critic_start = self.critic.init(cfg if step is None else cfg.model_copy(update={"ckpt_step": step}))
        if critic_start.rollout_id != start.rollout_id:
            logger.warning(
                "the critic resumes at rollout %d, the actor at %d; continuing from the actor's (is the critic "
                "checkpoint in --critic-load / <--load>/critic from the same run?)",
                critic_start.rollout_id,
                start.rollout_id,
            )
        self._release_critic()
        return dataclasses.replace(start, critic_compile_layers_flag=critic_start.compile_layers_flag)

    @property
    def dp_ranks(self) -> list[int]:
        """The actor's data-parallel rank of each trainer rank."""
        return self.actor.dp_ranks

    def train(self, rollout_id: int, batch_refs: list[ray.ObjectRef]) -> dict[str, float]:
        """Critic step, then (after `--num-critic-only-steps`) the actor's step with the critic's values.

        Returns:
            The actor's `train/*` metrics (none during critic-only steps), the critic's `train/critic-*`, and
            `perf/critic_train_time` (seconds, with its wake-up and sleep).
        """
        t0 = time.perf_counter()
        self._use_critic()
        critic_metrics, values = self.critic.train_critic(rollout_id, batch_refs)
        self._release_critic()
        metrics: dict[str, float] = {**critic_metrics, "perf/critic_train_time": time.perf_counter() - t0}
        self._note_undefined_ev(rollout_id, critic_metrics)
        if rollout_id >= self.cfg.num_critic_only_steps:
            self._use_actor()
            metrics.update(self.actor.train(rollout_id, batch_refs, values))
        else:
            only = self.cfg.num_critic_only_steps
            logger.info("rollout %d: the critic trains alone (--num-critic-only-steps %d)", rollout_id, only)
        return metrics

    def _note_undefined_ev(self, rollout_id: int, critic_metrics: dict[str, float]) -> None:
        """Counts rollouts without `train/critic-explained_variance` (all returns equal); names the first in INFO."""
        if "train/critic-explained_variance" in critic_metrics or "train/critic-return_std" not in critic_metrics:
            return
        self.num_undefined_ev += 1
        log = logger.info if self.num_undefined_ev == 1 else logger.debug
        log(
            "rollout %d: no train/critic-explained_variance: every return is %.6g, so it is undefined "
            "(%d rollout(s) so far; later ones are logged at DEBUG)",
            rollout_id, critic_metrics.get("train/critic-return_mean", float("nan")), self.num_undefined_ev,
        )  # fmt: skip

    def save(self, rollout_id: int, commit: bool = True) -> None:
        """The critic's checkpoint, then the actor's, whose tracker commits the resume point of both.

        With `commit` False, `commit_save` writes that tracker; the critic's own is written at once (the critic
        resumes at the actor's iteration: `critic_resume_step`).
        """
        self._use_critic()
        self.critic.save(rollout_id)
        self._release_critic()
        self._use_actor()
        self.actor.save(rollout_id, commit)

    def commit_save(self, rollout_id: int) -> None:
        """Names the actor's checkpoint of `rollout_id` in its tracker: the resume point of both."""
        self.actor.commit_save(rollout_id)

    def save_hf(self, path: str) -> None:
        """HF export of the actor (the policy)."""
        self._use_actor()
        self.actor.save_hf(path)

    def connect_engines(self, engine_urls: list[str]) -> None:
        """Weight sync towards the engines (the actor's)."""
        self.actor.connect_engines(engine_urls)

    def update_weights(self, weight_version: int, engine_urls: list[str] | None = None) -> dict[str, float]:
        """Pushes the actor's weights (to `engine_urls`, or the connected engines; see `TrainGroup.update_weights`)."""
        self._use_actor()
        return self.actor.update_weights(weight_version, engine_urls)

    def shutdown(self) -> None:
        """Shuts both groups down (the critic's even if the actor's fails)."""
        try:
            self.actor.shutdown()
        finally:
            self.critic.shutdown()
