"""The FSDP backend's capability record (`--train-backend fsdp`), found through `slime.train_backends`.

Imports nothing heavy: the config reads it when it validates `--train-backend`.
"""

from __future__ import annotations

from slime_core.extensions import TrainBackendSpec

__all__ = ["FSDP"]

FSDP = TrainBackendSpec(
    name="fsdp",
    factory="slime_train_fsdp.backend:FSDPTrainBackend",
    preflight="slime_train_fsdp.preflight:lora_preflight",  # --lora-target-modules against the model
    needs_gpu=False,  # gloo on CPU
    supports_colocate=True,
    supports_cp=True,  # Ulysses all-to-all (slime_train_fsdp.context_parallel)
    supports_lora=True,  # peft (slime_train_fsdp.lora)
    supports_critic=True,
    checkpoint_format="fsdp",
    lr_decay_styles=("constant", "linear", "cosine", "inverse-square-root", "WSD"),
    supports_multimodal=True,  # slime_train_fsdp.vision  # --fsdp-compile-layers
    supports_routing_replay=True,  # slime_train_fsdp.routing_replay (HF MoE routers)
    supports_true_on_policy=True,  # slime_train_fsdp.true_on_policy
    supports_opd_teacher=True,  # FSDPTrainBackend._load_teacher
)
