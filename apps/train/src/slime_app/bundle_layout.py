"""How many placement-group bundles a run's flags make and which of them serve the trainer, critic and engines.

Pure arithmetic on the validated config (no Ray): `slime_app.cluster.create_placement` builds the group from it and
`--dry-run` prints it, so the two cannot disagree. The layout is the original's (`slime/ray/placement_group.py`,
`_get_placement_group_layout`), with the additions the module docstring of `slime_app.cluster` lists.
"""

from __future__ import annotations

import dataclasses

from slime_core.config import SlimeArgs

__all__ = ["BundleLayout", "bundle_layout", "layout_text"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BundleLayout:
    """Bundle counts and offsets into the sorted bundles (one bundle per GPU).

    Attributes:
        num_bundles: bundles of the placement group.
        actor_count: trainer ranks, on sorted bundles `0..actor_count-1`.
        rollout_offset: first sorted bundle of the engines.
        rollout_gpus: engine GPUs on bundles of this group (0 for outside engines and `--debug-train-only`).
        critic_offset: first sorted bundle of the PPO critic's own GPUs.
        critic_gpus: the critic's own GPUs (0 when it shares the actor's bundles or there is no critic).
    """

    num_bundles: int
    actor_count: int
    rollout_offset: int
    rollout_gpus: int
    critic_offset: int
    critic_gpus: int


def bundle_layout(cfg: SlimeArgs) -> BundleLayout:
    """The layout of `cfg` (see the module docstring of `slime_app.cluster` for the rules)."""
    actor_gpus = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
    # Engines started elsewhere hold no bundle of ours (the original's layout for them).
    rollout_gpus = 0 if cfg.rollout_engine_urls else cfg.rollout_num_gpus or 0
    # The critic's own GPUs (validation made them as many as the actor's); 0 when it shares the actor's.
    critic_gpus = actor_gpus if cfg.use_critic and cfg.critic_num_nodes is not None else 0
    if cfg.debug_rollout_only:
        num_bundles, actor_count, rollout_offset, critic_gpus = rollout_gpus, 0, 0, 0
    elif cfg.debug_train_only:
        num_bundles, actor_count, rollout_offset = actor_gpus + critic_gpus, actor_gpus, 0
    elif cfg.colocate:
        num_bundles, actor_count, rollout_offset = max(actor_gpus, rollout_gpus) + critic_gpus, actor_gpus, 0
    else:
        num_bundles, actor_count = actor_gpus + critic_gpus + rollout_gpus, actor_gpus
        rollout_offset = actor_gpus + critic_gpus
    return BundleLayout(
        num_bundles=num_bundles,
        actor_count=actor_count,
        rollout_offset=rollout_offset,
        rollout_gpus=0 if cfg.debug_train_only else rollout_gpus,
        critic_offset=num_bundles - critic_gpus if cfg.colocate else actor_gpus,
        critic_gpus=critic_gpus,
    )


def layout_text(cfg: SlimeArgs) -> str:
    """The placement's bundle count as the flags make it (`bundle_layout`'s arithmetic), for messages.

    E.g. `--actor-num-nodes 1 × --actor-num-gpus-per-node 8 + --rollout-num-gpus 8 (not colocated)`.
    """
    actor = f"--actor-num-nodes {cfg.actor_num_nodes} × --actor-num-gpus-per-node {cfg.actor_num_gpus_per_node}"
    rollout = f"--rollout-num-gpus {cfg.rollout_num_gpus or 0}"
    if cfg.rollout_engine_urls:
        rollout = "0 rollout GPUs (external engines: --rollout-engine-urls)"
    critic = " + as many for the critic (--critic-num-nodes)" if cfg.use_critic and cfg.critic_num_nodes else ""
    if cfg.debug_rollout_only:
        return f"{rollout} (--debug-rollout-only)"
    if cfg.debug_train_only:
        return f"{actor}{critic} (--debug-train-only)"
    if cfg.colocate:
        return f"max({actor}, {rollout}){critic} (--colocate)"
    return f"{actor}{critic} + {rollout} (not colocated)"
