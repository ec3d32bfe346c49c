"""Checks that stop a run with one line: the first-step log-prob gate, and the stop of `--stop-on-instability`.

`RunStopped` carries that line; the command line prints it as `slime: stopped: <line>` and exits with code 3,
after the run's components were torn down (the metrics of the offending rollout are logged first).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from slime_app.fp8_rollout import logprob_gate_thresholds
from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["LOGPROB_DIFF_WARN", "RunStopped", "first_step_logprob_gate"]

# Above this mean |trainer log-prob − rollout log-prob| on the first step something is probably wrong (fp32 CPU
# runs agree to ~1e-6, bf16 GPU runs to ~1e-2): a warning. `--first-step-logprob-diff-threshold` stops the run.
LOGPROB_DIFF_WARN = 0.05
DIFF_KEY = "train/train_rollout_logprob_abs_diff"


class RunStopped(RuntimeError):
    """A check stopped the run; the message is the one line to show."""


class StartRefused(ValueError):
    """A trainer rank refused the run's input while starting (a damaged `--load` checkpoint); the one line to show."""


def first_step_logprob_gate(cfg: SlimeArgs, metrics: Mapping[str, float]) -> None:
    """Checks the first step's trainer-vs-rollout log-prob gap.

    The gap is `train/train_rollout_logprob_abs_diff`: the mean over trainable tokens of |log-prob of the
    trainer's weights - log-prob the engine reported| for the rollout's own tokens. Right after a weight sync the
    two sides hold the same weights, so a large gap means the engine serves other weights (a broken sync), samples
    at another temperature, or the masks/positions disagree; training on it is off-policy in a way no importance
    weight fixes.

    Args:
        cfg: reads `first_step_logprob_diff_threshold` (0: only the warning; unset with an FP8 `--hf-checkpoint`:
            `slime_app.fp8_rollout.FP8_LOGPROB_DIFF_THRESHOLD`) and `load_debug_rollout_data` (a replayed dump: only
            the warning).
        metrics: the first trained rollout's metrics (nothing happens without the gap metric: no rollout
            log-probs, e.g. a custom generate function that returns none).

    Raises:
        RunStopped: the gap exceeds the threshold.
    """
    diff = metrics.get(DIFF_KEY)
    if diff is None:
        logger.info("first-step log-prob check skipped: no %s (samples carry no rollout log-probs)", DIFF_KEY)
        return
    if cfg.true_on_policy_mode and diff > 0:
        logger.warning(
            "--true-on-policy-mode: first-step mean |trainer - rollout log-prob| = %.4g, not 0: the trainer does not "
            "reproduce the engine (exact only on CUDA with SGLang's kernels; see README, true on-policy mode)",
            diff,
        )
    # A replayed dump (--load-debug-rollout-data) may come from other weights than the trainer's start: warn only.
    # FP8 serving (an FP8 --hf-checkpoint) has its own defaults: slime_app.fp8_rollout.
    threshold, warn = logprob_gate_thresholds(cfg, LOGPROB_DIFF_WARN)
    threshold = 0.0 if cfg.load_debug_rollout_data else threshold
    if threshold and diff > threshold:
        raise RunStopped(
            f"first-step check failed: mean |trainer log-prob - rollout log-prob| = {diff:.4g} > {threshold:g} "
            "(--first-step-logprob-diff-threshold): engine weights, temperature or masks disagree with the trainer"
        )
    if diff > warn:
        logger.warning(
            "FIRST-STEP CHECK: mean |trainer log-prob - rollout log-prob| = %.4g > %.2g. "
            "Engine weights, temperature or masks may disagree with the trainer.",
            diff,
            warn,
        )
