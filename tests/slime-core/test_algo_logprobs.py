import math

import pytest
import torch

from slime_core.algorithms import entropy_from_logits, log_probs_and_entropy_from_logits, log_probs_from_logits

# Tolerances: fp32 math on small tensors, compared to torch/closed-form references: atol 1e-5.
ATOL = 1e-5


def _ref_log_probs(logits, ids, temperature):
    return torch.log_softmax(logits.double() / temperature, -1).gather(-1, ids[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_log_probs_match_log_softmax_gather(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 11, generator=g) * 3
    ids = torch.randint(0, 11, (7,), generator=g)
    out = log_probs_from_logits(logits, ids, temperature=temperature)
    assert out.dtype == torch.float32 and out.shape == (7,)
    torch.testing.assert_close(out.double(), _ref_log_probs(logits, ids, temperature), atol=ATOL, rtol=0)


def test_log_probs_hand_value():
    # logits [0, ln 3] → p = [1/4, 3/4]; at T=2: z=[0, ln3/2] → p1 = sqrt3/(1+sqrt3).
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    ids = torch.tensor([1, 0])
    out = log_probs_from_logits(logits, ids)
    torch.testing.assert_close(out, torch.tensor([math.log(0.75), math.log(0.25)]), atol=ATOL, rtol=0)
    out_t2 = log_probs_from_logits(logits[:1], ids[:1], temperature=2.0)
    s3 = math.sqrt(3.0)
    assert out_t2.item() == pytest.approx(math.log(s3 / (1 + s3)), abs=ATOL)


def test_bf16_logits_computed_in_fp32():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(5, 300, generator=g) * 4).bfloat16()
    ids = torch.randint(0, 300, (5,), generator=g)
    out = log_probs_from_logits(logits, ids)
    assert out.dtype == torch.float32
    # reference on the same (bf16-rounded) values in fp64
    torch.testing.assert_close(out.double(), _ref_log_probs(logits.double(), ids, 1.0), atol=ATOL, rtol=0)


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 100])
def test_chunked_equals_unchunked_values_and_grads(chunk_size):
    g = torch.Generator().manual_seed(2)
    base = torch.randn(10, 13, generator=g)
    ids = torch.randint(0, 13, (10,), generator=g)
    weights = torch.randn(10, generator=g)

    def run(chunk):
        logits = base.clone().requires_grad_(True)
        lp = log_probs_from_logits(logits, ids, temperature=0.8, chunk_size=chunk)
        ent = entropy_from_logits(logits, temperature=0.8, chunk_size=chunk)
        ((lp * weights).sum() + ent.sum()).backward()
        return lp.detach(), ent.detach(), logits.grad

    lp_full, ent_full, grad_full = run(None)
    lp_c, ent_c, grad_c = run(chunk_size)
    torch.testing.assert_close(lp_c, lp_full, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent_c, ent_full, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad_c, grad_full, atol=1e-6, rtol=0)


def test_log_prob_gradient_is_onehot_minus_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    log_probs_from_logits(logits, torch.tensor([2]), temperature=2.0).sum().backward()
    p = torch.softmax(torch.tensor([1.0, 2.0, 0.5]) / 2.0, -1)
    expected = (torch.tensor([0.0, 0.0, 1.0]) - p) / 2.0  # d/dz of log softmax(z/T)[y]
    torch.testing.assert_close(logits.grad[0], expected, atol=ATOL, rtol=0)


def test_entropy_closed_form():
    # uniform over V → log V; one-hot-ish (huge gap) → ~0; two-point [p, 1-p] → binary entropy.
    v = 8
    p = 0.2
    logits = torch.stack(
        [
            torch.zeros(v),
            torch.tensor([1000.0] + [0.0] * (v - 1)),
            torch.tensor([math.log(p), math.log(1 - p)] + [-1e4] * (v - 2)),
        ]
    )
    h = entropy_from_logits(logits)
    expected = torch.tensor([math.log(v), 0.0, -(p * math.log(p) + (1 - p) * math.log(1 - p))])
    torch.testing.assert_close(h, expected, atol=ATOL, rtol=0)
    assert torch.isfinite(h).all()


