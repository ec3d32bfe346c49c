"""Dynamic-sampling filters."""

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.protocols import DynamicFilterOutput
from slime_core.sample import Sample
from slime_rollout.generation.filters import check_reward_nonzero_std, normalize_filter_output
from slime_rollout.plugins import load_function


def _args(**fields):
    return PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields}))


def _group(*rewards):
    return [Sample(reward=r) for r in rewards]


def test_check_reward_nonzero_std():
    args = _args(reward_key=None)
    assert check_reward_nonzero_std(args, _group(1.0, 0.0, 1.0)).keep is True
    out = check_reward_nonzero_std(args, _group(1.0, 1.0, 1.0))
    assert out == DynamicFilterOutput(keep=False, reason="zero_std_1.0")
    assert check_reward_nonzero_std(args, _group(0.0, 0.0)).reason == "zero_std_0.0"
    assert check_reward_nonzero_std(args, _group(0.5)).keep is False  # a single sample has no spread
    dict_args = _args(reward_key="score")
    assert check_reward_nonzero_std(dict_args, _group({"score": 1.0}, {"score": -1.0})).keep is True
    with pytest.raises(ValueError, match="--reward-key"):
        check_reward_nonzero_std(args, _group({"score": 1.0}, {"score": 1.0}))


def test_original_path_alias_and_bool_outputs():
    fn = load_function("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std")
    assert fn is check_reward_nonzero_std
    assert normalize_filter_output(True) == DynamicFilterOutput(keep=True)
    assert normalize_filter_output(False) == DynamicFilterOutput(keep=False, reason="filtered")
    with pytest.raises(TypeError, match="DynamicFilterOutput or bool"):
        normalize_filter_output(None)


def test_fan_out_groups_are_flattened():
    # Issue 17: a multi-turn fan-out makes a group's entries lists of samples; this used to raise AttributeError.
    args = _args(reward_key=None)
    fan_out = [_group(1.0, 1.0), _group(0.0), Sample(reward=1.0)]
    assert check_reward_nonzero_std(args, fan_out).keep is True
    same = [_group(1.0, 1.0), _group(1.0)]
    assert check_reward_nonzero_std(args, same) == DynamicFilterOutput(keep=False, reason="zero_std_1.0")


def test_a_numpy_or_tensor_bool_is_a_verdict():
    # `np.std(rewards) > 0` is an np.bool_, which the original's DynamicFilterOutput(keep=output) takes; refused here.
    import numpy as np
    import torch

    assert normalize_filter_output(np.bool_(True)) == DynamicFilterOutput(keep=True)
    assert normalize_filter_output(np.std([1.0, 1.0]) > 0) == DynamicFilterOutput(keep=False, reason="filtered")
    assert normalize_filter_output(torch.tensor(True)) == DynamicFilterOutput(keep=True)
    with pytest.raises(TypeError, match="DynamicFilterOutput or bool, got float"):
        normalize_filter_output(np.float64(1.0))


def test_rounding_noise_is_zero_spread_as_in_the_original():
    # The original keeps a group when torch.tensor(rewards, float64).std() > 1e-6 (Bessel's std). Rewards equal but
    # for float rounding (0.1 + 0.2 vs 0.3: a weighted sum of scores, a reward model's float32 output) have a spread of
    # ~3e-17; a `> 0` test kept them, so a group whose GRPO advantages are ~1e-11 took a place in the batch.
    args = _args(reward_key=None)
    noisy = _group(0.1 + 0.2, 0.3, 0.3, 0.3)
    assert check_reward_nonzero_std(args, noisy) == DynamicFilterOutput(keep=False, reason="zero_std_0.3")
    # Just below and above the threshold (Bessel's std of [0, d] is d / sqrt(2)).
    assert check_reward_nonzero_std(args, _group(0.0, 1.4e-6)).keep is False  # std 9.9e-7
    assert check_reward_nonzero_std(args, _group(0.0, 1.5e-6)).keep is True  # std 1.06e-6


def _drop_the_lowest(args, samples):
    samples.remove(min(samples, key=lambda s: s.reward))
    return True


def test_a_filter_that_edits_its_sample_list_is_refused_naming_it():
    import asyncio

    from slime_rollout.generation.filters import call_dynamic_filter

    # Before: the filter got a flat copy, so removing a sample kept the whole group for training and said nothing (the
    # original shrinks the trained group). Now one error names the filter and the change.
    args = _args(dynamic_sampling_filter_path=f"{__name__}._drop_the_lowest")
    group = [Sample(index=0, reward=1.0), [Sample(index=1, reward=0.0), Sample(index=2, reward=0.5)]]
    with pytest.raises(ValueError, match=r"_drop_the_lowest on samples \[0, 1, 2\]: the filter changed .* \(3 -> 2"):
        asyncio.run(call_dynamic_filter(args, _drop_the_lowest, group))
    assert asyncio.run(call_dynamic_filter(args, check_reward_nonzero_std, group)).keep is True
