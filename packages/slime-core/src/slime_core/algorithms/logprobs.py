"""Per-token log-probabilities and entropies from logits, in fp32 at the sampling temperature.

Legend: `T` = number of token positions, `V` = vocabulary size.

The trainer calls these on the logits that predict the response tokens (positions
`[start - 1, end - 1)` of a packed sequence). Math is done in fp32 whatever the logits' dtype,
after dividing by the rollout temperature, so trainer log-probs match the engine's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)

__all__ = ["entropy_from_logits", "log_probs_from_logits"]


def _scaled_fp32(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    return z


def _chunk_log_probs(logits: torch.Tensor, target_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    z = _scaled_fp32(logits, temperature)
    picked = z.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def _chunk_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    z = _scaled_fp32(logits, temperature)
    # H = logsumexp(z) - Σ softmax(z)·z; softmax via exp(z - lse) keeps it finite for large z.
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    p = torch.exp(z - lse)
    return lse.squeeze(-1) - (p * z).sum(-1)


def _validate(logits: torch.Tensor, temperature: float, chunk_size: int | None) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, V], got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature (--rollout-temperature) must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size (--log-probs-chunk-size) must be positive, got {chunk_size}")


def _run_chunked(fn: Callable[..., torch.Tensor], tensors: tuple[torch.Tensor, ...], chunk_size: int | None):
    num_tokens = tensors[0].shape[0]
    if chunk_size is None or chunk_size >= num_tokens:
        return fn(*tensors)
    outs = []
    for start in range(0, num_tokens, chunk_size):
        parts = tuple(t[start : start + chunk_size] for t in tensors)
        if torch.is_grad_enabled() and tensors[0].requires_grad:
            # Recompute the fp32 [chunk, V] copy in backward instead of keeping one per chunk alive:
            # that copy is what chunking exists to bound.
            outs.append(checkpoint(fn, *parts, use_reentrant=False))
        else:
            outs.append(fn(*parts))
    return torch.cat(outs)


def log_probs_from_logits(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Log-probability of each target token under `softmax(logits / temperature)`.

    `log p_t = z_t[y_t] - logsumexp(z_t)`, `z = fp32(logits) / temperature`. Differentiable in
    `logits`; with `chunk_size`, positions are processed in chunks of that many rows and, when a
    gradient is needed, each chunk is recomputed in backward (activation checkpointing) so at most
    one fp32 `[chunk_size, V]` copy is alive at a time.

    Args:
        logits: `[T, V]` any float dtype (bf16/fp16/fp32), the logits predicting each target.
        target_ids: `[T]` int64 token ids in `[0, V)`.
        temperature: sampling temperature (`--rollout-temperature`), > 0.
        chunk_size: rows per chunk (`--log-probs-chunk-size`); None = all at once.

    Returns:
        `[T]` float32 natural-log probabilities (≤ 0).

    Raises:
        ValueError: on bad shapes, a non-positive temperature or chunk size.
    """
    _validate(logits, temperature, chunk_size)
    if target_ids.shape != logits.shape[:1]:
        raise ValueError(f"target_ids must be [T]={tuple(logits.shape[:1])}, got {tuple(target_ids.shape)}")
    if logits.shape[0] == 0:
        return logits.new_zeros(0, dtype=torch.float32)
    target_ids = target_ids.long()
    return _run_chunked(lambda lg, ids: _chunk_log_probs(lg, ids, temperature), (logits, target_ids), chunk_size)


def entropy_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Entropy of `softmax(logits / temperature)` at each position.

    `H_t = logsumexp(z_t) - Σ_v softmax(z_t)_v · z_t,v` (natural log), `z = fp32(logits) / temperature`.
    Differentiable; chunking as in `log_probs_from_logits`.

    Args:
        logits: `[T, V]` any float dtype.
        temperature: sampling temperature, > 0.
        chunk_size: rows per chunk; None = all at once.

    Returns:
        `[T]` float32 entropies in nats, in `[0, log V]`.

    Raises:
        ValueError: on a bad shape, a non-positive temperature or chunk size.
    """
    _validate(logits, temperature, chunk_size)
    if logits.shape[0] == 0:
        return logits.new_zeros(0, dtype=torch.float32)
    return _run_chunked(lambda lg: _chunk_entropy(lg, temperature), (logits,), chunk_size)
