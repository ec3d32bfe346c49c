"""Per-token log-probabilities and entropies from logits, in fp32 at the sampling temperature.

Legend: `T` = number of token positions, `V` = vocabulary size.

The trainer calls these on the logits that predict the response tokens (positions
`[start - 1, end - 1)` of a packed sequence). Math is done in fp32 whatever the logits' dtype, on
`z = (logits - max_v logits) / temperature`: the row max is subtracted before anything else, so neither the
temperature division nor `exp` can overflow, and `H = logsumexp(z) - Σ softmax(z)·z` is a difference of
O(log V) numbers instead of O(|logits|) ones (without the shift, logits around 1e3 lose ~0.03 nats of
entropy to fp32 cancellation; with it the error stays ~1e-6 for any finite logits).

With `kept` (top-p replay, `slime_core.algorithms.top_p`) the log-probs are those of the distribution the
engine sampled from: the softmax restricted to each position's nucleus plus the sampled token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from slime_core.algorithms.top_p import KeptTokens, restricted_logsumexp

logger = logging.getLogger(__name__)

__all__ = ["entropy_from_logits", "log_probs_and_entropy_from_logits", "log_probs_from_logits", "shifted_logits"]

_FP32_MIN = torch.finfo(torch.float32).min


def shifted_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`z = (fp32(logits) - max_v logits) / temperature`, `[T, V]` float32, every entry ≤ 0.

    The max carries no gradient (log-softmax does not depend on a per-row shift). A column whose distance
    to the max overflows fp32 (|logits| near 3e38) becomes -inf: its probability is 0 either way.
    """
    z = logits.float()
    z = z - z.detach().amax(dim=-1, keepdim=True)
    return z if temperature == 1.0 else z / temperature


def _chunk_log_probs(logits, target_ids, temperature, kept: KeptTokens | None) -> torch.Tensor:
    z = shifted_logits(logits, temperature)
    picked = z.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1)
    lse = torch.logsumexp(z, dim=-1) if kept is None else restricted_logsumexp(z, target_ids, kept)
    return picked - lse


def _entropy_of_shifted(z: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
    # H = lse - Σ p·z on the shifted z (≤ 0): both terms are O(log V). A -inf column has p = 0; clamping it to
    # the fp32 minimum keeps 0·(-inf) = NaN out of the sum and out of the gradient. `lse` `[T]`: the row's
    # logsumexp when the caller has it already (one fewer pass over `[T, V]`).
    lse = torch.logsumexp(z, dim=-1) if lse is None else lse
    p = torch.exp(z - lse[:, None])
    return lse - (p * z.clamp(min=_FP32_MIN)).sum(-1)


def _chunk_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return _entropy_of_shifted(shifted_logits(logits, temperature))


def _validate(logits: torch.Tensor, temperature: float, chunk_size: int | None) -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, V], got shape {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature (--rollout-temperature) must be > 0, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size (--log-probs-chunk-size) must be positive, got {chunk_size}")


def _run_chunked(
    fn: Callable[..., torch.Tensor],
    tensors: tuple[torch.Tensor, ...],
    chunk_size: int | None,
    kept: KeptTokens | None = None,
):
    num_tokens = tensors[0].shape[0]
    if chunk_size is None or chunk_size >= num_tokens:
        return fn(*tensors, kept)
    outs = []
    for start in range(0, num_tokens, chunk_size):
        parts = tuple(t[start : start + chunk_size] for t in tensors)
        part_kept = None if kept is None else kept.slice_rows(start, min(start + chunk_size, num_tokens))
        if torch.is_grad_enabled() and tensors[0].requires_grad:
            # Recompute the fp32 [chunk, V] copy in backward instead of keeping one per chunk alive:
            # that copy is what chunking exists to bound.
            outs.append(checkpoint(fn, *parts, part_kept, use_reentrant=False))
        else:
            outs.append(fn(*parts, part_kept))
    return torch.cat(outs)


def log_probs_from_logits(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    kept: KeptTokens | None = None,
) -> torch.Tensor:
    """Log-probability of each target token under `softmax(logits / temperature)`.

    `log p_t = z_t[y_t] - logsumexp(z_t)`, `z = (fp32(logits) - max) / temperature`; with `kept` the
    logsumexp runs over `K_t ∪ {y_t}` only (top-p replay). Differentiable in `logits`; with `chunk_size`,
    positions are processed in chunks of that many rows and, when a gradient is needed, each chunk is
    recomputed in backward (activation checkpointing) so at most one fp32 `[chunk_size, V]` copy is alive.

    Args:
        logits: `[T, V]` any float dtype (bf16/fp16/fp32), the logits predicting each target; any finite values.
        target_ids: `[T]` int64 token ids in `[0, V)`.
        temperature: sampling temperature (`--rollout-temperature`), > 0.
        chunk_size: rows per chunk (`--log-probs-chunk-size`); None = all at once.
        kept: the engine's nucleus of each of the `T` rows (`--rollout-top-p < 1`), or None for the full softmax.

    Returns:
        `[T]` float32 natural-log probabilities (≤ 0).

    Raises:
        ValueError: on bad shapes, a non-positive temperature or chunk size, or `kept` of the wrong row count.
    """
    _validate(logits, temperature, chunk_size)
    if target_ids.shape != logits.shape[:1]:
        raise ValueError(f"target_ids must be [T]={tuple(logits.shape[:1])}, got {tuple(target_ids.shape)}")
    if kept is not None and kept.num_rows != logits.shape[0]:
        raise ValueError(f"kept tokens cover {kept.num_rows} rows, logits have {logits.shape[0]}")
    if logits.shape[0] == 0:
        return logits.new_zeros(0, dtype=torch.float32)
    target_ids = target_ids.long()

    def fn(lg, ids, kp):
        return _chunk_log_probs(lg, ids, temperature, kp)

    return _run_chunked(fn, (logits, target_ids), chunk_size, kept)


def entropy_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Entropy of `softmax(logits / temperature)` at each position.

    `H_t = logsumexp(z_t) - Σ_v softmax(z_t)_v · z_t,v` (natural log), `z = (fp32(logits) - max) / temperature`.
    Differentiable; chunking as in `log_probs_from_logits`.

    Args:
        logits: `[T, V]` any float dtype; any finite values.
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
    return _run_chunked(lambda lg, _kept: _chunk_entropy(lg, temperature), (logits,), chunk_size)


def log_probs_and_entropy_from_logits(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    temperature: float = 1.0,
    *,
    with_entropy: bool,
    kept: KeptTokens | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both of the above from one shifted fp32 copy of `logits` (no chunking: callers pass one chunk).

    Args:
        logits: `[T, V]` any float dtype.
        target_ids: `[T]` int64.
        temperature: > 0.
        with_entropy: also compute the entropy (of the full softmax, also with `kept`).
        kept: top-p replay sets of the `T` rows, or None.

    Returns:
        `(log_probs [T] float32, entropy [T] float32 or [0])`.

    Raises:
        ValueError: as `log_probs_from_logits`.
    """
    _validate(logits, temperature, None)
    z = shifted_logits(logits, temperature)
    target_ids = target_ids.long()
    picked = z.gather(-1, target_ids[:, None])[:, 0]
    full_lse = torch.logsumexp(z, dim=-1) if kept is None or with_entropy else None
    lse = full_lse if kept is None else restricted_logsumexp(z, target_ids, kept)
    entropy = _entropy_of_shifted(z, full_lse) if with_entropy else picked.new_zeros(0)
    return picked - lse, entropy
