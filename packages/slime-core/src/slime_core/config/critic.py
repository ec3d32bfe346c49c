"""Config rules of the PPO critic (`--advantage-estimator ppo`): placement and the flags only a critic reads.

Placement, as in the original: by default the critic trains on the actor's GPUs (its own trainer ranks,
the two offloaded in turn; the current original's only layout). `--critic-num-nodes` /
`--critic-num-gpus-per-node` (the earlier original's flags) put it on GPUs of its own, with as many ranks as
the actor: the rollout's per-data-parallel-rank batches serve both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, field_to_flag, non_default
from slime_core.estimators import get_estimator
from slime_core.extensions import CRITIC_BACKENDS, train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["CRITIC_FIELDS", "validate_critic"]

#: Flags that only a critic reads; set without one they would do nothing.
CRITIC_FIELDS = (
    "critic_num_nodes",
    "critic_num_gpus_per_node",
    "critic_load",
    "critic_save",
    "critic_lr",
    "critic_lr_warmup_iters",
    "num_critic_only_steps",
    "value_clip",  # the critic's clipped value loss (slime_core.algorithms.value_loss)
)


def validate_critic(args: SlimeArgs) -> None:
    """Rejects critic flags without a critic; fills and checks the critic's own-GPU placement.

    Raises:
        ConfigError: a critic flag without `--advantage-estimator ppo`, a backend without a critic
            (`TrainBackendSpec.supports_critic`), `--critic-save` without `--save`, or own critic GPUs whose count
            differs from the actor's.
    """
    if not get_estimator(args.advantage_estimator).needs_critic:
        given = non_default(args, CRITIC_FIELDS)
        if given:
            raise ConfigError(
                f"{field_to_flag(given[0])} configures the PPO critic; it has no effect with --advantage-estimator "
                f"{args.advantage_estimator} (use --advantage-estimator ppo, or remove it)"
            )
        return
    if not train_backend_spec(args).supports_critic:
        raise ConfigError(
            f"--advantage-estimator {args.advantage_estimator} trains a critic, which --train-backend "
            f"{args.train_backend} does not have"
        )
    if args.train_backend not in CRITIC_BACKENDS:  # the record says it has one: its package must declare it
        raise ConfigError(
            f"--advantage-estimator {args.advantage_estimator}: --train-backend {args.train_backend} declares "
            "supports_critic, but no package declares its critic under "
            f'[project.entry-points."{CRITIC_BACKENDS.group}"] (registered: {", ".join(CRITIC_BACKENDS.names())})'
        )
    if args.critic_save and not args.save:
        # The driver saves only with --save (the actor's tracker commits the pair): the critic's folder stayed empty.
        raise ConfigError(
            f"--critic-save {args.critic_save} needs --save: the critic is saved with the actor's checkpoint, whose "
            "tracker commits the resume point; give --save too"
        )
    if args.critic_num_nodes is None and args.critic_num_gpus_per_node is None:
        return  # the critic shares the actor's GPUs
    if args.critic_num_nodes is None:
        args.critic_num_nodes = args.actor_num_nodes
    if args.critic_num_gpus_per_node is None:
        args.critic_num_gpus_per_node = args.actor_num_gpus_per_node
    critic = args.critic_num_nodes * args.critic_num_gpus_per_node
    actor = args.actor_num_nodes * args.actor_num_gpus_per_node
    if critic != actor:
        raise ConfigError(
            f"--critic-num-nodes x --critic-num-gpus-per-node = {critic} must equal the actor's {actor} GPUs "
            "(the critic trains on the actor's per-rank batches); drop both flags to share the actor's GPUs"
        )