def test_entropy_vs_definition_with_temperature():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 9, generator=g) * 5
    probs = torch.softmax(logits.double() / 1.5, -1)
    expected = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(entropy_from_logits(logits, temperature=1.5).double(), expected, atol=ATOL, rtol=0)


def test_empty_and_bad_inputs():
    assert log_probs_from_logits(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long)).shape == (0,)
    assert entropy_from_logits(torch.zeros(0, 5)).shape == (0,)
    with pytest.raises(ValueError, match="temperature"):
        log_probs_from_logits(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), temperature=0.0)
    with pytest.raises(ValueError, match=r"\[T, V\]"):
        entropy_from_logits(torch.zeros(3))
    with pytest.raises(ValueError, match="target_ids"):
        log_probs_from_logits(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(torch.zeros(2, 3), chunk_size=0)


# ---- large logits (issue 17): the row max is subtracted before anything else ---------------------------------

# The fp64 reference on the same fp32 inputs; fp32 math on the shifted logits keeps both errors near 1e-6 for
# any offset (before the fix the entropy at offset 1e3 was off by 0.03 nats, at 1e4 by 4.9).
LARGE_ATOL = 2e-5


def _ref_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    lp = torch.log_softmax(logits.double() / temperature, -1)
    return -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("offset, scale", [(1e3, 1.0), (1e3, 3.0), (1e4, 5.0), (-3e4, 2.0)])
def test_large_logits_entropy_and_log_probs_match_fp64(offset, scale):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(16, 4096, generator=g) * scale + offset
    ids = torch.randint(0, 4096, (16,), generator=g)
    h = entropy_from_logits(logits, temperature=0.7)
    torch.testing.assert_close(h.double(), _ref_entropy(logits, 0.7), atol=LARGE_ATOL, rtol=0)
    lp = log_probs_from_logits(logits, ids, temperature=0.7)
    torch.testing.assert_close(lp.double(), _ref_log_probs(logits, ids, 0.7), atol=LARGE_ATOL, rtol=0)


def test_extreme_finite_logits_stay_finite_with_finite_gradients():
    # Logits near the fp32 maximum with T < 1: dividing first would overflow to inf (NaN softmax); the distance
    # between +3e38 and -3e38 overflows fp32 itself, which must give p = 0, not NaN.
    big = torch.finfo(torch.float32).max / 1.2
    logits = torch.tensor([[big, big * 0.5, 0.0, -big], [big, big, big, big]], requires_grad=True)
    ids = torch.tensor([0, 2])
    lp = log_probs_from_logits(logits, ids, temperature=0.5)
    h = entropy_from_logits(logits, temperature=0.5)
    # Row 0: one token holds all the mass → log p = 0, H = 0; row 1: uniform over 4 → log p = -ln 4, H = ln 4.
    torch.testing.assert_close(lp, torch.tensor([0.0, -math.log(4.0)]), atol=ATOL, rtol=0)
    torch.testing.assert_close(h, torch.tensor([0.0, math.log(4.0)]), atol=ATOL, rtol=0)
    (lp.sum() + h.sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_bf16_large_logits_entropy():
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(8, 1000, generator=g) * 4 + 2000).bfloat16()
    torch.testing.assert_close(
        entropy_from_logits(logits).double(), _ref_entropy(logits.double()), atol=LARGE_ATOL, rtol=0
    )


def test_combined_function_matches_the_separate_ones():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(5, 50, generator=g) * 3 + 500
    ids = torch.randint(0, 50, (5,), generator=g)
    lp, h = log_probs_and_entropy_from_logits(logits, ids, 1.3, with_entropy=True)
    torch.testing.assert_close(lp, log_probs_from_logits(logits, ids, 1.3), atol=1e-6, rtol=0)
    torch.testing.assert_close(h, entropy_from_logits(logits, 1.3), atol=1e-6, rtol=0)
    lp_only, none = log_probs_and_entropy_from_logits(logits, ids, 1.3, with_entropy=False)
    assert none.shape == (0,) and torch.equal(lp_only, lp)
