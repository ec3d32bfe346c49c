"""slime-convert: Hugging Face safetensors ↔ Megatron-core torch_dist checkpoints (and FSDP checkpoints → HF).

The name/tensor mapping tables (`slime_convert.mapping`) are shared with slime's Megatron backend.
"""

from typing import Any

from slime_convert.model_args import ModelArgs, padded_vocab_size

# The converters and mapping tables need torch; they are imported on first use, so that `slime-convert --help`,
# `megatron-args` and `ModelArgs` (read by slime's preflight) start without it.
_LAZY = {
    "fsdp_to_hf": ("slime_convert.convert", "fsdp_to_hf"),
    "hf_to_mcore": ("slime_convert.convert", "hf_to_mcore"),
    "mcore_to_hf": ("slime_convert.convert", "mcore_to_hf"),
    "mcore_tensor_from_hf": ("slime_convert.mapping", "mcore_tensor_from_hf"),
    "tensor_mappings": ("slime_convert.mapping", "tensor_mappings"),
    "mcore_param_to_hf": ("slime_convert.mapping", "mcore_to_hf"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'slime_convert' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "ModelArgs",
    "hf_to_mcore",
    "mcore_param_to_hf",
    "mcore_tensor_from_hf",
    "mcore_to_hf",
    "padded_vocab_size",
    "tensor_mappings",
]
