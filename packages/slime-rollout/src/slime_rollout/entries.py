"""slime-rollout's registry records: the rollout engines and the built-in reward functions.

Declared as entry points in this package's `pyproject.toml` (`slime.rollout_engines`, `slime.rewards`) and
read by `slime_core.extensions` when the config is validated, so this module imports nothing but the record
types. The built-in graders' records name their `grader` by import path (`slime_rollout.rewards.builtin`);
`slime_rollout.rewards.async_rm` calls what the record names. A new grader is its module, its record here and
its entry point.
"""

from __future__ import annotations

from slime_core.extensions import RewardSpec, RolloutEngineSpec

__all__ = [
    "DAPO_RM",
    "DEEPSCALER_RM",
    "F1_RM",
    "GPQA_RM",
    "IFBENCH_RM",
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
    preflight="slime_rollout.engines.launch.sglang:preflight",  # the LoRA adapter it must serve
)

REFERENCE = RolloutEngineSpec(
    name="reference",
    needs_gpu=False,  # transformers on CPU (slime_rollout.engines.reference)
    supports_colocate=True,
    launchable=True,  # slime_rollout.engines.launch.reference.build_reference_command
    returns_routed_experts=True,  # slime_rollout.engines.reference.routed_experts
    applies_weight_deltas=True,  # slime_rollout.engines.reference.routes.weights: /update_weights_from_delta
    default_dtype="float32",  # slime_rollout.engines.reference.__main__: --dtype float32
    auto_dtype_as_stored=True,  # from_pretrained(dtype="auto")
    preflight="slime_rollout.engines.launch.reference:preflight",  # notes the --sglang-* flags it ignores
)

# The built-in graders: `slime_rollout.rewards.builtin` holds what each record names.
_G = "slime_rollout.rewards.builtin:grade_"
MATH_RM = RewardSpec(
    name="math",
    grades_label=True,
    label_is_value=True,
    reads_box=True,
    grader=f"{_G}math",
    pooled_grader=f"{_G}math_pooled",
)
DEEPSCALER_RM = RewardSpec(
    name="deepscaler",
    grades_label=True,
    label_is_value=True,
    reads_box=True,
    grader=f"{_G}deepscaler",
    pooled_grader=f"{_G}deepscaler_pooled",
)
# Its score is a dict: preflight makes sure `--reward-key` picks one of its numbers.
DAPO_RM = RewardSpec(
    name="dapo",
    grades_label=True,
    label_is_value=True,
    reads_box=True,
    grader=f"{_G}dapo",
    preflight="slime_rollout.rewards.dapo:preflight",
)
F1_RM = RewardSpec(name="f1", grades_label=True, grader=f"{_G}f1")
GPQA_RM = RewardSpec(
    name="gpqa", grades_label=True, label_in_metadata="correct_letter", label_is_value=True, grader=f"{_G}gpqa"
)
REMOTE_RM_RM = RewardSpec(name="remote_rm", needs_url=True)  # no grader: the reply of --rm-url is the reward
RANDOM_RM = RewardSpec(name="random", grader=f"{_G}random")
# IFBench's checks, from a clone of allenai/IFBench on PYTHONPATH (preflight says so when it is missing).
IFBENCH_RM = RewardSpec(name="ifbench", grader=f"{_G}ifbench", preflight="slime_rollout.rewards.ifbench:preflight")
