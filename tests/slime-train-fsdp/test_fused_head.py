"""Tests of the `fused` log-prob head (`slime_core.algorithms.fused_head`) against the autograd heads.

References: the `fp32` head (fp32 logits, slime_core's log-softmax/entropy, autograd backward) on the same operand
values, and the `fp32out` head for the bf16 gradients (the same bf16 backward matmuls).
Tolerances: 1e-6 absolute on log-probs and entropies (same fp32 logits; only the summation order of the softmax
reductions differs); 1e-5 absolute on fp32 gradients (O(1) values; the hand-written backward sums in another
order); for bf16 operands, one bf16 ulp of the gradient's scale (2**-7 relative) against `fp32out`, whose
backward rounds the same fp32 cotangent to bf16.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from slime_core.algorithms import KeptTokens, fused_head
from slime_train_fsdp.logprob_head import head_log_probs

R, H, V = 37, 16, 50


def _inputs(dtype=torch.float32, scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(R, H, generator=g) * scale).to(dtype)
    weight = (torch.randn(V, H, generator=g) / H**0.5).to(dtype)
    targets = torch.randint(0, V, (R,), generator=g)
    a, b = torch.randn(R, generator=g), torch.randn(R, generator=g)  # cotangents of log-probs and entropies
    return hidden, weight, targets, a, b


def _run(
    head, hidden, weight, targets, a, b, *, temperature=0.7, chunk_size=8, with_entropy=True, kept=None, compiled=False
):
    """Values and gradients of `Σ a·logp + Σ b·H` (b unused without entropy; a None: the entropy term alone)."""
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    logp, ent = head_log_probs(h, w, targets, temperature=temperature, chunk_size=chunk_size,
                               with_entropy=with_entropy, head=head, kept=kept, compiled=compiled)  # fmt: skip
    loss = ent.sum() * 0 if a is None else (logp * a).sum()
    if with_entropy:
        loss = loss + (ent * b).sum()
    loss.backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


def _err(x, y) -> float:
    assert x.shape == y.shape, (x.shape, y.shape)
    return float((x.double() - y.double()).abs().max()) if x.numel() else 0.0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", [8, 5, 100])  # 37 rows: uneven splits, and one chunk
def test_fp32_operands_match_the_fp32_head(temperature, chunk_size):
    inputs = _inputs()
    got = _run("fused", *inputs, temperature=temperature, chunk_size=chunk_size)
    ref = _run("fp32", *inputs, temperature=temperature, chunk_size=chunk_size)
    assert got[0].dtype == got[1].dtype == torch.float32 and got[1].shape == (R,)
    assert _err(got[0], ref[0]) <= 1e-6 and _err(got[1], ref[1]) <= 1e-6
    assert _err(got[2], ref[2]) <= 1e-5 and _err(got[3], ref[3]) <= 1e-5
    assert float(ref[2].abs().max()) > 0.1 and float(ref[3].abs().max()) > 0.1  # gradients are not trivially 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_bf16_operands_match_fp32out(temperature):
    hidden, weight, targets, a, b = _inputs(torch.bfloat16)
    got = _run("fused", hidden, weight, targets, a, b, temperature=temperature, chunk_size=5)
    exact = _run("fp32", hidden.float(), weight.float(), targets, a, b, temperature=temperature, chunk_size=5)
    same_path = _run("fp32out", hidden, weight, targets, a, b, temperature=temperature, chunk_size=5)
    # fp32 logits from bf16 operands: the log-probs are the fp32 head's on the same bf16 values.
    assert _err(got[0], exact[0]) <= 1e-6 and _err(got[1], exact[1]) <= 1e-6
    assert got[2].dtype == torch.bfloat16 and got[3].dtype == torch.bfloat16
    for grad, ref in zip(got[2:], same_path[2:], strict=True):
        assert _err(grad, ref) <= 2**-7 * float(ref.abs().max())


@pytest.mark.parametrize("only", ["logp", "entropy"])
def test_one_cotangent_at_a_time(only):
    # Only log-probs in the loss (entropy off), or only the entropy (the log-prob cotangent is None in backward).
    hidden, weight, targets, a, b = _inputs(seed=3)
    kwargs = {"with_entropy": False} if only == "logp" else {}
    a = a if only == "logp" else None
    got = _run("fused", hidden, weight, targets, a, b, chunk_size=6, **kwargs)
    ref = _run("fp32", hidden, weight, targets, a, b, chunk_size=6, **kwargs)
    if only == "logp":
        assert got[1].shape == (0,)
    for x, y in zip(got, ref, strict=True):
        assert _err(x, y) <= 1e-5
    assert float(ref[2].abs().max()) > 0.1


def test_frozen_weight_and_no_grad():
    hidden, weight, targets, a, b = _inputs(seed=4)
    h = hidden.clone().requires_grad_()
    logp, ent = head_log_probs(h, weight, targets, temperature=0.7, chunk_size=8, with_entropy=True, head="fused")
    ((logp * a).sum() + (ent * b).sum()).backward()
    assert weight.grad is None
    assert _err(h.grad, _run("fp32", hidden, weight, targets, a, b)[2]) <= 1e-5
    with torch.no_grad():
        logp, ent = head_log_probs(hidden, weight, targets, temperature=0.7, chunk_size=8, with_entropy=True,
                                   head="fused")  # fmt: skip
    assert not logp.requires_grad and _err(logp, _run("fp32", hidden, weight, targets, a, b)[0]) <= 1e-6


def test_zero_rows():
    hidden, weight, targets, _, _ = _inputs()
    h = hidden[:0].clone().requires_grad_()
    logp, ent = head_log_probs(h, weight, targets[:0], temperature=1.0, chunk_size=4, with_entropy=True, head="fused")
    assert logp.shape == ent.shape == (0,) and logp.dtype == torch.float32
    # A zero-row chunk through the function itself: empty outputs, zero gradients of the right shapes.
    w = weight.clone().requires_grad_()
    lp, en = fused_head._FusedChunk.apply(h, w, targets[:0], 1.0, True)
    (lp.sum() + en.sum()).backward()
    assert lp.shape == en.shape == (0,) and h.grad.shape == (0, H) and float(w.grad.abs().max()) == 0.0


def test_extreme_logits_stay_finite():
    # Row 0: the target's logit is 1e30 above the rest (p = onehot, log p = 0, H = 0). Row 1: logits spanning
    # ±3e38, whose distance to the max overflows fp32 to -inf (p = 0 there: 0 * -inf must not become NaN in the
    # entropy or the gradient). No ordinary row: its exact gradient wrt h, g @ W, overflows with these W.
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    weight = torch.tensor([[1e30, 0.0], [0.0, 3e38], [-1e30, -3e38], [0.0, 1.0], [0.0, 0.5]])
    targets = torch.tensor([0, 1])
    for a in (torch.ones(2), None):  # with and without the log-prob term
        got = _run("fused", hidden, weight, targets, a, torch.ones(2), temperature=0.7, chunk_size=1)
        assert all(torch.isfinite(t).all() for t in got), got
        assert got[0].tolist() == [0.0, 0.0] and got[1].tolist() == [0.0, 0.0]
        ref = _run("fp32", hidden, weight, targets, a, torch.ones(2), temperature=0.7, chunk_size=1)
        for x, y in zip(got, ref, strict=True):
            assert torch.equal(x, y)
    # The gradient at the -inf column is exactly 0 (p = 0), not NaN.
    logits = hidden @ weight.t()
    _, m, lse, ent = fused_head._stats(logits, targets, 0.7, True)
    grad = fused_head._grad_logits(logits, targets, m, lse, ent, torch.ones(2), torch.ones(2), 0.7, torch.float32)
    assert torch.isfinite(grad).all() and float(grad[1, 2]) == 0.0


def test_top_p_replay_runs_the_fp32out_path():
    g = torch.Generator().manual_seed(5)
    sizes = torch.randint(0, 6, (R,), generator=g)
    ids = torch.cat([torch.randperm(V, generator=g)[: int(k)] for k in sizes])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    kept = KeptTokens.from_offsets([ids], [offsets])
    inputs = _inputs(seed=6)
    got = _run("fused", *inputs, kept=kept)
    ref = _run("fp32out", *inputs, kept=kept)
    for x, y in zip(got, ref, strict=True):
        assert torch.equal(x, y)


def test_unset_chunk_size_is_one_default_for_both_backends():
    # --log-probs-chunk-size -1 (the default) chunks by 1024 rows under FSDP and Megatron alike; it never means
    # "no chunking". Both backends resolve the flag through this one function.
    assert fused_head.DEFAULT_CHUNK == 1024
    assert [fused_head.resolve_chunk_size(c) for c in (-1, 0, 1, 7, 4096)] == [1024, 1024, 1, 7, 4096]


def test_bad_input_is_named():
    hidden, weight, targets, _, _ = _inputs()
    with pytest.raises(ValueError, match="--rollout-temperature"):
        fused_head.fused_log_probs(hidden, weight, targets, 0.0, 8, True)
    with pytest.raises(ValueError, match="--log-probs-chunk-size"):
        fused_head.fused_log_probs(hidden, weight, targets, 1.0, 0, True)
    with pytest.raises(ValueError, match=r"targets must be \[R\]"):
        fused_head.fused_log_probs(hidden, weight, targets[:3], 1.0, 8, True)


def test_fsdp_backend_compiles_the_head_with_the_layers():
    from slime_core.config import SlimeArgs
    from slime_train_fsdp.model_loading import _forward_options

    base = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp", "log_probs_head": "fused"}
    opts = _forward_options(SlimeArgs.from_dict({**base, "fsdp_compile_layers": False}), torch.device("cuda"),
                            "slime_varlen", False)  # fmt: skip
    assert opts.head == "fused" and opts.compile_head is False
    opts = _forward_options(SlimeArgs.from_dict(base), torch.device("cuda"), "slime_varlen", False)
    assert opts.compile_head is True  # compiled layers by default on CUDA
    default = {k: v for k, v in base.items() if k != "log_probs_head"}
    opts = _forward_options(SlimeArgs.from_dict(default), torch.device("cuda"), "slime_varlen", False)
    assert opts.head == "fused" and opts.compile_head is True  # the CUDA default head
    opts = _forward_options(SlimeArgs.from_dict(default), torch.device("cpu"), "sdpa", False)
    assert opts.head == "fp32" and opts.compile_head is False


@pytest.mark.gpu
def test_compiled_fused_head_on_cuda_matches_fp32out():
    # The GPU path: bf16 operands, torch.mm with fp32 output, both elementwise functions compiled by inductor.
    # Same logits as fp32out (the same kernel); gradients within 2 bf16 ulps of their scale (a rounding of
    # grad_logits that lands on the other side of a bf16 value moves a sum by one ulp of that term).
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator().manual_seed(7)
    rows, hidden_size, vocab = 300, 64, 1000
    hidden = torch.randn(rows, hidden_size, generator=g).cuda().bfloat16()
    weight = (torch.randn(vocab, hidden_size, generator=g) / 4).cuda().bfloat16()
    targets = torch.randint(0, vocab, (rows,), generator=g).cuda()
    a, b = torch.randn(rows, generator=g).cuda(), torch.randn(rows, generator=g).cuda()
    for temperature in (1.0, 0.7):
        # `compiled=True` is what the FSDP backend passes on CUDA with compiled layers (`ForwardOptions.compile_head`).
        got = _run("fused", hidden, weight, targets, a, b, temperature=temperature, chunk_size=128, compiled=True)
        ref = _run("fp32out", hidden, weight, targets, a, b, temperature=temperature, chunk_size=128)
        assert _err(got[0], ref[0]) <= 1e-5 and _err(got[1], ref[1]) <= 1e-5
        for grad, expected in zip(got[2:], ref[2:], strict=True):
            assert grad.dtype == torch.bfloat16 and _err(grad, expected) <= 2**-6 * float(expected.abs().max())
    assert fused_head._compiled.cache_info().currsize == 2  # both functions went through torch.compile


_COMPILED_CHECK = """
import json, torch
from slime_core.algorithms import fused_head as fh

