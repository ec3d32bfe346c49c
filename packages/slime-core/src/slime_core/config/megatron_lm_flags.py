"""Megatron-LM's own flags that slime does not carry, told apart from typos.

The original slime hands its whole command line to Megatron-LM's parser, so its launch scripts may carry any
Megatron-LM flag. slime accepts the ones `slime_core.config.megatron_flags` judges and its own fields; any other
flag was "unknown flag X; did you mean Y?", which reads the same for a typo and for a real Megatron-LM flag slime has
no use for. `megatron_lm_flags.txt` lists every option string of the Megatron-LM the original's image builds (where
it came from is in its header; `packages/slime-core/scripts/megatron_lm_flags.py` regenerates it), so
`parse_args` can say which it is, and what to use instead where slime has an equivalent.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["MEGATRON_LM_EQUIVALENTS", "megatron_lm_flags", "unsupported_megatron_lm_flag"]

_DATA_FILE = "megatron_lm_flags.txt"

_STEPS = "counted in optimizer steps, as every length here (the original counts them in samples for Megatron)"
_CONSTANT_WD = "use --weight-decay (the weight decay is constant, as under Megatron-LM's defaults)"
_RESUME = (
    "a resumed run continues the checkpoint's schedule and refuses other values; --no-load-optim starts the optimizer "
    "and its schedule afresh"
)
_RUN_LENGTH = "use --num-rollout (the run's length in rollouts)"
_PROMPTS = "use --prompt-data (JSONL or Parquet prompts)"
_TOKENIZER = "use --hf-checkpoint (the tokenizer is its)"

# Megatron-LM flag -> what does its job here (one clause, after the refusal).
MEGATRON_LM_EQUIVALENTS: dict[str, str] = {
    "--train-samples": _RUN_LENGTH,
    "--exit-interval": _RUN_LENGTH,
    "--lr-decay-samples": f"use --lr-decay-iters ({_STEPS})",
    "--lr-warmup-samples": f"use --lr-warmup-iters ({_STEPS})",
    "--lr-wsd-decay-samples": f"use --lr-wsd-decay-iters ({_STEPS})",
    "--warmup": "use --lr-warmup-iters",
    "--start-weight-decay": _CONSTANT_WD,
    "--end-weight-decay": _CONSTANT_WD,
    "--weight-decay-incr-style": _CONSTANT_WD,
    "--override-opt_param-scheduler": _RESUME,
    "--override-opt-param-scheduler": _RESUME,
    "--use-checkpoint-opt_param-scheduler": _RESUME,
    "--use-checkpoint-opt-param-scheduler": _RESUME,
    "--data-path": _PROMPTS,
    "--train-data-path": _PROMPTS,
    "--valid-data-path": "use --eval-prompt-data",
    "--test-data-path": "use --eval-prompt-data",
    "--pretrained-checkpoint": "use --hf-checkpoint, or --ref-load for torch_dist weights",
    "--vocab-file": _TOKENIZER,
    "--merge-file": _TOKENIZER,
    "--wandb-exp-name": "use --wandb-group",
    "--wandb-save-dir": "use --wandb-dir",
    "--wandb-entity": "use --wandb-team",
    # Megatron-LM's deprecated spellings of flags slime carries.
    "--batch-size": "use --micro-batch-size",
    "--model-parallel-size": "use --tensor-model-parallel-size",
    "--checkpoint-activations": "use --recompute-granularity full (Megatron) or --gradient-checkpointing (FSDP)",
    "--use-torch-fsdp2": "use --train-backend fsdp (FSDP2 over the HF model)",
    "--use-megatron-fsdp": "use --train-backend fsdp (FSDP2 over the HF model)",
    # Megatron-LM's own GRPO loop: slime's rollout and loss flags do the same jobs.
    "--grpo-group-size": "use --n-samples-per-prompt",
    "--grpo-prompts-per-step": "use --rollout-batch-size",
    "--grpo-clamp-eps-lower": "use --eps-clip",
    "--grpo-clamp-eps-upper": "use --eps-clip-high",
    "--grpo-entropy-term-weight": "use --entropy-coef",
    "--rl-default-temperature": "use --rollout-temperature",
    "--rl-default-top-p": "use --rollout-top-p",
    "--rl-default-top-k": "use --rollout-top-k",
}


@cache
def megatron_lm_flags() -> frozenset[str]:
    """Every option string of Megatron-LM's parser (`megatron_lm_flags.txt`, `#` lines are its header).

    Returns:
        The flags, each with its leading `--`.
    """
    text = resources.files(__package__).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    return frozenset(line for line in text.splitlines() if line and not line.startswith("#"))


def unsupported_megatron_lm_flag(flag: str) -> str | None:
    """The one-line refusal of a Megatron-LM flag slime does not carry, or None when `flag` is not Megatron-LM's.

    Args:
        flag: a command-line flag (`--name`, no `=value`) that is no slime flag and no accepted Megatron flag.

    Returns:
        E.g. "--train-samples is a Megatron-LM flag that this version does not support; use --num-rollout (...)".
    """
    if flag not in megatron_lm_flags():
        return None
    instead = MEGATRON_LM_EQUIVALENTS.get(flag)
    if instead is not None:
        return f"{flag} is a Megatron-LM flag that this version does not support; {instead}"
    return (
        f"{flag} is a Megatron-LM flag that this version does not support (the Megatron-LM flags it accepts are "
        "listed in MIGRATION.md); remove it"
    )
