import math

import pytest
import torch

from slime_core.algorithms import entropy_from_logits, log_probs_from_logits

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