def run(hidden, weight, targets, a, b, temperature):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = fh.fused_log_probs(h, w, targets, temperature, 8, True)
    ((logp * a).sum() + (ent * b).sum()).backward()
    return logp.detach(), ent.detach(), h.grad, w.grad

g = torch.Generator().manual_seed(0)
hidden, weight = torch.randn(21, 16, generator=g), torch.randn(50, 16, generator=g) / 4
hidden[:, 15], weight[:, 15] = 0.0, 0.0
hidden[0, 15], weight[1, 15] = 1e3, -1e36  # row 0's logit of token 1 overflows to -inf (see test_extreme_logits)
targets = torch.randint(2, 50, (21,), generator=g)
a, b = torch.randn(21, generator=g), torch.randn(21, generator=g)
eager = run(hidden, weight, targets, a, b, 0.7)
fh._maybe_compiled = lambda fn, device, compiled: fh._compiled(fn)  # what CUDA runs: 21 rows = chunks of 8, 8 and 5
compiled = run(hidden, weight, targets, a, b, 0.7)
finite = all(bool(torch.isfinite(t).all()) for t in compiled)
print(json.dumps([finite] + [float(((x - y).abs() / (1 + y.abs())).max()) for x, y in zip(eager, compiled)]))
"""


def test_compiled_head_matches_eager_on_cpu():
    # Inductor's CPU backend builds C++; about 30-45 s cold on a 2-core CI machine. Skipped only where no compiler
    # exists; a slow compile is not a reason to skip (the bound is a hang guard far above the normal time).
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler for inductor's CPU backend")
    proc = subprocess.run([sys.executable, "-c", _COMPILED_CHECK], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    finite, *errs = json.loads(proc.stdout.strip().splitlines()[-1])
    # log-probs, entropies, grad h, grad W of the whole head; relative error, |grad h| reaches 1e35 here
    assert finite and max(errs) <= 1e-5, errs


def test_the_compiled_head_functions_are_lowered_once_per_process():
    """The float temperature made dynamo restart each function's analysis after a first pass through AOT autograd
    (`specialize_float` off, torch's default without --megatron-compile-layers): two lowerings per process. Counted
    with an AOT-autograd backend on CPU (the same trace as inductor's, without code generation)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    lowered = []

    def counting(gm, example_inputs):
        lowered.append(gm)
        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)

    # As a process without compiled layers. torch's own patch: pytest's monkeypatch restores a torch config entry by
    # deleting it (it was not in the module's __dict__), which hides it, and every later compile in the process failed.
    with torch._dynamo.config.patch(specialize_float=False):
        torch._dynamo.reset()
        stats = fused_head._compiled(fused_head._stats, backend=counting)
        g = torch.Generator().manual_seed(3)
        for rows in (5, 7, 9):  # chunk rows vary; dynamic shapes keep one graph
            logits = torch.randn(rows, 11, generator=g)
            targets = torch.randint(0, 11, (rows,), generator=g)
            logp, m, lse, entropy = stats(logits, targets, 0.7, True)
            ref_logp, *_ = fused_head._stats(logits, targets, 0.7, True)
            torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=0)
        assert len(lowered) == 1  # was 2
        assert torch._dynamo.config.specialize_float is False  # only the head's trace saw it on
    torch._dynamo.reset()
