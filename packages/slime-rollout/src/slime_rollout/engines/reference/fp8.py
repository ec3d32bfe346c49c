"""FP8 serving in the reference engine: a thin stand-in for SGLang's `Fp8Config` (BF16 training, FP8 rollout).

SGLang keeps an FP8 checkpoint's linear weights as e4m3 plus `weight_scale_inv` and multiplies in FP8; this CPU
engine dequantizes every FP8 weight on load (`slime_core.fp8.dequantize_blockwise`, in float32, then cast to the
engine's dtype), so it computes with exactly the values SGLang's weights stand for, without FP8 kernels. What it
received is kept as is, so `/weights_checker` reports SGLang's checksums: each FP8 `*.weight` (fused
`qkv_proj`/`gate_up_proj` as SGLang fuses them) hashed as its bfloat16 dequantization, no scale listed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from slime_core.fp8 import FP8_DTYPE, SCALE_SUFFIX, Fp8Config, dequantize_named

logger = logging.getLogger(__name__)

__all__ = ["ServedFp8", "build_empty"]


def build_empty(model_cls: Any, config: Any, dtype: torch.dtype | str) -> torch.nn.Module:
    """The model of an FP8 checkpoint's config, unquantized and not yet loaded (the caller loads the weights).

    transformers would apply its own FP8 quantizer (GPU-only) to a config with a `quantization_config`, so the
    attribute is removed first.
    """
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or torch.float32
    return model_cls.from_config(config, dtype=dtype)


class ServedFp8:
    """The FP8 state of a reference engine: its checkpoint's config (None: unquantized) and the FP8 tensors held.

    Args:
        cfg: the served checkpoint's FP8 config (`slime_core.fp8.read_fp8_config`), or None.
    """

    def __init__(self, cfg: Fp8Config | None):
        self.cfg = cfg
        self.held: dict[str, torch.Tensor] = {}  # module name → the e4m3 weight or fp32 scale last loaded

    def dequantized(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The loadable stream: FP8 pairs joined and dequantized to float32, other tensors unchanged.

        Raises:
            ValueError: an FP8 tensor while the engine serves an unquantized model, or half of a pair (names it).
        """
        block = self.cfg.weight_block_size if self.cfg is not None else None
        staged: dict[str, torch.Tensor] = {}

        def record(stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in stream:
                if tensor.dtype == FP8_DTYPE or name.endswith(SCALE_SUFFIX):
                    staged[name] = tensor.detach().to("cpu", copy=True)
                yield name, tensor

        yield from dequantize_named(record(named), block)
        self.held.update(staged)  # only once the whole stream was consistent

    def checksum_items(self, state: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """`state` with each FP8-served weight replaced by its e4m3 bytes and its scale added, as SGLang holds them.

        `sglang_checksums` then hashes each pair dequantized to bfloat16 and lists no scale, as SGLang's checker.
        """
        items = dict(state)
        items.update(self.held)
        return list(items.items())
