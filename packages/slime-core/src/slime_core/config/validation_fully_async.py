"""Rules of the fully-async rollout (`--rollout-function-path ...generate_rollout_fully_async`), part of validation.

The fully-async rollout (`slime_rollout.generation.fully_async`) keeps generating on its engines while the trainer
trains, so the engines cannot hand their GPUs to the trainer, and its staleness bound means nothing to any other
rollout. A bound no group can meet is refused: the take would wait forever, dropping every group it gets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError
from slime_core.config.rollout import FULLY_ASYNC_ROLLOUT_PATHS

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["check_fully_async", "is_fully_async"]


def is_fully_async(args: SlimeArgs) -> bool:
    """Whether `--rollout-function-path` names the fully-async rollout (ours or the original's import path)."""
    return args.rollout_function_path in FULLY_ASYNC_ROLLOUT_PATHS


def check_fully_async(args: SlimeArgs) -> None:
    """Checks the fully-async flags (after `--colocate` and `--debug-rollout-only` are resolved).

    Raises:
        ConfigError: the fully-async rollout with `--colocate` and an offload (its engines never release their GPUs);
            `--max-weight-staleness` with another rollout function (it would bound nothing), with
            `--debug-rollout-only`, or below `--update-weights-interval` with `--async` (`_check_bound`).
    """
    if not is_fully_async(args):
        if args.max_weight_staleness is not None:
            raise ConfigError(
                f"--max-weight-staleness bounds the fully-async rollout only; --rollout-function-path is "
                f"{args.rollout_function_path}: use slime.rollout.fully_async_rollout.generate_rollout_fully_async "
                "or drop the flag"
            )
        return
    if args.colocate and (args.offload_train or args.offload_rollout):
        raise ConfigError(
            "--rollout-function-path generate_rollout_fully_async generates while the trainer trains, which cannot "
            "swap one GPU's memory between them: drop --colocate (give the engines their own GPUs with "
            "--rollout-num-gpus), or keep both resident on the shared GPUs with --no-offload-train --no-offload-rollout"
        )
    if args.max_weight_staleness is not None:
        _check_bound(args, args.max_weight_staleness)


def _check_bound(args: SlimeArgs, bound: int) -> None:
    """Refuses a `--max-weight-staleness` that every group would exceed (the take would never fill).

    Staleness is the trained rollout id minus the engines' weight version when the group was generated
    (`slime_rollout.generation.staleness`). With `--debug-rollout-only` no trainer pushes weights: the engines keep
    their first version while the rollout id advances, so from rollout K + 1 on every group is too stale. Refused
    rather than ignored: a debug rollout trains nothing, so the bound has nothing to protect, and a run that silently
    ignored it would not measure what the training run's bound does. With `--async` rollout r is generated while
    rollout r - 1 trains, on the weights of the last push, up to `--update-weights-interval` (U) versions behind
    (the push waits for that generation; `slime_app.loop.Rollouts`): a bound below U leaves some rollouts with only
    too-stale groups (every one, at U = 1 and bound 0).
    """
    if args.debug_rollout_only:
        raise ConfigError(
            f"--max-weight-staleness {bound} with --debug-rollout-only: no trainer pushes weights, so the engines "
            f"keep their first version while the rollout id advances, so {bound + 1} rollouts in every group would be "
            "dropped as too stale (the rollout would wait forever); drop --max-weight-staleness"
        )
    interval = args.update_weights_interval
    if args.async_train and bound < interval:
        raise ConfigError(
            f"--max-weight-staleness {bound} with --async and --update-weights-interval {interval}: --async generates "
            f"rollout r while the engines hold weights up to {interval} version(s) older, so every group of such a "
            f"rollout would be dropped as too stale (the rollout would wait forever); use --max-weight-staleness "
            f">= {interval}, or drop --async (the fully-async rollout already generates while the trainer trains)"
        )
