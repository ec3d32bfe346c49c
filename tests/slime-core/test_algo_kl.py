import math

import pytest
import torch

from slime_core.algorithms import compute_approx_kl

# Tolerance: fp32 elementwise vs hand values, atol 1e-6.
LP = torch.tensor([-1.0, -2.0, -0.5, -30.0])
BASE = torch.tensor([-1.5, -1.0, -0.5, -1.0])
D = [0.5, -1.0, 0.0, -29.0]


def _k3(d):
    return math.exp(-d) - 1 + d


@pytest.mark.parametrize(
    ("kl_type", "expected"),
    [
        ("k1", D),
        ("k2", [d * d / 2 for d in D]),
        ("k3", [_k3(d) for d in D]),
        ("low_var_kl", [min(max(_k3(d), -10), 10) for d in D]),
    ],
)
def test_kl_types_by_hand(kl_type, expected):
    out = compute_approx_kl(LP, BASE, kl_type)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor(expected), atol=1e-6, rtol=1e-6)


def test_low_var_kl_is_clamped_but_k3_is_not():
    assert compute_approx_kl(LP, BASE, "low_var_kl")[3].item() == 10.0
    assert compute_approx_kl(LP, BASE, "k3")[3].item() > 1e12


def test_identical_inputs_give_zero():
    for kl_type in ("k1", "k2", "k3", "low_var_kl"):
        assert torch.equal(compute_approx_kl(LP, LP, kl_type), torch.zeros(4))


def test_importance_ratio_multiplies_before_clamp():
    ratio = torch.tensor([2.0, 0.5, 3.0, 0.1])
    out = compute_approx_kl(LP, BASE, "low_var_kl", importance_ratio=ratio)
    expected = [min(max(r * _k3(d), -10), 10) for r, d in zip(ratio.tolist(), D, strict=True)]
    torch.testing.assert_close(out, torch.tensor(expected), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(
        compute_approx_kl(LP, BASE, "k2", importance_ratio=ratio), ratio * torch.tensor([d * d / 2 for d in D])
    )


def test_k3_gradient():
    # d/dlp [exp(-d) - 1 + d] = 1 - exp(-d)
    lp = torch.tensor([-1.0, -3.0], requires_grad=True)
    base = torch.tensor([-2.0, -1.0])
    compute_approx_kl(lp, base, "k3").sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([1 - math.exp(-1.0), 1 - math.exp(2.0)]))


def test_errors():
    with pytest.raises(ValueError, match="kl-loss-type"):
        compute_approx_kl(LP, BASE, "k4")
    with pytest.raises(ValueError, match="shape"):
        compute_approx_kl(LP, BASE[:2], "k1")
