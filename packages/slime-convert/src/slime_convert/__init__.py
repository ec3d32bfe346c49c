"""slime-convert: Hugging Face safetensors ↔ Megatron-core torch_dist checkpoints.

The name/tensor mapping tables (`slime_convert.mapping`) are shared with slime's Megatron backend.
"""

from slime_convert.convert import hf_to_mcore, mcore_to_hf
from slime_convert.mapping import mcore_tensor_from_hf, tensor_mappings
from slime_convert.mapping import mcore_to_hf as mcore_param_to_hf
from slime_convert.model_args import ModelArgs, padded_vocab_size

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
