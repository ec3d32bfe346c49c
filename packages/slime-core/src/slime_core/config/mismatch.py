"""Settings and rules of the sequence-level importance sampling / rejection helper (MIS, `slime_core.algorithms.mis`).

The names are the original's (`examples/train_infer_mismatch_helper/mis.yaml`, read there through
`--custom-config-path`; that file sets these fields here too). Any of them other than its default picks the MIS
helper as the built-in `--use-tis` function; `--use-tis` alone stays the token-level TIS of `--tis-clip`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from slime_core.config.base import ArgsGroup, ConfigError, arg, warn_once

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["MismatchArgs", "uses_mis_helper", "validate_mismatch"]

Level = Literal["token", "sequence", "geometric"]


class MismatchArgs(ArgsGroup):
    """Sequence-level / geometric importance sampling and rejection sampling for the train/inference mismatch."""

    tis_level: Level = arg(
        "token",
        "Level of the --use-tis weight: token (exp(lp_train - lp_rollout) per token), sequence (their product over "
        "the response) or geometric (their geometric mean); not token selects the MIS helper.",
    )
    tis_lower_bound: float | None = arg(
        None, "MIS helper: lower bound of the weight for --tis-mode clip / mask (default 1 / --tis-upper-bound).", gt=0
    )
    tis_upper_bound: float | None = arg(
        None, "MIS helper: upper bound of the weight for --tis-mode truncate / clip / mask (default --tis-clip).", gt=0
    )
    tis_batch_normalize: bool = arg(
        False, "MIS helper: divide the weights by their mean over the micro-batch (token or sequence level)."
    )
    use_rs: bool = arg(
        False, "MIS helper: rejection sampling, drop tokens whose --rs-level weight is outside the --rs-* bounds."
    )
    rs_level: Level = arg("token", "Level of the --use-rs weight: token, sequence or geometric.")
    rs_lower_bound: float | None = arg(None, "Lower bound of --use-rs (default: the TIS lower bound).", gt=0)
    rs_upper_bound: float | None = arg(None, "Upper bound of --use-rs (default: the TIS upper bound).", gt=0)
    rs_veto_threshold: float | None = arg(
        None, "With --use-rs: drop a whole response holding a trainable token with ratio below this (e.g. 1e-4).", gt=0
    )


def uses_mis_helper(args: SlimeArgs) -> bool:
    """Whether the built-in `--use-tis` function is the MIS helper rather than token-level TIS / IcePop."""
    return args.tis_level != "token" or args.tis_mode in ("clip", "mask") or args.use_rs or args.tis_batch_normalize


def validate_mismatch(args: SlimeArgs) -> None:
    """Checks the MIS settings and fills the unset bounds (as the original helper does at run time).

    Raises:
        ConfigError: `--tis-mode icepop` with an MIS setting, `--tis-batch-normalize` at the geometric level, or a
            lower bound not below its upper bound.
    """
    if args.get_mismatch_metrics and args.use_rollout_logprobs:
        warn_once(
            "mismatch_recompute",
            "--get-mismatch-metrics with --use-rollout-logprobs: the trainer still computes its own log-probs for the "
            "metrics (one more forward pass when a rollout trains in several steps)",
        )
    mis = uses_mis_helper(args) or args.rs_veto_threshold is not None
    if mis and not args.use_tis:
        warn_once(
            "mis_without_tis",
            "--tis-level / --tis-mode clip|mask / --use-rs / --tis-batch-normalize have no effect without --use-tis",
        )
    if args.tis_mode == "icepop" and uses_mis_helper(args):
        raise ConfigError(
            "--tis-mode icepop is token-level TIS only (no --tis-level other than token, --use-rs or "
            "--tis-batch-normalize); --tis-mode mask is the MIS helper's rejection form"
        )
    if args.tis_batch_normalize and args.tis_level == "geometric":
        raise ConfigError("--tis-batch-normalize works with --tis-level token or sequence, not geometric")
    if args.rs_veto_threshold is not None and not args.use_rs:
        warn_once("veto_without_rs", "--rs-veto-threshold has no effect without --use-rs")
    if args.tis_upper_bound is None:
        args.tis_upper_bound = args.tis_clip
    if args.tis_lower_bound is None:
        args.tis_lower_bound = 1.0 / args.tis_upper_bound
    if args.rs_lower_bound is None:
        args.rs_lower_bound = args.tis_lower_bound
    if args.rs_upper_bound is None:
        args.rs_upper_bound = args.tis_upper_bound
    for low, high in (("tis_lower_bound", "tis_upper_bound"), ("rs_lower_bound", "rs_upper_bound")):
        if getattr(args, low) > getattr(args, high):
            raise ConfigError(
                f"--{low.replace('_', '-')} ({getattr(args, low)}) must be <= --{high.replace('_', '-')} "
                f"({getattr(args, high)})"
            )
