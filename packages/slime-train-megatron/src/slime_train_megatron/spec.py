"""The Megatron backend's capability record (`--train-backend megatron`), found through `slime.train_backends`.

Imports nothing of megatron-core: the config reads it when it validates `--train-backend`, and its preflight
runs on a driver that may not have the `megatron` extra.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from slime_core.extensions import TrainBackendSpec
from slime_core.registry import Problem

__all__ = ["MEGATRON", "preflight"]


def preflight(cfg: Any) -> list[Problem]:
    """The Megatron settings, parallel layout, log-prob head and model type must be ones this backend can run.

    The Megatron flags it reads must parse into `MegatronSettings` (a bad `--recompute-granularity` or
    `--attention-backend` value) and lay out over the trainer's ranks (`MegatronSettings.world_layout`), as the
    workers will check them; so must `--attention-backend` and `--context-parallel-size` fit the layer spec
    (`settings.attention_kind`: an error with `--transformer-impl local`, a note when it is unset and Transformer Engine
    is not importable here). `--log-probs-head`: unset or `fused` with `--tensor-model-parallel-size 1`
    (`settings.head_kind`). The model type must be one `slime_convert.model_args` can build as a GPTModel; checked
    first in the app's preflight: architecture-flag mismatches do not matter if the model cannot be built.

    Args:
        cfg: the validated config (reads `megatron_args` and the fields `MegatronSettings` shares, `actor_num_nodes`,
            `actor_num_gpus_per_node`, `log_probs_head`, `hf_checkpoint`).

    Returns:
        One error per problem found, else the notes (a missing `--hf-checkpoint` is the app's path checks').
    """
    # Here, not at the top: settings imports `slime_core.config`, which imports this module while it is imported.
    from slime_train_megatron.settings import MegatronSettings, attention_kind, head_kind

    try:
        settings = MegatronSettings.from_config(cfg)
        settings.world_layout(cfg.actor_num_nodes * cfg.actor_num_gpus_per_node)
        head_kind(cfg.log_probs_head, cfg.tensor_model_parallel_size)
    except ValueError as e:
        return [Problem(message=str(e))]
    notes = []
    # The layer spec's attention, as the workers pick it (`model.use_transformer_engine`): with --transformer-impl
    # unset they take Transformer Engine where it is installed, which only their machines can tell.
    te_here = importlib.util.find_spec("transformer_engine") is not None
    try:
        attention_kind(settings, settings.transformer_impl == "transformer_engine" or
                       (settings.transformer_impl is None and te_here))  # fmt: skip
    except ValueError as e:
        if settings.transformer_impl == "local":
            return [Problem(message=str(e))]
        notes.append(Problem(severity="note", message=(
            f"{e}. Transformer Engine is not importable here: a trainer machine without it stops at start"
        )))  # fmt: skip
    config = os.path.join(cfg.hf_checkpoint or "", "config.json")
    if not cfg.hf_checkpoint or not os.path.exists(config):
        return notes  # the app's own path checks name a missing --hf-checkpoint
    from slime_convert.model_args import ModelArgs

    with open(config, encoding="utf-8") as f:
        hf_config = json.load(f)
    try:
        ModelArgs.from_hf_config(hf_config, make_vocab_size_divisible_by=settings.make_vocab_size_divisible_by)
    except ValueError as e:
        return [Problem(message=f"cannot build this model ({e}); use --train-backend fsdp")]
    return notes


MEGATRON = TrainBackendSpec(
    name="megatron",
    factory="slime_train_megatron:MegatronTrainBackend",
    preflight="slime_train_megatron.spec:preflight",
    needs_gpu=True,  # megatron-core's optimizer and pipeline schedules are CUDA-only
    supports_colocate=True,
    supports_cp=True,
    supports_lora=False,
    supports_critic=True,
    megatron_native=True,  # TP/PP/EP and the Megatron flags go to megatron-core
    reads_torch_dist=True,
    checkpoint_format="torch_dist",
    lr_decay_styles=("constant", "linear", "cosine", "inverse-square-root", "WSD"),
    supports_fp16=True,  # OptimizerConfig(fp16=True) and its loss scaler (trainer_parts.build_optimizer)
    supports_opd_teacher=True,  # MegatronTrainBackend._load_teacher
)
