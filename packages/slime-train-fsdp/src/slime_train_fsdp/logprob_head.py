"""The log-prob/entropy head: `lm_head` + fp32 log-softmax at the response positions, six ways.

Given the decoder's final hidden states at the `R` positions that predict response tokens, the head returns
each target's log-probability under `softmax(h W^T / T)` and, optionally, the entropy of that distribution.
The `[R, V]` logits never exist at once: tokens go through in chunks, and (except `liger`, which fuses the
same idea into Triton kernels) each chunk's logits are recomputed in backward instead of being kept.

Heads (`--log-probs-head`):

- `fp32`: fp32 matmul (weights upcast per chunk), TF32 off. Exact; the CPU default and the reference.
- `tf32`: the same fp32 matmul with TF32 tensor cores allowed for this matmul only (forward and backward), not
  through the global flag. Log-prob error ~1e-5 on qwen3 shapes (issue 22's probe: 1.7e-5).
- `fp32out`: the matmul on bf16 tensor cores with fp32 accumulation and fp32 logits (`torch.mm(...,
  out_dtype=torch.float32)`), backward in the compute dtype. The operands are bf16 values already (hidden states
  and the FSDP-gathered weight), so the logits are those of `fp32`/`tf32` up to summation order, at twice TF32's
  rate. On CPU (no such kernel) the same product runs in fp32.
- `fused` (`slime_core.algorithms.fused_head`): the `fp32out` matmul and numbers, with one forward stats function and
  a hand-written backward (one elementwise function writing the logits' gradient in the compute dtype) instead of
  autograd over ~12 eager passes, compiled on CUDA with the decoder layers; only `h`, `W` and `[c]` vectors are kept per
  chunk. The CUDA default. With top-p replay (`kept`) it runs the `fp32out` path (logged once).
- `bf16`: matmul in the compute dtype (bf16 under FSDP mixed precision), fp32 softmax math on the chunk's
  logits. Error ~1e-2 in log-prob on qwen3 shapes: bf16 logits carry 8 mantissa bits.
- `liger`: liger-kernel's fused linear cross-entropy with `reduction="none"` (per-token `-log p`) on `h / T`;
  optional dependency, CUDA only; the entropy, when asked for, comes from the `bf16` chunk path.

Every head but `liger` and `fused` turns a chunk's logits into log-probs and entropy with slime_core's
`log_probs_and_entropy_from_logits`, which subtracts the row max before the temperature and the softmax, so
large logits neither overflow nor cancel.

Legend: `R` = response positions, `c` = chunk rows, `H` = hidden size, `V` = vocab size, `T` = temperature.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from slime_core.algorithms import KeptTokens, log_probs_and_entropy_from_logits
from slime_core.algorithms.fused_head import fp32out_logits, fused_log_probs

__all__ = ["DEFAULT_CPU_HEAD", "DEFAULT_CUDA_HEAD", "HEADS", "default_head", "head_log_probs"]

logger = logging.getLogger(__name__)

DEFAULT_CPU_HEAD = "fp32"
# The CUDA default: the fastest head whose logits are fp32, which rules out the bf16 logits of `bf16`/`liger`.
# `fused` computes `fp32out`'s numbers (which gave the same trainer-vs-SGLang gap as `fp32` to 5 digits,
# benchmarks/probe_logprob_gap.py) with a hand-written backward: on one H200 (5d5b5b9, bench_train_fsdp.py at the
# e2e shape, qwen3-0.6b, 256 x 384 tokens) 1.138 s per train() against fp32out's 1.546 s, 30.5 GiB peak against
# 50.6 GiB, the same grad norm (0.6731 vs 0.6732).
DEFAULT_CUDA_HEAD = "fused"


def default_head(device: torch.device) -> str:
    """`DEFAULT_CUDA_HEAD` on CUDA, else `DEFAULT_CPU_HEAD`."""
    return DEFAULT_CUDA_HEAD if device.type == "cuda" else DEFAULT_CPU_HEAD


@contextlib.contextmanager
def _tf32_matmul() -> Iterator[None]:
    """Allows TF32 in cuBLAS fp32 matmuls inside the block and restores the previous setting after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class _TF32Linear(torch.autograd.Function):
    """`h @ w^T` for fp32 inputs with TF32 allowed in forward and in both backward matmuls.

    A custom function because backward runs later (and, on CUDA, on autograd's device thread): a flag set
    around the forward call alone would not cover it.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, w)
        with _tf32_matmul():
            return h @ w.t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, w = ctx.saved_tensors
        with _tf32_matmul():
            grad_h = grad @ w if ctx.needs_input_grad[0] else None
            grad_w = grad.t() @ h if ctx.needs_input_grad[1] else None
        return grad_h, grad_w


class _Fp32OutLinear(torch.autograd.Function):
    """`h @ w^T` `[c, V]` in fp32 from compute-dtype operands (bf16 on GPU): fp32 accumulation and output.

    Backward casts the fp32 cotangent to the operands' dtype and runs both matmuls there (fp32 accumulation
    inside cuBLAS), as every other bf16 layer's backward does.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h, w)
        return fp32out_logits(h, w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, w = ctx.saved_tensors
        g = grad.to(h.dtype)
        grad_h = g @ w.to(h.dtype) if ctx.needs_input_grad[0] else None
        grad_w = (g.t() @ h).to(w.dtype) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w


def _stable_log_probs(logits, targets, temperature: float, with_entropy: bool, kept: KeptTokens | None = None):
    """fp32 `log p(target)` `[c]` and entropy `[c]` (or `[0]`) from `[c, V]` logits of any float dtype.

    With `kept` (top-p replay) the log-probs are over each row's nucleus plus its target; the entropy is not.
    """
    return log_probs_and_entropy_from_logits(logits, targets, temperature, with_entropy=with_entropy, kept=kept)


def _chunk_fp32(h, w, targets, temperature, with_entropy, kept=None):
    logits = F.linear(h.float(), w.float())  # [c, V] fp32, TF32 as globally configured (off by default)
    return _stable_log_probs(logits, targets, temperature, with_entropy, kept)


def _chunk_tf32(h, w, targets, temperature, with_entropy, kept=None):
    logits = _TF32Linear.apply(h.float(), w.float())  # [c, V] fp32 from TF32 tensor cores
    return _stable_log_probs(logits, targets, temperature, with_entropy, kept)


def _chunk_fp32out(h, w, targets, temperature, with_entropy, kept=None):
    logits = _Fp32OutLinear.apply(h, w.to(h.dtype))  # [c, V] fp32 from bf16 tensor cores
    return _stable_log_probs(logits, targets, temperature, with_entropy, kept)


def _chunk_bf16(h, w, targets, temperature, with_entropy, kept=None):
    logits = F.linear(h, w.to(h.dtype))  # [c, V] in the compute dtype (bf16 on GPU, fp32 on CPU)
    return _stable_log_probs(logits, targets, temperature, with_entropy, kept)


def _chunked(chunk_fn: Callable, hidden, weight, targets, temperature, chunk_size, with_entropy, kept=None):
    logps, ents = [], []
    num = int(targets.numel())
    for start in range(0, num, chunk_size):
        args = (hidden[start : start + chunk_size], weight, targets[start : start + chunk_size])
        part = None if kept is None else kept.slice_rows(start, min(start + chunk_size, num))
        if torch.is_grad_enabled():
            # Recompute the chunk's logits in backward instead of keeping [c, V] activations per chunk.
            lp, ent = checkpoint(chunk_fn, *args, temperature, with_entropy, part, use_reentrant=False)
        else:
            lp, ent = chunk_fn(*args, temperature, with_entropy, part)
        logps.append(lp)
        ents.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(logps), torch.cat(ents)


def _liger(hidden, weight, targets, temperature, chunk_size, with_entropy, kept=None, compiled=False):
    if kept is not None:
        others = [h for h in HEADS if h != "liger"]  # every other head replays the sets
        raise ValueError(
            "--log-probs-head liger computes the full softmax and cannot replay the engine's top-p sets "
            f"(--rollout-top-p < 1): use --log-probs-head {', '.join(others[:-1])} or {others[-1]}"
        )
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError as exc:
        raise ImportError(
            "--log-probs-head liger needs liger-kernel (`pip install liger-kernel`), which is not installed"
        ) from exc
    if hidden.device.type != "cuda":
        raise ValueError("--log-probs-head liger runs on CUDA only (Triton kernels); use fp32 on CPU")
    if targets.numel() == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    # logits / T == (h / T) W^T: the temperature folds into the input; reduction="none" gives -log p per token.
    scaled = hidden / temperature if temperature != 1.0 else hidden
    nll = liger_fused_linear_cross_entropy(scaled, weight.to(hidden.dtype), targets, reduction="none",
                                           accum_dtype=torch.float32)  # fmt: skip
    ent = hidden.new_zeros(0, dtype=torch.float32)
    if with_entropy:
        _, ent = _chunked(_chunk_bf16, hidden, weight, targets, temperature, chunk_size, True)
    return -nll.float(), ent


@functools.cache
def _log_top_p_fallback() -> None:
    logger.info(
        "--log-probs-head fused: top-p replay (--rollout-top-p < 1) restricts each row's softmax, which the "
        "fused kernels do not; those calls run the fp32out head (same logits, autograd backward)"
    )


def _fused(hidden, weight, targets, temperature, chunk_size, with_entropy, kept=None, compiled=False):
    if kept is not None:  # top-p replay restricts the softmax per row: the autograd path of `fp32out` does that
        _log_top_p_fallback()
        return HEADS["fp32out"](hidden, weight, targets, temperature, chunk_size, with_entropy, kept)
    return fused_log_probs(hidden, weight, targets, temperature, chunk_size, with_entropy, compiled=compiled)


def _autograd_head(chunk_fn: Callable) -> Callable:
    """A head of `_chunked` chunks; nothing in it is compiled, so `compiled` does not apply."""

    def head(hidden, weight, targets, temperature, chunk_size, with_entropy, kept=None, compiled=False):
        return _chunked(chunk_fn, hidden, weight, targets, temperature, chunk_size, with_entropy, kept)

    return head


HEADS: dict[str, Callable] = {
    "fp32": _autograd_head(_chunk_fp32),
    "tf32": _autograd_head(_chunk_tf32),
    "fp32out": _autograd_head(_chunk_fp32out),
    "bf16": _autograd_head(_chunk_bf16),
    "fused": _fused,
    "liger": _liger,
}


def head_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    head: str = DEFAULT_CPU_HEAD,
    kept: KeptTokens | None = None,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Response log-probs (and entropy) from final hidden states.

    Args:
        hidden: `[R, H]` final-norm hidden states at the positions that predict the targets (compute dtype).
        weight: `[V, H]` `lm_head` weight (unsharded, compute dtype).
        targets: `[R]` int64 token ids.
        temperature: `--rollout-temperature` (> 0).
        chunk_size: rows per chunk (> 0); `liger` picks its own chunking.
        with_entropy: also return the entropy.
        head: one of `HEADS`.
        kept: top-p replay sets of the `R` rows (`--rollout-top-p < 1`), or None for the full softmax.
        compiled: `fused` only: run its elementwise functions under `torch.compile` on CUDA
            (`ForwardOptions.compile_head`).

    Returns:
        (`[R]` fp32 natural-log probabilities, `[R]` fp32 entropies in nats or `[0]`).

    Raises:
        KeyError: unknown head (the message lists the known ones).
        ImportError: `liger` without liger-kernel installed.
        ValueError: `liger` on a CPU tensor or with `kept`.
    """
    if head not in HEADS:
        raise KeyError(f"unknown --log-probs-head {head!r}; known: {sorted(HEADS)}")
    return HEADS[head](hidden, weight, targets, temperature, chunk_size, with_entropy, kept, compiled=compiled)
