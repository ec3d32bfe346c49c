"""A reward function's value is converted under the reward deadline, off the event loop (issue 27 #12, round 5).

A returned object's `__float__`, `items()` or `__iter__` is the plugin's code: before, `checked_reward` ran it on
the event loop, so one that never returned froze the rollout with no word and no deadline. Here the slow methods
sleep 5 s (far past the 0.6 s deadline) so that the old code fails the test instead of hanging it.
"""

import asyncio
import time

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.rewards import async_rm, batched_async_rm
from slime_rollout.rewards.checks import RewardFunctionError

HOSTILE_REWARDS = """
import numbers
import time


class SlowFloat(float):
    def __float__(self):
        time.sleep(5)
        return 1.0


class RaisingReal:
    def __float__(self):
        raise ZeroDivisionError("no value yet")

    def __repr__(self):
        return "RaisingReal()"


numbers.Real.register(RaisingReal)


class SlowDict(dict):
    def items(self):
        time.sleep(5)
        return super().items()


class SlowList(list):
    def __iter__(self):
        time.sleep(5)
        return super().__iter__()


class Score(float):
    pass


async def slow_float(args, sample):
    return SlowFloat(1.0)


def slow_float_sync(args, sample):
    return SlowFloat(1.0)


async def raising_real(args, sample):
    return RaisingReal()


async def slow_dict(args, sample):
    return SlowDict(score=1.0)


async def slow_group(args, samples):
    return SlowList([1.0] * len(samples))


async def subclassed(args, sample):
    return {"score": Score(0.5), "nested": [Score(2.0)]}


async def huge(args, sample):
    return 10**5000
"""


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    (tmp_path / "hostile_rewards.py").write_text(HOSTILE_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "hostile_rewards"


def _args(**fields):
    base = {"rollout_batch_size": 1, "num_rollout": 1, "rm_timeout_secs": 0.6, "slow_call_warning_secs": 0.2}
    return PluginArgs.from_config(SlimeArgs.from_dict({**base, **fields}))


async def _ticking(work):
    """Runs `work`, counting 50 ms ticks of the event loop meanwhile: (outcome or exception, ticks, seconds)."""
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    start = time.monotonic()
    try:
        outcome = await work
    except Exception as e:
        outcome = e
    ticker.cancel()
    return outcome, ticks, time.monotonic() - start


@pytest.mark.parametrize("fn", ["slow_float", "slow_float_sync", "slow_dict"])
async def test_a_conversion_that_never_returns_fails_at_the_deadline_naming_plugin_and_sample(hostile, fn):
    path = f"{hostile}.{fn}"
    outcome, ticks, elapsed = await _ticking(async_rm(_args(custom_rm_path=path), Sample(response="x", index=7)))
    assert isinstance(outcome, RewardFunctionError), outcome  # was 1.0 after the loop froze for 5 s
    assert str(outcome) == (
        f"reward function --custom-rm-path {path} on sample 7 did not finish within 0.6 s (--rm-timeout-secs); "
        "cancelled"
    )
    assert elapsed < 4.0 and ticks >= 5, (elapsed, ticks)  # the loop ran on meanwhile


async def test_a_group_reward_list_that_never_iterates_fails_at_the_deadline(hostile):
    samples = [Sample(response="x", index=i) for i in (3, 4)]
    args = _args(custom_rm_path=f"{hostile}.slow_group", group_rm=True)
    outcome, ticks, elapsed = await _ticking(batched_async_rm(args, samples))
    assert isinstance(outcome, RewardFunctionError), outcome
    assert "on samples [3, 4] did not finish within 0.6 s (--rm-timeout-secs)" in str(outcome)
    assert elapsed < 4.0 and ticks >= 5, (elapsed, ticks)


async def test_a_conversion_that_raises_names_plugin_sample_and_error(hostile):
    path = f"{hostile}.raising_real"
    with pytest.raises(RewardFunctionError) as e:
        await async_rm(_args(custom_rm_path=path), Sample(response="x", index=7))
    assert str(e.value) == (
        f"--custom-rm-path {path} returned a RaisingReal whose conversion raised ZeroDivisionError: no value yet "
        "for sample 7"
    )  # was a bare ZeroDivisionError from checks.py, naming neither


async def test_a_reward_too_large_for_str_names_plugin_and_sample(hostile):
    with pytest.raises(RewardFunctionError, match=r"\.huge returned a reward too large for a float \(over 4300 "
                       r"digits\) for sample 7"):  # fmt: skip
        await async_rm(_args(custom_rm_path=f"{hostile}.huge"), Sample(response="x", index=7))  # was ValueError


async def test_a_converted_reward_is_plain_builtins(hostile):
    out = await async_rm(_args(custom_rm_path=f"{hostile}.subclassed"), Sample(response="x", index=1))
    assert out == {"score": 0.5, "nested": [2.0]}
    assert type(out["score"]) is float and type(out["nested"][0]) is float  # no plugin class left to call later


def test_plain_reward_keeps_values_and_refuses_objects():
    from slime_rollout.rewards.checks import plain_reward

    assert plain_reward({"score": 1, "pred": "x", "acc": True, "none": None, "t": (1.5, "a")}) == {
        "score": 1, "pred": "x", "acc": True, "none": None, "t": (1.5, "a"),
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"a score of type object at 'meta', not a number, string, list or dict"):
        plain_reward({"score": 1.0, "meta": object()})


ARRAY_REWARDS = """
import numpy as np
import torch


async def numpy_bool(args, sample):
    return np.isclose(float(sample.response), 2.0)


async def tensor_score(args, sample):
    return {"score": torch.tensor(0.25), "acc": np.bool_(False)}


async def nan_tensor(args, sample):
    return torch.tensor(float("nan"))


async def group_array(args, samples):
    return np.array([0.5] * len(samples))


async def group_tensor(args, samples):
    return torch.tensor([1.0, 0.0])
"""


@pytest.fixture
def arrays(tmp_path, monkeypatch):
    (tmp_path / "array_rewards.py").write_text(ARRAY_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "array_rewards"


async def test_numpy_and_tensor_scalars_are_rewards_as_in_the_original(arrays):
    # The original puts rewards into torch.tensor(...), which takes np.bool_ and 0-d tensors; refused here before.
    out = await async_rm(_args(custom_rm_path=f"{arrays}.numpy_bool"), Sample(response="2.0", index=1))
    assert out is True
    out = await async_rm(_args(custom_rm_path=f"{arrays}.tensor_score"), Sample(response="x", index=1))
    assert out == {"score": 0.25, "acc": False} and type(out["score"]) is float and type(out["acc"]) is bool
    with pytest.raises(RewardFunctionError, match=r"array_rewards.nan_tensor returned a non-finite reward \(nan\)"):
        await async_rm(_args(custom_rm_path=f"{arrays}.nan_tensor"), Sample(response="x", index=3))


async def test_a_group_reward_may_be_a_1d_array_or_tensor(arrays):
    samples = [Sample(response="x", index=i) for i in range(2)]
    args = _args(custom_rm_path=f"{arrays}.group_array", group_rm=True)
    assert await batched_async_rm(args, samples) == [0.5, 0.5]
    args = _args(custom_rm_path=f"{arrays}.group_tensor", group_rm=True)
    assert await batched_async_rm(args, samples) == [1.0, 0.0]
    with pytest.raises(RewardFunctionError, match="must return a list of 3 rewards"):
        await batched_async_rm(args, samples + [Sample(response="x", index=2)])


def test_arrays_of_scores_inside_a_reward_dict_become_lists():
    # `{"score": 1.0, "probs": np.array([...])}` was refused ("a score of type ndarray"); non-finite ones still are.
    import numpy as np
    import torch

    from slime_rollout.rewards.checks import NotAReward, plain_reward

    out = plain_reward({"score": 1.0, "probs": np.array([0.25, 0.75]), "ids": torch.tensor([[1, 2]])})
    assert out == {"score": 1.0, "probs": [0.25, 0.75], "ids": [[1.0, 2.0]]}
    with pytest.raises(NotAReward, match=r"a non-finite score \(nan\) at 'probs'\[1\]"):
        plain_reward({"score": 1.0, "probs": np.array([0.5, np.nan])})
