"""Settings that depend on the data and the checkpoints, filled in once before the run starts.

`parse_args` validates flags alone; two original flags need the files: `--num-epoch` (the run length is
`epochs × (prompts // --rollout-batch-size)`, the original's `num_rollout_per_epoch × num_epoch`) and an FSDP
`--ref-load` given as a torch_dist directory (read through its HF conversion). `resolve_config` returns the
re-validated config every component then receives.
"""

from __future__ import annotations

import logging

from slime_app.ref_load import fsdp_reference_dir
from slime_core.config import ConfigError, PluginArgs, SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["resolve_config"]


def resolve_config(cfg: SlimeArgs, *, convert: bool = True) -> tuple[SlimeArgs, list[str]]:
    """Fills `num_rollout` from `--num-epoch` and points an FSDP torch_dist `--ref-load` at its HF conversion.

    Args:
        cfg: the validated config (`num_rollout` may be None when `--num-epoch` is given).
        convert: convert a torch_dist `--ref-load` now; False (dry run) only names the target directory.

    Returns:
        The config to run with, and one line per resolved setting.

    Raises:
        ConfigError: the data holds fewer prompts than one `--rollout-batch-size`.
    """
    updates: dict[str, object] = {}
    notes: list[str] = []
    if cfg.num_rollout is None:
        from slime_rollout.data.source import count_prompts

        prompts = count_prompts(PluginArgs.from_config(cfg))
        per_epoch = prompts // cfg.rollout_batch_size
        if per_epoch == 0:
            raise ConfigError(
                f"--num-epoch: --prompt-data has {prompts} prompts, fewer than one --rollout-batch-size "
                f"({cfg.rollout_batch_size})"
            )
        updates["num_rollout"] = per_epoch * cfg.num_epoch
        notes.append(
            f"--num-epoch {cfg.num_epoch}: {prompts} prompts // --rollout-batch-size {cfg.rollout_batch_size} = "
            f"{per_epoch} rollouts per epoch, --num-rollout {updates['num_rollout']}"
        )
    elif cfg.num_epoch is not None:
        # The original ignores --num-epoch next to --num-rollout; keep no epoch boundary either.
        notes.append(f"--num-epoch {cfg.num_epoch} is ignored: --num-rollout {cfg.num_rollout} is given")
        updates["num_epoch"] = None
    reference = fsdp_reference_dir(cfg, convert=convert)
    if reference is not None:
        updates["ref_load"] = reference
        if convert:
            notes.append(f"--ref-load {cfg.ref_load} (torch_dist) -> {reference} (HF) for the FSDP reference model")
    if not updates:
        return cfg, notes
    return SlimeArgs.from_dict({**cfg.to_dict(), **updates}), notes
