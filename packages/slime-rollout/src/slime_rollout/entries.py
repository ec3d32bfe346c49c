"""slime-rollout's registry records: the rollout engines and the built-in reward functions.

Declared as entry points in this package's `pyproject.toml` (`slime.rollout_engines`, `slime.rewards`) and
read by `slime_core.extensions` when the config is validated, so this module imports nothing but the record
types. The built-in graders carry no factory: `slime_rollout.rewards.async_rm` grades them itself.
"""

from __future__ import annotations

from slime_core.extensions import RewardSpec, RolloutEngineSpec

__all__ = [
    "DAPO_RM",
    "DEEPSCALER_RM",
    "F1_RM",
    "GPQA_RM",
    "MATH_RM",
    "RANDOM_RM",
    "REFERENCE",
    "REMOTE_RM_RM",
    "SGLANG",
]

SGLANG = RolloutEngineSpec(
    name="sglang",
    needs_gpu=True,
    supports_colocate=True,  # /release_memory_occupation, /resume_memory_occupation
    launchable=True,  # slime_rollout.engines.launch.sglang.build_sglang_command
    returns_routed_experts=True,  # --enable-return-routed-experts
)

REFERENCE = RolloutEngineSpec(
    name="reference",
    needs_gpu=False,  # transformers on CPU (slime_rollout.engines.reference)
    supports_colocate=True,
    launchable=True,  # slime_rollout.engines.launch.reference.build_reference_command
    returns_routed_experts=True,  # slime_rollout.engines.reference.routed_experts
    applies_weight_deltas=True,  # slime_rollout.engines.reference.routes.weights: /update_weights_from_delta
)

MATH_RM = RewardSpec(name="math", grades_label=True)
DEEPSCALER_RM = RewardSpec(name="deepscaler", grades_label=True)
DAPO_RM = RewardSpec(name="dapo", grades_label=True)
F1_RM = RewardSpec(name="f1", grades_label=True)
GPQA_RM = RewardSpec(name="gpqa", grades_label=True)
REMOTE_RM_RM = RewardSpec(name="remote_rm", needs_url=True)
RANDOM_RM = RewardSpec(name="random")
