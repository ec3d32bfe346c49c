import pytest
import torch

from slime_core.algorithms import default_reducer, drgrpo, sum_of_sample_mean, sum_of_token
from slime_core.algorithms.reducers import segment_sums
from slime_core.config import SlimeArgs

# Tolerance: small fp32 sums vs hand values, atol 1e-6.
ATOL = 1e-6
LENGTHS = [3, 1, 2, 0]
MASKS = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0]), torch.tensor([0.0, 0.0]), torch.zeros(0)]
X = torch.tensor([1.0, 100.0, 3.0, 5.0, 7.0, 9.0])


# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the functions' own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def test_segment_sums():
    torch.testing.assert_close(segment_sums(X, LENGTHS), torch.tensor([104.0, 5.0, 16.0, 0.0]))
    with pytest.raises(ValueError, match="sum to"):
        segment_sums(X, [1, 1])


def test_sum_of_sample_mean_by_hand():
    # sample 0: (1 + 3)/4 (denominator 4 = its rollout's mask sum with a sibling), sample 1: 5/1,
    # sample 2 all masked → 0 (denominator 0 → clamped to 1), sample 3 empty → 0
    reduce = sum_of_sample_mean(LENGTHS, MASKS, [4.0, 1.0, 0.0, 0.0])
    assert reduce(X).item() == pytest.approx(1.0 + 5.0, abs=ATOL)


def test_sum_of_sample_mean_own_mask_is_token_mean():
    reduce = sum_of_sample_mean(LENGTHS, MASKS, [2.0, 1.0, 1.0, 1.0])
    assert reduce(X).item() == pytest.approx(2.0 + 5.0, abs=ATOL)


def test_all_masked_gives_zero_and_finite_grad():
    # non-finite values at masked positions (e.g. -inf log-prob on padding) must not leak in
    x = torch.tensor([float("-inf"), float("nan")], requires_grad=True)
    for reduce in (sum_of_sample_mean([2], [torch.zeros(2)], [0.0]), sum_of_token([2], [torch.zeros(2)])):
        out = reduce(x)
        (g,) = torch.autograd.grad(out, x)
        assert out.item() == 0.0 and torch.equal(g, torch.zeros(2))


def test_length_one_responses():
    reduce = sum_of_sample_mean([1, 1, 1], [torch.ones(1), torch.zeros(1), torch.ones(1)], [1.0, 1.0, 1.0])
    assert reduce(torch.tensor([2.0, 50.0, -0.5])).item() == pytest.approx(1.5, abs=ATOL)


def test_sum_of_token_and_default_reducer():
    assert sum_of_token(LENGTHS, MASKS)(X).item() == pytest.approx(1.0 + 3.0 + 5.0, abs=ATOL)
    assert default_reducer(True, LENGTHS, MASKS, [9.0] * 4)(X).item() == pytest.approx(9.0, abs=ATOL)
    assert default_reducer(False, LENGTHS, MASKS, [2.0, 1.0, 1.0, 1.0])(X).item() == pytest.approx(7.0, abs=ATOL)
    with pytest.raises(ValueError, match="denominators"):
        sum_of_sample_mean(LENGTHS, MASKS, [1.0])


def test_drgrpo_constant_denominator():
    args = _CONFIG.model_copy(update=dict(rollout_max_response_len=8))
    reduce = drgrpo(None, LENGTHS, MASKS, False, args=args)
    assert reduce(X).item() == pytest.approx(9.0 / 8, abs=ATOL)
    with pytest.raises(ValueError, match="rollout-max-response-len"):
        drgrpo(None, LENGTHS, MASKS, False, args=_CONFIG.model_copy(update=dict(rollout_max_response_len=None)))
    with pytest.raises(ValueError, match="per-token"):
        drgrpo(None, LENGTHS, MASKS, True, args=args)


def test_drgrpo_says_before_the_run_what_its_factory_would_refuse():
    # The app's plugin check calls it: each case below is one the factory raises on at the first train step.
    check = drgrpo.check_config
    assert check(_CONFIG.model_copy(update=dict(rollout_max_response_len=8))) == []
    (unset,) = check(_CONFIG.model_copy(update=dict(rollout_max_response_len=None)))
    assert unset == "Dr.GRPO divides by --rollout-max-response-len, which is not set"
    (per_token,) = check(_CONFIG.model_copy(update=dict(rollout_max_response_len=8, calculate_per_token_loss=True)))
    assert "drop --calculate-per-token-loss" in per_token
