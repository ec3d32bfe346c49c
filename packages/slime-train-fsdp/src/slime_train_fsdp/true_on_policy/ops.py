"""The row-wise ops of SGLang 0.5.16's Qwen3 under `--rl-on-policy-target fsdp`, in its op order and dtypes.

Each function restates one SGLang code path (file named in its docstring) with plain torch ops, so that on the
GPU, with the same batch-invariant `aten::mm`/`aten::mean`/`aten::_log_softmax` overrides installed in both
processes (`kernels.enable_batch_invariant_ops`), every element comes out bit-identical. They are ordinary
differentiable torch code, so the trainer back-propagates through them.

Legend: `T` tokens of a packed row, `H` hidden size, `N` heads, `D` head dim, `V` vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["Linear", "Rotary", "apply_rotary", "rms_norm", "rope_cos_sin_cache", "sampler_log_probs", "silu_and_mul"]


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's `RMSNorm.forward_native` with `weight_dtype=fp32, cast_x_before_out_mul=True`.

    Source: `sglang/srt/layers/layernorm.py` (`RMSNorm.forward_native`); under batch-invariant mode with
    `rl_on_policy_target == "fsdp"` every CUDA call goes there. `x` is upcast to fp32 and the fp32 residual added
    (decoder norms: `fp32_residual=True`, so the new residual is that fp32 sum), `x * rsqrt(mean(x^2) + eps)`,
    cast to `out_dtype` (the layer norms: `override_orig_dtype=fp32`; q/k norms: the input's dtype), then
    multiplied by the fp32 weight (so the result is fp32).

    Args:
        x: `[..., H]` any float dtype.
        weight: `[H]`; used as fp32 (the engine holds the bf16 checkpoint values in an fp32 parameter).
        eps: `rms_norm_eps`.
        residual: `[..., H]` fp32 residual stream, or None (first layer: the residual is `x` itself).
        out_dtype: dtype `x` is cast to before the weight product; None keeps `x`'s dtype.

    Returns:
        (`[..., H]` fp32 normalized values, `[..., H]` fp32 residual stream after the add).
    """
    orig_dtype = out_dtype or x.dtype
    h = x.to(torch.float32)
    if residual is not None:
        h = h + residual.to(torch.float32)
    new_residual = h
    variance = h.pow(2).mean(dim=-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight.to(torch.float32) * h.to(orig_dtype), new_residual


def rope_cos_sin_cache(head_dim: int, base: float, max_position: int, device: torch.device) -> torch.Tensor:
    """SGLang's `RotaryEmbedding._compute_cos_sin_cache` under the on-policy mode.

    Source: `sglang/srt/layers/rotary_embedding/base.py`: with `rl_on_policy_target` set, the inverse frequencies
    are computed on CPU in fp32 (to match HF) and moved to the GPU; positions, their outer product and cos/sin are
    computed on the model's device (SGLang builds the model under its CUDA device), and the cache stays fp32.

    Args:
        head_dim: rotary dim (Qwen3 rotates the whole head).
        base: `rope_theta`.
        max_position: rows of the cache (positions `0 .. max_position-1`).
        device: the model's device (where SGLang computes cos/sin; CPU and CUDA may differ in the last ulp).

    Returns:
        `[max_position, head_dim]` fp32: `cos` in the first half of the columns, `sin` in the second.
    """
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu") / head_dim))
    inv_freq = inv_freq.to(device)
    t = torch.arange(max_position, dtype=torch.float, device=device)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox_style: bool = True) -> torch.Tensor:
    """Neox-style rotation, SGLang's `apply_rotary_emb` (`sglang/srt/layers/rotary_embedding/utils.py`), eager.

    Args:
        x: `[T, N, D]`.
        cos: `[T, D/2]` (any float dtype; cast to `x`'s dtype as SGLang does).
        sin: `[T, D/2]`.
        is_neox_style: must be True (Qwen3); kept for SGLang's signature.

    Returns:
        `[T, N, D]` in `x`'s dtype.
    """
    if not is_neox_style:
        raise ValueError("only neox-style rotary embeddings are mirrored")
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Rotary(torch.autograd.Function):
    """`apply(x, cos, sin, fn) -> fn(x, cos, sin, True)` with the analytic backward of the rotation.

    SGLang runs `apply_rotary_emb` through `torch.compile(dynamic=True)` in the mode (`rotary_embedding/base.py`);
    the compiled kernel may contract `a*b - c*d` into FMAs, so the trainer calls the same compiled function (`fn`,
    from `kernels.load_kernels`) for an identical forward, outside autograd, and differentiates the rotation by
    hand: `dx1 = g1*cos + g2*sin`, `dx2 = g2*cos - g1*sin`.
    """

    @staticmethod
    def forward(ctx, x, cos, sin, fn):  # noqa: D102
        ctx.save_for_backward(cos, sin)
        with torch.no_grad():
            return fn(x, cos, sin, True)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        cos, sin = ctx.saved_tensors
        cos = cos.unsqueeze(-2).to(grad.dtype)
        sin = sin.unsqueeze(-2).to(grad.dtype)
        g1, g2 = torch.chunk(grad, 2, dim=-1)
        return torch.cat((g1 * cos + g2 * sin, g2 * cos - g1 * sin), dim=-1), None, None, None


