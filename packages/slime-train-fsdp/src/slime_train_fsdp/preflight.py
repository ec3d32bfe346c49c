"""The FSDP backend's check before a run starts (`spec.FSDP.preflight`), light to import.

The driver runs it on every `--train-backend fsdp` run, LoRA or not; importing `model_loading` for it (torch's
distributed checkpoint, transformers' model classes, the attention kernels) cost the driver ~5 CPU-seconds of
imports it never used otherwise. The model is built only when there is something to check.
"""

from __future__ import annotations

import os

from slime_core.config import SlimeArgs
from slime_core.registry import Problem

__all__ = ["lora_preflight"]


def lora_preflight(cfg: SlimeArgs) -> list[Problem]:
    """`--lora-target-modules` checked against the model of `--hf-checkpoint`, built on the meta device.

    The trainer refuses a name no linear layer has (`lora.check_targets`), but after the engines started; this is
    the same check before anything starts.

    Returns:
        One error naming the flag, or none (also without `--lora-rank` or a config.json: the app's checks name that).
    """
    if not cfg.lora_rank or not os.path.isfile(os.path.join(cfg.hf_checkpoint or "", "config.json")):
        return []
    import torch
    from transformers import AutoConfig

    from slime_train_fsdp.lora import check_targets
    from slime_train_fsdp.model_loading import _causal_lm

    with torch.device("meta"):
        model = _causal_lm(AutoConfig.from_pretrained(cfg.hf_checkpoint), "sdpa")
    try:
        check_targets(model, cfg.lora_target_modules)
    except ValueError as e:
        return [Problem(message=str(e))]
    return []
