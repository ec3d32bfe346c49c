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
        ConfigError: the fully-async rollout with `--colocate` and an offload (its engines never release their GPUs); or
            `--max-weight-staleness` with another rollout function (it would bound nothing).
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
