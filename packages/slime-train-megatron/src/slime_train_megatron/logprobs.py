"""Log-probabilities and entropy from vocabulary-parallel logits (each TP rank holds `V / TP` columns).

    logp(y) = z_y − logsumexp(z),   H = logsumexp(z) − Σ_v softmax(z)_v · z_v,   z = logits / temperature

The max, the exp-sums and the target logit are all-reduced over the TP group (sum forward, identity
backward), so each rank's shard gets exactly its gradient. Rows beyond the real vocabulary (Megatron's
padding) are excluded. Computed in fp32. With top-p replay (`kept`) the log-softmax runs over each row's kept
token ids plus its target, each rank contributing the kept ids of its vocabulary slice.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from slime_core.algorithms import KeptTokens

__all__ = ["vocab_parallel_log_probs"]


class _AllReduceSumIdentityGrad(torch.autograd.Function):
    """All-reduce (sum) forward, identity backward.

    Every TP rank computes the same loss from the reduced value, so the gradient reaching the reduced
    tensor is already identical on all ranks and belongs unchanged to each rank's partial sum (summing it
    again, as `torch.distributed.nn.all_reduce` does, would scale it by the TP size). This is Megatron's
    `reduce_from_tensor_model_parallel_region`.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:  # noqa: D102
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102
        return grad, None


def _all_reduce_sum(x: torch.Tensor, group: dist.ProcessGroup | None, size: int) -> torch.Tensor:
    return x if size == 1 else _AllReduceSumIdentityGrad.apply(x, group)


def _restricted_lse(shifted, targets, target_z, kept: KeptTokens, vocab_start: int, group, size: int):
    """`logsumexp` over each row's kept ids (those in this rank's vocabulary slice, summed over TP) + its target."""
    rows_n, v_local = shifted.shape
    if kept.num_rows != rows_n:
        raise ValueError(f"top-p replay: {kept.num_rows} rows of kept tokens for {rows_n} logit rows")
    local_ids = kept.ids - vocab_start
    mine = (local_ids >= 0) & (local_ids < v_local) & (kept.ids != targets[kept.rows])  # the target enters once
    rows, cols = kept.rows[mine], local_ids[mine]
    values = shifted[rows, cols]  # [K_local]
    # Shift by the row max over all ranks (no gradient: logsumexp does not depend on it).
    row_max = torch.full((rows_n,), float("-inf"), device=shifted.device, dtype=shifted.dtype)
    row_max = row_max.scatter_reduce(0, rows, values.detach(), reduce="amax")
    if size > 1:
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    row_max = torch.maximum(row_max, target_z.detach())
    partial = values.new_zeros(rows_n).index_add(0, rows, torch.exp(values - row_max[rows]))
    return row_max + torch.log(_all_reduce_sum(partial, group, size) + torch.exp(target_z - row_max))


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    vocab_start: int = 0,
    vocab_size: int | None = None,
    group: dist.ProcessGroup | None = None,
    with_entropy: bool = False,
    kept: KeptTokens | None = None,
    chunk_size: int = -1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropy) of `targets` under TP-sharded logits.

    Args:
        logits: `[R, V_local]` this rank's vocabulary slice (any float dtype).
        targets: `[R]` int64 global token ids.
        temperature: divides the logits (the rollout temperature, so log-probs match the engine's).
        vocab_start: global id of this rank's first column (`tp_rank × V_local`).
        vocab_size: real vocabulary size; columns with global id ≥ it (padding) are ignored. None = keep all.
        group: the tensor-parallel process group (None with one rank: no communication).
        with_entropy: also return the entropy.
        kept: top-p replay: the engine's kept token ids (global) of each of the `R` rows; the log-probs are then
            over each row's kept ids plus its target (`slime_core.algorithms.top_p`), the entropy stays that of
            the full distribution. None for the full softmax.
        chunk_size: rows per chunk (`--log-probs-chunk-size`, as the original's `calculate_log_probs_and_entropy`):
            the fp32 `[chunk, V_local]` intermediates are built one chunk at a time, so a no-grad pass (old and
            reference log-probs) holds one chunk's; ≤ 0: all rows at once. Same values either way.

    Returns:
        `(log_probs [R] float32, entropy [R] float32 or None)`, differentiable w.r.t. `logits`.

    Raises:
        ValueError: non-positive temperature or shape mismatch.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [R, V_local] and targets [R], got {tuple(targets.shape)}"
        )
    if 0 < chunk_size < logits.shape[0]:
        # Every TP rank holds the same rows, so each chunk's collectives pair up across the group.
        parts = [
            vocab_parallel_log_probs(
                logits[start : start + chunk_size],
                targets[start : start + chunk_size],
                temperature=temperature,
                vocab_start=vocab_start,
                vocab_size=vocab_size,
                group=group,
                with_entropy=with_entropy,
                kept=None if kept is None else kept.slice_rows(start, min(start + chunk_size, logits.shape[0])),
            )
            for start in range(0, logits.shape[0], chunk_size)
        ]
        entropy = torch.cat([e for _, e in parts]) if with_entropy else None
        return torch.cat([lp for lp, _ in parts]), entropy
    size = dist.get_world_size(group) if group is not None and dist.is_initialized() else 1
    z = logits.float()  # [R, V_local]
    v_local = z.shape[1]
    if vocab_size is not None and vocab_start + v_local > vocab_size:
        col = torch.arange(vocab_start, vocab_start + v_local, device=z.device)
        z = z.masked_fill(col >= vocab_size, float("-inf"))
    # Max is for stability only and carries no gradient; it is subtracted before the temperature division so that
    # huge logits cannot overflow there either.
    z_max = z.detach().max(dim=-1).values  # [R]
    if size > 1:
        dist.all_reduce(z_max, op=dist.ReduceOp.MAX, group=group)
    shifted = (z - z_max[:, None]) / temperature
    exp = shifted.exp()  # padding columns: exp(-inf) = 0
    sum_exp = _all_reduce_sum(exp.sum(dim=-1), group, size)  # [R]
    lse = sum_exp.log()  # logsumexp − max
    local = targets - vocab_start
    in_range = (local >= 0) & (local < v_local)
    picked = shifted.gather(1, local.clamp(0, v_local - 1)[:, None])[:, 0] * in_range
    target_z = _all_reduce_sum(picked, group, size)  # [R] shifted logit of each target
    log_probs = target_z - (lse if kept is None else _restricted_lse(shifted, targets, target_z, kept, vocab_start,
                                                                     group, size))  # fmt: skip
    entropy = None
    if with_entropy:
        # Σ p·shifted with p = exp/sum_exp. Padding columns (and columns whose distance to the max overflows fp32)
        # are -inf with p = 0: clamping them to the fp32 minimum keeps 0·(−inf) = NaN out of the value and of the
        # gradient (a `where` would still send NaN back through the product).
        weighted = (exp * shifted.clamp(min=torch.finfo(torch.float32).min)).sum(dim=-1)
        entropy = lse - _all_reduce_sum(weighted, group, size) / sum_exp
    return log_probs, entropy
