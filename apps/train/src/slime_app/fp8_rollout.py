"""FP8 rollout (BF16 training, FP8 serving): when it is on, what it needs, and how loose the first-step gate is.

As in the original slime, nothing but the checkpoint switches it on: `--hf-checkpoint` names a blockwise-FP8 serving
checkpoint (`slime-convert hf-to-fp8`, or a published `*-FP8` model) whose config.json carries an FP8
`quantization_config`. Then the engines load that checkpoint, the trainer starts from the BF16 `--ref-load`
(`slime_core.fp8.trainer_weights_dir`), and every weight push quantizes the trainer's weights blockwise on the
trainer side (`slime_app.weights.push_weights`), so the engines keep serving FP8.

Rollout log-probs then come from FP8 weights and the trainer's from BF16 ones: a larger train/inference mismatch
than BF16 serving. The original pairs FP8 rollout with truncated importance sampling (`--use-tis`, added "for fp8
rollout" in its v0.1.0 release); this run warns when it is off. The first-step gate keeps catching broken syncs
(an engine with other weights is off by far more than 1 nat per token) with a default threshold that FP8 error
alone does not reach: `FP8_LOGPROB_DIFF_THRESHOLD` unless `--first-step-logprob-diff-threshold` is given.
"""

from __future__ import annotations

import functools
import logging

from slime_app.checkpoint_shapes import safetensors_shapes
from slime_core.config import SlimeArgs
from slime_core.fp8 import Fp8Config, read_fp8_config, trainer_weights_dir

logger = logging.getLogger(__name__)

__all__ = [
    "FP8_LOGPROB_DIFF_THRESHOLD",
    "FP8_LOGPROB_DIFF_WARN",
    "check_fp8_rollout",
    "logprob_gate_thresholds",
    "serving_fp8",
]

# First-step mean |trainer - rollout log-prob| with FP8 serving: 3× the BF16 defaults (0.1 stop, 0.05 warning).
# e4m3 keeps 3 mantissa bits (weights within 2^-4 relative of BF16 ones), so FP8 error is a few times BF16's;
# an engine holding the wrong weights is off by ≫ 0.3.
FP8_LOGPROB_DIFF_THRESHOLD = 0.3
FP8_LOGPROB_DIFF_WARN = 0.15
_FLAG = "first_step_logprob_diff_threshold"


@functools.cache
def _read(hf_checkpoint: str) -> Fp8Config | None:
    return read_fp8_config(hf_checkpoint)


def serving_fp8(cfg: SlimeArgs) -> Fp8Config | None:
    """The FP8 config of what the engines serve (`--hf-checkpoint`), or None for unquantized serving.

    Raises:
        ValueError: `--hf-checkpoint` has a `quantization_config` other than blockwise FP8 (names the file).
    """
    return _read(str(cfg.hf_checkpoint)) if cfg.hf_checkpoint else None


def logprob_gate_thresholds(cfg: SlimeArgs, default_warn: float) -> tuple[float, float]:
    """`(stop, warn)` thresholds of the first-step log-prob gate (`slime_app.guards`).

    Args:
        cfg: reads `first_step_logprob_diff_threshold` (a value given on the command line or in YAML always wins)
            and `hf_checkpoint`.
        default_warn: the BF16 warning threshold.
    """
    if serving_fp8(cfg) is None or _FLAG in cfg.model_fields_set:
        return cfg.first_step_logprob_diff_threshold, default_warn
    return FP8_LOGPROB_DIFF_THRESHOLD, FP8_LOGPROB_DIFF_WARN