class Linear(torch.autograd.Function):
    """`apply(x [T, K], w [N, K], b [N] or None) -> x @ w^T + b [T, N]`: exact forward, fast backward.

    The forward is `F.linear`, i.e. `aten::mm(x, w.t())` as SGLang's `UnquantizedLinearMethod` and `lm_head` call it,
    which SGLang's batch-invariant kernel serves once installed (`kernels.enable_batch_invariant_ops`). Gradients
    need not be bit-exact, so the backward goes through `torch.bmm`, which the mode leaves to cuBLAS
    (`enable_bmm=False`, as in the original), instead of the slower batch-invariant matmul.
    """

    @staticmethod
    def forward(ctx, x, w, b):  # noqa: D102
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        x, w = ctx.saved_tensors
        grad_x = torch.bmm(grad.unsqueeze(0), w.unsqueeze(0)).squeeze(0)
        grad_w = torch.bmm(grad.t().unsqueeze(0), x.unsqueeze(0)).squeeze(0)
        return grad_x, grad_w, grad.sum(0) if ctx.has_bias else None


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SGLang's `SiluAndMul.forward_native` (`sglang/srt/layers/activation.py`): `silu(gate) * up`, one dtype.

    Args:
        gate_up: `[T, 2I]`, gate in the first half of the columns (SGLang's merged `gate_up_proj`).

    Returns:
        `[T, I]` in `gate_up`'s dtype.
    """
    d = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :d]) * gate_up[..., d:]


def sampler_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool = False,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs exactly as SGLang's `Sampler` returns them in the on-policy mode.

    Source: `sglang/srt/layers/sampler.py` (`rl_on_policy_target is not None`):
    `log_softmax(logits.bfloat16().div(temperatures).bfloat16(), dim=-1)`, where `temperatures` is an fp32
    tensor, so the division runs in fp32 on the bf16 logits and is rounded back to bf16; the log-softmax is taken
    on that bf16 tensor and returned in bf16. The logits themselves are `hidden.bfloat16() @ W.bfloat16().T`
    (`logits_processor.py`, `_compute_lm_head`), exact in fp32 after `.float()`.

    Args:
        logits: `[R, V]` bf16 logits (already cut to the config's vocabulary size).
        targets: `[R]` int64 tokens to score.
        temperature: `--rollout-temperature` (> 0).
        with_entropy: also return the entropy of the same distribution (fp32, from the bf16 log-probs).
        dtype: the engine's compute dtype, bf16 (another only for the CPU fallback's fp32 checks).

    Returns:
        (`[R]` fp32 log-probs of `targets` (bf16 values), `[R]` fp32 entropy or `[0]`).
    """
    # [1, 1] like SGLang's [B, 1]: a dimensioned fp32 operand promotes the division to fp32 (a 0-d one would not).
    temperatures = torch.full((1, 1), temperature, dtype=torch.float32, device=logits.device)
    scaled = logits.to(dtype).div(temperatures).to(dtype)
    logp = torch.log_softmax(scaled, dim=-1)  # [R, V] in `dtype`
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
    if not with_entropy:
        return picked, picked.new_zeros(0)
    logp32 = logp.float()
    return picked, -(logp32.exp() * logp32).sum(-1)
