"""The PPO critic's value head for megatron-core's `GPTModel`: `output_layer` becomes `Linear(hidden, 1)`.

As the original's critic (`LinearForLastLayer`): a plain linear layer with bias, replicated over tensor-parallel
ranks, weight ~ N(0, `init_method_std`), bias 0, output in fp32. Under sequence parallelism its input is this
rank's slice of the sequence, so the values are gathered over the TP group (backward keeps the rank's slice)
and the head's parameters are marked `sequence_parallel`, which makes megatron-core all-reduce their gradients
over TP. The embeddings are never tied to it.
"""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer import TransformerConfig

__all__ = ["ValueHead", "value_head_from_hf"]

_HF_HEAD_PREFIXES = ("value_head", "score")  # HF-format critics, token-classification / reward models


class ValueHead(torch.nn.Linear):
    """`[s, b, H] -> ([s, b, 1] fp32, None)`, the call signature of `GPTModel.output_layer`.

    Args:
        config: the model's transformer config (hidden size, `init_method_std`, `sequence_parallel`).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config.hidden_size, 1, bias=True)
        self.sequence_parallel = config.sequence_parallel
        if self.sequence_parallel:
            self.weight.sequence_parallel = True
            self.bias.sequence_parallel = True
        with torch.no_grad():
            self.weight.normal_(mean=0.0, std=config.init_method_std)
            self.bias.zero_()

    def forward(
        self, input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output: bool | None = None
    ) -> tuple[torch.Tensor, None]:
        """Values of every position (`weight` / `runtime_gather_output`, the vocab head's arguments, are unused)."""
        values = super().forward(input_).float()
        if self.sequence_parallel:
            values = tensor_parallel.gather_from_sequence_parallel_region(values, tensor_parallel_output_grad=False)
        return values, None


def value_head_from_hf(read, has) -> dict[str, torch.Tensor] | None:
    """A `[1, H]` value head stored in an HF checkpoint (`value_head.*` or `score.*`), or None.

    Args:
        read: `name -> tensor` of the checkpoint.
        has: `name -> bool`, whether the checkpoint holds `name`.
    """
    for prefix in _HF_HEAD_PREFIXES:
        if has(f"{prefix}.weight"):
            weight = read(f"{prefix}.weight")
            if weight.dim() == 2 and weight.shape[0] == 1:
                bias = read(f"{prefix}.bias") if has(f"{prefix}.bias") else torch.zeros(1)
                return {"weight": weight, "bias": bias}
    return None