def check_fp8_rollout(cfg: SlimeArgs) -> list[str]:
    """Preflight of an FP8-serving run; returns notes for the log (none when the run serves BF16).

    Raises:
        ValueError: FP8 serving without the BF16 `--ref-load` the trainer starts from, with LoRA (the engine would
            need an FP8 base plus BF16 adapters, which this version does not push), with a quantized weight whose
            columns are not a multiple of the block's (`_check_block_columns`) or with a non-square block
            (`_check_square_block`), both while `--check-weight-sync` is on.
    """
    fp8 = serving_fp8(cfg)
    if fp8 is None:
        return []
    if cfg.lora_rank:
        raise ValueError(
            f"--lora-rank with an FP8 --hf-checkpoint {cfg.hf_checkpoint}: LoRA weight sync pushes BF16 adapters onto "
            "the served base, which is not supported for an FP8 base; use a BF16 --hf-checkpoint"
        )
    weights = trainer_weights_dir(cfg.hf_checkpoint, cfg.ref_load)
    if cfg.check_weight_sync:  # both limit only the weight check: SGLang serves such blocks
        _check_block_columns(str(cfg.hf_checkpoint), fp8.weight_block_size[1])
        _check_square_block(str(cfg.hf_checkpoint), fp8.weight_block_size)
    if not cfg.use_tis:
        logger.warning(
            "FP8 rollout without --use-tis: the original pairs FP8 serving with truncated importance sampling "
            "(--use-tis [--tis-clip 2]) to correct the larger train/inference mismatch"
        )
    stop, _ = logprob_gate_thresholds(cfg, 0.0)
    return [
        f"FP8 rollout: engines serve {cfg.hf_checkpoint} (e4m3, {fp8.weight_block_size[0]}x{fp8.weight_block_size[1]} "
        f"blocks), the trainer trains BF16 weights from {weights} and quantizes every push; first-step gate {stop:g}"
    ]


def _check_square_block(hf_checkpoint: str, block: tuple[int, int]) -> None:
    """Refuses a non-square `weight_block_size` when the weights are checked after a sync.

    SGLang 0.5.16's `/weights_checker` (`Fp8BlockComparable._infer_block_size`) and the reference engine, which
    answers as it does (`slime_rollout.engines.weight_checksum.sglang_fp8_comparable`), take the block as square
    with the width columns / scale columns: a taller block leaves rows without a scale (the check fails), a wider
    one dequantizes rows with their neighbours' scales (the check compares wrong values). Serving is unaffected.
    """
    if block[0] != block[1]:
        raise ValueError(
            f"{hf_checkpoint}/config.json: weight_block_size {list(block)} is not square; SGLang's weight checker "
            "infers a square block from the scales, so the weight check after each sync cannot dequantize these "
            "weights. Quantize with a square block (`slime-convert hf-to-fp8 --block-size B B`), or pass "
            "--no-check-weight-sync"
        )


def _check_block_columns(hf_checkpoint: str, block_cols: int) -> None:
    """Refuses FP8 weights whose column count is not a multiple of the block's (shapes from safetensors headers).

    The weight check dequantizes as SGLang's weight checker does, with the block width taken as columns / scale
    columns; a partial last column block makes that width wrong and the engine's `/weights_checker` fails
    (qwen3-tiny's hidden size 16 with the default 128 x 128 blocks). A checkpoint without safetensors passes.
    """
    shapes = safetensors_shapes(hf_checkpoint)
    misfits = [
        f"{weight} {list(shapes[weight])}"
        for weight in (name.removesuffix("_scale_inv") for name in shapes if name.endswith(".weight_scale_inv"))
        if weight in shapes and shapes[weight][-1] % block_cols
    ]
    if misfits:
        raise ValueError(
            f"FP8 --hf-checkpoint {hf_checkpoint}: {len(misfits)} quantized weight(s) have a column count that is "
            f"not a multiple of the {block_cols}-column block (first: {misfits[0]}); the weight check cannot "
            "dequantize them as SGLang does (serving is unaffected). Quantize with a block that divides the model's "
            "hidden and intermediate sizes (`slime-convert hf-to-fp8 --block-size B B`), or pass --no-check-weight-sync"
        )
