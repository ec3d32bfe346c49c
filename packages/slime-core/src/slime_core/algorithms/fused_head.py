"""The `fused` log-prob head: `lm_head` matmul + log-softmax/entropy with a hand-written backward.

Shared by both trainers (it lives here because the FSDP and Megatron packages may not import each other): the FSDP
backend's `--log-probs-head fused` (`slime_train_fsdp.logprob_head`) and the Megatron backend's
(`slime_train_megatron.output_head`, TP = 1).

The `fp32out` head computes the same numbers through autograd: per chunk, ~12 eager passes over the fp32
`[c, V]` logits forward (shift, divide, logsumexp, gather, exp, product, sum), a checkpointed recompute of all
of them, and ~25 more passes differentiating them op by op (issue 26's profile of the qwen3-0.6b e2e train
phase: 688 ms of elementwise kernels and 409 ms of copies/casts against 471 ms of GEMMs per `train()`).

Here each chunk is one `torch.autograd.Function`:

- forward: `logits = h W^T` `[c, V]` fp32 (bf16 tensor cores with fp32 accumulation and output on CUDA, as
  `fp32out`), then one stats function gives the row max `m`, `lse = logsumexp(z)`, `log p(target) = z[t] - lse`
  and the entropy `H = lse - Σ_v p_v z_v` with `z = (logits - m) / T`. Only `h`, `W`, the targets and the `[c]`
  vectors `m`, `lse`, `H` are saved; the logits are dropped.
- backward: the logits again from the matmul, then one elementwise function writes, in the operands' dtype,
  `grad_logits = (g_logp (onehot(t) - p) - g_H p (log p + H)) / T`, followed by `grad_h = grad_logits W` and
  `grad_W = grad_logits^T h`. The entropy term is `dH/dz_j = -p_j (log p_j + H)` for `H = -Σ p log p` and
  `p = softmax(z)`; `dz/dlogits = 1/T`.

Both functions are plain torch code compiled with `torch.compile(dynamic=True)` on CUDA (inductor fuses each
into one or two reduction kernels) when the caller asks (`compiled=True`; the FSDP backend passes
`ForwardOptions.compile_head`, `--fsdp-compile-layers`' resolved value, per model, so an actor and a critic or
teacher in one process never share a switch; the Megatron backend always passes True) and run eagerly on CPU or
otherwise.

Numerics follow slime_core's `log_probs_and_entropy_from_logits`: the row max is subtracted before the
temperature, so nothing overflows for finite logits; a column whose distance to the max overflows fp32 is -inf
in `z`, has `p = 0`, and is clamped to the fp32 minimum wherever it is multiplied, so `0 * -inf` never makes NaN.

Legend: `c` = chunk rows, `H` = hidden size, `V` = vocab size, `T` = temperature.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["DEFAULT_CHUNK", "fp32out_logits", "fused_log_probs", "resolve_chunk_size"]

logger = logging.getLogger(__name__)

_FP32_MIN = torch.finfo(torch.float32).min

#: Response rows per `lm_head` chunk when `--log-probs-chunk-size` is unset (-1), under either backend.
DEFAULT_CHUNK = 1024


def resolve_chunk_size(log_probs_chunk_size: int) -> int:
    """Rows per `lm_head` chunk for `--log-probs-chunk-size`: its value when positive, else `DEFAULT_CHUNK`."""
    return log_probs_chunk_size if log_probs_chunk_size > 0 else DEFAULT_CHUNK


def _stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool):
    """`(log p(target) [c], m [c], lse [c], H [c] or [0])` from fp32 logits `[c, V]` (see the module docstring)."""
    m = logits.amax(dim=-1)  # [c]
    z = (logits - m[:, None]) / temperature  # [c, V], ≤ 0; inductor keeps it in registers
    lse = torch.logsumexp(z, dim=-1)  # [c]
    picked = (logits.gather(-1, targets[:, None])[:, 0] - m) / temperature
    if not with_entropy:
        return picked - lse, m, lse, lse.new_zeros(0)
    p = torch.exp(z - lse[:, None])
    # -inf columns have p = 0; the clamp turns 0 * -inf (NaN) into 0.
    entropy = lse - (p * z.clamp(min=_FP32_MIN)).sum(-1)
    return picked - lse, m, lse, entropy


def _grad_logits(logits, targets, m, lse, entropy, g_logp, g_entropy, temperature: float, out_dtype: torch.dtype):
    """`[c, V]` gradient of `Σ g_logp·logp + Σ g_entropy·H` wrt the logits, in `out_dtype`.

    `g_logp`/`g_entropy` `[c]` fp32 or None (no gradient through that output); `entropy` is only read with
    `g_entropy`.
    """
    log_p = ((logits - m[:, None]) / temperature).clamp(min=_FP32_MIN) - lse[:, None]  # [c, V], finite
    p = torch.exp(log_p)
    grad = None
    if g_logp is not None:
        onehot = torch.arange(logits.shape[-1], device=logits.device)[None, :] == targets[:, None]
        grad = g_logp[:, None] * (onehot.to(p.dtype) - p)
    if g_entropy is not None:
        ent_term = g_entropy[:, None] * p * (log_p + entropy[:, None])
        grad = -ent_term if grad is None else grad - ent_term
    assert grad is not None, "called without a cotangent"
    return (grad / temperature).to(out_dtype)


@functools.cache
def _compiled(fn, backend: str | Callable[..., Any] = "inductor"):
    """`fn` under `torch.compile(dynamic=True)`, built once per function (chunk rows vary, `V` does not).

    Traced with dynamo's `specialize_float` on (for this function only, `torch._dynamo.config.patch`): its float
    `temperature` is then a constant from the start. Off (torch's default, which the process keeps without
    `--megatron-compile-layers`/`--fsdp-compile-layers`: `slime_core.compile_setup`), dynamo traced it symbolic, the
    tensorify pass restarted the analysis with it constant after a first pass through AOT autograd, and every process
    lowered each function twice. `backend` is torch.compile's (tests count its calls).
    """
    return torch._dynamo.config.patch(specialize_float=True)(torch.compile(fn, dynamic=True, backend=backend))


def _maybe_compiled(fn, device: torch.device, compiled: bool):
    """`fn` compiled when asked and on CUDA; CPU always runs eagerly (inductor's C++ build would dominate)."""
    return _compiled(fn) if compiled and device.type == "cuda" else fn


def _own(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t`, copied when it is a view into another tensor (a chunk of the targets or of the cotangent).

    For the compiled functions: dynamo guards a view's storage offset (0 and 1 apart from the rest) and its base's
    size, and ties equal sizes together ("duck sizing"), so chunk slices made one graph per chunk position and per
    coincidence of sizes, which the compile warm-up could not all foresee (one H100: 3 of the head's graphs missed
    at the first compiled step). A `[c]` copy costs nothing next to the `[c, V]` work.
    """
    if t is None or (t._base is None and t.storage_offset() == 0):
        return t
    return t.clone()


def fp32out_logits(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`h @ w^T` `[c, V]` fp32 (heads `fp32out`, `fused`): fp32 accumulation and output from bf16 tensor cores."""
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(h, w.t(), out_dtype=torch.float32)
    return h.float() @ w.float().t()  # exact for bf16 operands: the reference of the CUDA kernel


class _FusedChunk(torch.autograd.Function):
    """One chunk: `(h [c, H], w [V, H], targets [c])` -> `(log p [c] fp32, entropy [c] fp32 or [0])`."""

    @staticmethod
    def forward(ctx, h, w, targets, temperature: float, with_entropy: bool, compiled: bool = False):
        ctx.temperature, ctx.with_entropy, ctx.compiled = temperature, with_entropy, compiled
        if h.shape[0] == 0:  # nothing to compute (and no zero-row graph to compile)
            empty = h.new_zeros(0, dtype=torch.float32)
            ctx.save_for_backward(h, w, targets, empty, empty, empty)
            return empty.clone(), empty.clone()
        stats = _maybe_compiled(_stats, h.device, compiled)
        logp, m, lse, entropy = stats(fp32out_logits(h, w), _own(targets), temperature, with_entropy)
        ctx.save_for_backward(h, w, targets, m, lse, entropy)
        ctx.set_materialize_grads(False)  # a None cotangent skips its term instead of multiplying zeros
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        h, w, targets, m, lse, entropy = ctx.saved_tensors
        if not ctx.with_entropy:  # the [0] entropy output carries no gradient
            g_entropy = None
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (g_logp is None and g_entropy is None) or not (need_h or need_w):
            return None, None, None, None, None, None
        if h.shape[0] == 0:
            zero_h, zero_w = torch.zeros_like(h) if need_h else None, torch.zeros_like(w) if need_w else None
            return zero_h, zero_w, None, None, None, None
        grad_fn = _maybe_compiled(_grad_logits, h.device, ctx.compiled)
        g_logp = None if g_logp is None else _own(g_logp.float())
        g_entropy = None if g_entropy is None else _own(g_entropy.float())
        g = grad_fn(fp32out_logits(h, w), _own(targets), m, lse, entropy, g_logp, g_entropy, ctx.temperature, h.dtype)
        grad_h = g @ w.to(h.dtype) if need_h else None
        grad_w = (g.t() @ h).to(w.dtype) if need_w else None
        return grad_h, grad_w, None, None, None, None


def fused_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    *,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs (and entropy) through the fused head, `chunk_size` rows at a time.

    Same values as the `fp32out` head (fp32 logits from the compute-dtype operands, fp32 softmax math) to
    ~1e-6; gradients wrt `hidden` and `weight` in their dtypes. No top-p replay: `head_log_probs` sends calls
    with `kept` to `fp32out`.

    Args:
        hidden: `[R, H]` final hidden states (compute dtype: bf16 under FSDP on GPU, fp32 on CPU).
        weight: `[V, H]` `lm_head` weight; cast to `hidden`'s dtype (differentiably) once.
        targets: `[R]` int64 token ids in `[0, V)`.
        temperature: `--rollout-temperature` (> 0).
        chunk_size: rows per chunk (> 0); one `[chunk_size, V]` fp32 logits tensor is alive at a time.
        with_entropy: also return the entropy (otherwise no entropy work is done).
        compiled: run the two elementwise functions under `torch.compile` on CUDA (ignored on CPU).

    Returns:
        (`[R]` fp32 natural-log probabilities, `[R]` fp32 entropies in nats or `[0]`).

    Raises:
        ValueError: a non-positive temperature or chunk size, or mismatched shapes.
    """
    if not temperature > 0:
        raise ValueError(f"--rollout-temperature must be > 0 for the log-prob head, got {temperature}")
    if chunk_size <= 0:
        raise ValueError(f"--log-probs-chunk-size must be positive, got {chunk_size}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"fused head: hidden [R, H] and weight [V, H] expected, got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")  # fmt: skip
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"fused head: targets must be [R]={tuple(hidden.shape[:1])}, got {tuple(targets.shape)}")
    w = weight.to(hidden.dtype)
    targets = targets.long()
    logps, ents = [], []
    for start in range(0, int(targets.numel()), chunk_size):
        end = start + chunk_size
        lp, ent = _FusedChunk.apply(
            hidden[start:end], w, targets[start:end], float(temperature), with_entropy, bool(compiled)
        )
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logps), torch.cat(ents)
