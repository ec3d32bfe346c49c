"""Tests of the log-prob/entropy heads against an fp64 reference written here.

Reference: `log p = log_softmax((h W^T) / T)[target]`, `H = -Σ p log p`, in fp64 with fp64 autograd.
Tolerances: 1e-5 absolute for fp32-computing heads (`fp32`, `tf32` — TF32 is a CUDA-only mode, so on CPU it is
fp32 — and `bf16` given fp32 inputs, as on CPU), on values and on gradients; 5e-2 absolute for `bf16` given
bf16 inputs (bf16 logits carry 8 mantissa bits; logits here are O(1)).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from slime_train_fsdp.logprob_head import HEADS, default_head, head_log_probs

TOL = 1e-5
TEMPERATURE = 0.7
R, H, V = 37, 16, 50


def _inputs(scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(R, H, generator=g) * scale
    weight = torch.randn(V, H, generator=g) / H**0.5
    targets = torch.randint(0, V, (R,), generator=g)
    a, b = torch.randn(R, generator=g), torch.randn(R, generator=g)  # cotangents of log-probs and entropies
    return hidden, weight, targets, a, b


def _reference(hidden, weight, targets, a, b):
    h = hidden.double().requires_grad_()
    w = weight.double().requires_grad_()
    logp_all = torch.log_softmax((h @ w.t()) / TEMPERATURE, dim=-1)
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    ((logp * a).sum() + (ent * b).sum()).backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


def _run(head, hidden, weight, targets, a, b, chunk_size=8):
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    logp, ent = head_log_probs(h, w, targets, temperature=TEMPERATURE, chunk_size=chunk_size, with_entropy=True,
                               head=head)  # fmt: skip
    ((logp * a.to(logp.dtype)).sum() + (ent * b.to(ent.dtype)).sum()).backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


def _max_err(got, expected) -> float:
    return max(float((x.double() - y).abs().max()) for x, y in zip(got, expected, strict=True))


@pytest.mark.parametrize("head", ["fp32", "tf32", "fp32out", "fused", "bf16"])
def test_fp32_inputs_match_fp64_reference(head):
    inputs = _inputs()
    assert _max_err(_run(head, *inputs), _reference(*inputs)) <= TOL


def test_bf16_head_on_bf16_inputs_is_close():
    hidden, weight, targets, a, b = _inputs()
    got = _run("bf16", hidden.bfloat16(), weight.bfloat16(), targets, a, b)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32  # softmax math in fp32
    assert _max_err(got[:2], _reference(hidden, weight, targets, a, b)[:2]) <= 5e-2


def test_fp32out_head_on_bf16_inputs_has_fp32_logits():
    # bf16 operands: the fp32out head's log-probs are the fp32 head's on the same bf16 values (fp32 accumulation,
    # fp32 logits), unlike the bf16 head's; its gradients are bf16 matmuls (bf16 tolerance).
    hidden, weight, targets, a, b = _inputs()
    hb, wb = hidden.bfloat16(), weight.bfloat16()
    got = _run("fp32out", hb, wb, targets, a, b)
    exact = _reference(hb.float(), wb.float(), targets, a, b)
    assert got[0].dtype == torch.float32
    assert _max_err(got[:2], exact[:2]) <= TOL
    assert _max_err(_run("bf16", hb, wb, targets, a, b)[:2], exact[:2]) > 10 * TOL  # what fp32 logits buy
    assert got[2].dtype == torch.bfloat16 and got[3].dtype == torch.bfloat16
    for grad, ref in zip(got[2:], exact[2:], strict=True):  # relative to the gradient's scale: bf16 has 8 bits
        assert float((grad.double() - ref).abs().max()) <= 2e-2 * float(ref.abs().max())


@pytest.mark.gpu
def test_fp32out_head_on_cuda_matches_fp32_head():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    hidden, weight, targets, a, b = (t.cuda() for t in _inputs(seed=2))
    hb, wb = hidden.bfloat16(), weight.bfloat16()
    got = _run("fp32out", hb, wb, targets, a, b)
    exact = _run("fp32", hb.float(), wb.float(), targets, a, b)
    assert _max_err(got[:2], [t.double() for t in exact[:2]]) <= TOL


def test_chunk_size_does_not_change_results():
    inputs = _inputs(seed=1)
    whole = _run("tf32", *inputs, chunk_size=1000)
    for chunk in (1, 5):
        assert (
            _max_err(_run("tf32", *inputs, chunk_size=chunk), [t.double() for t in whole]) <= TOL
        )  # weight grads sum chunks


def test_entropy_is_stable_for_large_logits():
    # Logits of magnitude ~1e3: no overflow, and no cancellation error that grows with |z|.
    inputs = _inputs(scale=300.0, seed=2)
    logp, ent, _, _ = _run("tf32", *inputs)
    ref_logp, ref_ent, _, _ = _reference(*inputs)
    assert torch.isfinite(ent).all() and torch.isfinite(logp).all()
    assert float((ent.double() - ref_ent).abs().max()) <= 1e-4
    assert float(((logp.double() - ref_logp) / ref_logp.abs().clamp_min(1.0)).abs().max()) <= 1e-5


def test_no_grad_and_empty_and_without_entropy():
    hidden, weight, targets, _, _ = _inputs()
    with torch.no_grad():
        logp, ent = head_log_probs(hidden, weight, targets, temperature=1.0, chunk_size=4, with_entropy=False,
                                   head="bf16")  # fmt: skip
    assert logp.shape == (R,) and ent.numel() == 0
    for head in ("fp32", "tf32", "fused", "bf16"):
        logp, ent = head_log_probs(hidden[:0], weight, targets[:0], temperature=1.0, chunk_size=4,
                                   with_entropy=True, head=head)  # fmt: skip
        assert logp.shape == (0,) and ent.shape == (0,) and logp.dtype == torch.float32


def test_unknown_head_and_defaults():
    hidden, weight, targets, _, _ = _inputs()
    with pytest.raises(KeyError, match="known"):
        head_log_probs(hidden, weight, targets, temperature=1.0, chunk_size=4, with_entropy=False, head="fp8")
    assert default_head(torch.device("cpu")) == "fp32"
    assert set(HEADS) == {"fp32", "tf32", "fp32out", "fused", "bf16", "liger"}


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed")
def test_liger_head_without_liger_kernel_says_so():
    hidden, weight, targets, _, _ = _inputs()
    with pytest.raises(ImportError, match="pip install liger-kernel"):
        head_log_probs(hidden, weight, targets, temperature=1.0, chunk_size=4, with_entropy=False, head="liger")


def _random_kept(seed: int = 1):
    from slime_core.algorithms import KeptTokens

    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, 6, (R,), generator=g)
    ids = torch.cat([torch.randperm(V, generator=g)[: int(k)] for k in sizes])
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    nuclei = [ids[offsets[t] : offsets[t + 1]].tolist() for t in range(R)]
    return KeptTokens.from_offsets([ids], [offsets]), nuclei


@pytest.mark.parametrize("head", ["fp32", "tf32", "fp32out", "fused", "bf16"])  # fused: through the fp32out path
@pytest.mark.parametrize("chunk_size", [5, 64])
def test_top_p_replay_matches_a_dense_reference(head, chunk_size):
    # log p = z[y] - logsumexp over (kept ids ∪ {y}); entropy stays that of the full softmax (as the original).
    hidden, weight, targets, a, b = _inputs()
    kept, nuclei = _random_kept()
    h, w = hidden.double().requires_grad_(), weight.double().requires_grad_()
    z = (h @ w.t()) / TEMPERATURE
    ref_lp = torch.stack(
        [z[t, targets[t]] - torch.logsumexp(z[t, sorted(set(n) | {int(targets[t])})], -1) for t, n in enumerate(nuclei)]
    )
    logp_all = torch.log_softmax(z, -1)
    ref_ent = -(logp_all.exp() * logp_all).sum(-1)
    ((ref_lp * a).sum() + (ref_ent * b).sum()).backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = head_log_probs(h2, w2, targets, temperature=TEMPERATURE, chunk_size=chunk_size, with_entropy=True,
                             head=head, kept=kept)  # fmt: skip
    ((lp * a).sum() + (ent * b).sum()).backward()
    got = (lp.detach(), ent.detach(), h2.grad, w2.grad)
    assert _max_err(got, (ref_lp.detach(), ref_ent.detach(), h.grad, w.grad)) <= TOL


def test_liger_head_refuses_top_p_replay():
    kept, _ = _random_kept()
    hidden, weight, targets, _, _ = _inputs()
    with pytest.raises(ValueError) as e:
        head_log_probs(hidden, weight, targets, temperature=1.0, chunk_size=8, with_entropy=False, head="liger",
                       kept=kept)  # fmt: skip
    # Every other head replays the sets (test_top_p_replay_matches_a_dense_reference): all of them are named.
    assert str(e.value) == (
        "--log-probs-head liger computes the full softmax and cannot replay the engine's top-p sets "
        "(--rollout-top-p < 1): use --log-probs-head fp32, tf32, fp32out, bf16 or fused"
    )
