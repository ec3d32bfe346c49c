"""Log-probabilities and entropy from vocabulary-parallel logits (each TP rank holds `V / TP` columns).

    logp(y) = z_y − logsumexp(z),   H = logsumexp(z) − Σ_v softmax(z)_v · z_v,   z = logits / temperature

The max, the exp-sums and the target logit are all-reduced over the TP group (sum forward, identity
backward), so each rank's shard gets exactly its gradient. Rows beyond the real vocabulary (Megatron's
padding) are excluded. Computed in fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

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


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    vocab_start: int = 0,
    vocab_size: int | None = None,
    group: dist.ProcessGroup | None = None,
    with_entropy: bool = False,
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
    log_probs = _all_reduce_sum(picked, group, size) - lse
    entropy = None
    if with_entropy:
        # Σ p·shifted with p = exp/sum_exp. Padding columns (and columns whose distance to the max overflows fp32)
        # are -inf with p = 0: clamping them to the fp32 minimum keeps 0·(−inf) = NaN out of the value and of the
        # gradient (a `where` would still send NaN back through the product).
        weighted = (exp * shifted.clamp(min=torch.finfo(torch.float32).min)).sum(dim=-1)
        entropy = lse - _all_reduce_sum(weighted, group, size) / sum_exp
    return log_probs, entropy
