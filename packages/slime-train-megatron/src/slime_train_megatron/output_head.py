"""How the actor's last pipeline stage turns the decoder output into response log-probs (`--log-probs-head`).

Two heads:

- `logits` (the default): megatron-core's `GPTModel` runs its output layer on every position of the packed row,
  `[T, V/TP]` logits in the compute dtype (bf16 on GPU), and `logprobs.vocab_parallel_log_probs` picks the `R`
  response rows and upcasts them: the lm_head matmul covers all `T` positions (the prompt ones are thrown away),
  and autograd keeps several fp32 `[R, V]` tensors of the log-softmax for the backward.
- `fused` (`--log-probs-head fused`, the FSDP backend's flag and head): the output layer returns its input, so the
  model's output is the final-norm hidden states `[T, H]`; the `R` response rows go through
  `slime_core.algorithms.fused_head.fused_log_probs` with the output weight (the tied embedding or the untied
  output layer's): the lm_head runs on the response rows only, in chunks, with fp32 logits from bf16 tensor cores
  and a hand-written backward that keeps no `[c, V]` tensor. Needs `--tensor-model-parallel-size 1` (the fused
  head is not vocabulary-parallel). Its logits are fp32 where `logits`' are bf16, so on GPU the log-probs differ
  from the default head's by bf16 rounding of the logits (they are closer to an fp32 lm_head); in fp32 (CPU
  tests) the two heads agree to float rounding. With top-p replay (`kept`) the fused head's rows take the
  `logits` head's math (an lm_head matmul in the compute dtype on the response rows, then the restricted softmax).

The switch is the output layer's class: `emit_hidden_states` makes the `ColumnParallelLinear` an
`_HiddenStatesOutputLayer` (same parameters, names and gradient buffers; only `forward` differs), which keeps
checkpoints, weight export and DDP unchanged, and can be undone.

Legend: `T` packed row length, `R` response rows, `H` hidden size, `V` vocabulary (padded to a multiple of 128).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel import ColumnParallelLinear

from slime_core.algorithms import KeptTokens
from slime_core.algorithms.fused_head import fused_log_probs
from slime_train_megatron.logprobs import vocab_parallel_log_probs

__all__ = ["emit_hidden_states", "hidden_log_probs"]


class _HiddenStatesOutputLayer(ColumnParallelLinear):
    """The LM head's `ColumnParallelLinear` returning its input: `GPTModel` then outputs `[b, s, H]` hidden states."""

    def forward(self, input_, weight=None, runtime_gather_output=None):  # noqa: D102 (ColumnParallelLinear's)
        return input_, None


def emit_hidden_states(model: torch.nn.Module, on: bool) -> None:
    """Makes the last stage's `output_layer` return the final hidden states (`on`) or the logits again.

    Args:
        model: the unwrapped `GPTModel` of this stage; a stage without `output_layer` is left alone.
        on: hidden states (the `fused` head) or megatron-core's logits (the `logits` head).

    Raises:
        TypeError: an output layer that is not megatron-core's `ColumnParallelLinear` (e.g. the critic's value head).
    """
    layer = getattr(model, "output_layer", None)
    if layer is None:
        return
    if not isinstance(layer, ColumnParallelLinear):
        raise TypeError(f"the fused head needs megatron-core's ColumnParallelLinear output layer, not {type(layer)}")
    layer.__class__ = _HiddenStatesOutputLayer if on else ColumnParallelLinear


def hidden_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    vocab_size: int,
    chunk_size: int,
    with_entropy: bool,
    kept: KeptTokens | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Response log-probs (and entropy) from final hidden states through the fused head (TP = 1).

    Args:
        hidden: `[R, H]` final-norm hidden states at the positions that predict `targets` (compute dtype).
        weight: `[V_padded, H]` output weight (tied embedding or output layer); rows ≥ `vocab_size` are Megatron's
            padding and are left out of the softmax.
        targets: `[R]` int64 token ids below `vocab_size`.
        temperature: `--rollout-temperature` (> 0).
        vocab_size: the real vocabulary size.
        chunk_size: response rows per chunk (> 0).
        with_entropy: also return the entropy.
        kept: top-p replay sets of the `R` rows; then the `logits` head's math on the response rows.

    Returns:
        `(log_probs [R] float32, entropy [R] float32 or None)`, differentiable w.r.t. `hidden` and `weight`.

    Raises:
        ValueError: a non-positive temperature or chunk size, or mismatched shapes.
    """
    if kept is not None:
        logits = F.linear(hidden, weight.to(hidden.dtype))  # [R, V_padded], as megatron's output layer computes it
        return vocab_parallel_log_probs(
            logits,
            targets,
            temperature=temperature,
            vocab_size=vocab_size,
            with_entropy=with_entropy,
            kept=kept,
            chunk_size=chunk_size,
        )
    # compiled: inductor fuses the stats and gradient passes on CUDA; fused_head runs them eagerly elsewhere
    lp, ent = fused_log_probs(
        hidden, weight[:vocab_size], targets, temperature, chunk_size, with_entropy, compiled=True
    )
    return lp, (ent if with_entropy else None)
