"""Rules of the fully-async rollout (`--rollout-function-path ...generate_rollout_fully_async`), part of validation.

The fully-async rollout (`slime_rollout.generation.fully_async`) keeps generating on its engines while the trainer
trains, so the engines cannot hand their GPUs to the trainer, and its staleness bound means nothing to any other
rollout.
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
            `--max-weight-staleness` with another rollout function (it would bound nothing); or, with `--async`,
            a bound below `--update-weights-interval` (no group could ever meet it).
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
    _check_async_staleness(args)


def _check_async_staleness(args: SlimeArgs) -> None:
    # With --async, rollout N+1 is collected before the weights trained on N are pushed, and pushes come every
    # --update-weights-interval rollouts: its groups are 1 to that many versions behind. A tighter bound drops every
    # group forever, and the step (its save and weight push queue behind that collection) waits until
    # --rollout-timeout-secs (4 h by default) with no word.
    bound, interval = args.max_weight_staleness, args.update_weights_interval
    if args.async_train and bound is not None and bound < interval:
        raise ConfigError(
            f"--max-weight-staleness {bound} with --async --update-weights-interval {interval}: the next rollout is "
            f"collected before the weights it would need are pushed, so its groups are 1 to {interval} version(s) "
            f"behind and every one would be dropped (the run would wait for --rollout-timeout-secs): use "
            f"--max-weight-staleness {interval} or more, or drop --async"
        )
