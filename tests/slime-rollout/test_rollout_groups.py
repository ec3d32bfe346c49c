"""Groups a custom generate function shapes: multi-turn fan-out through the dynamic filter, empty responses.

Issue 17: the dynamic-sampling filter failed with AttributeError on a group whose entries are lists of samples,
and an empty response from a custom generate function was trained on silently.
"""

import dataclasses
import logging

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.generation import generate as generate_mod
from slime_rollout.generation.rollout import generate_rollout_async
from slime_rollout.rewards.checks import RewardFunctionError

A, B = ord("A"), ord("B")


class _NoEngine:
    """The custom generate functions below never call an engine; the rollout only aborts leftovers."""

    async def abort_all(self):
        return None


class _DataSource:
    def __init__(self, n):
        self.n, self.next_index, self.next_group = n, 0, 0

    def get_samples(self, num_groups):
        groups = []
        for _ in range(num_groups):
            group = []
            for _ in range(self.n):
                group.append(Sample(prompt="p", tokens=[1], group_index=self.next_group, index=self.next_index))
                self.next_index += 1
            self.next_group += 1
            groups.append(group)
        return groups

    def add_samples(self, groups):
        raise AssertionError("no partial rollout here")


def reward_is_a(args, sample):
    """`(args, sample | list[Sample])`, as the original documents a reward that also scores a fan-out's list."""
    if isinstance(sample, list):
        return [reward_is_a(args, s) for s in sample]
    return 1.0 if sample.response.endswith("A") else 0.0


def _args(monkeypatch, **kw):
    monkeypatch.setattr(generate_mod, "get_client", lambda args: _NoEngine())
    fields = dict(
        rollout_batch_size=1, n_samples_per_prompt=2, num_rollout=1, custom_rm_path=f"{__name__}.reward_is_a",
        rollout_max_response_len=8, rollout_num_gpus=1, rollout_num_gpus_per_engine=1,
    )  # fmt: skip
    return PluginArgs.from_config(SlimeArgs.from_dict({**fields, **kw}))


async def fanout_generate(args, sample, sampling_params):
    """Returns two samples per input (fan-out), answering A then B."""
    out = []
    for k in range(2):
        s = dataclasses.replace(sample, tokens=list(sample.tokens), metadata=dict(sample.metadata), rollout_id=7)
        s.append_response_tokens([A if k == 0 else B], log_probs=[-0.3], text="A" if k == 0 else "B")
        s.status = Status.COMPLETED
        out.append(s)
    return out


SEEN_BY_FILTER: list[list[str]] = []


def recording_filter(args, samples):
    SEEN_BY_FILTER.append([type(s).__name__ for s in samples])
    return True


async def test_dynamic_filters_accept_fan_out_groups(monkeypatch):
    args = _args(
        monkeypatch,
        custom_generate_function_path=f"{__name__}.fanout_generate",
        dynamic_sampling_filter_path="slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
    )
    out, _ = await generate_rollout_async(args, 0, _DataSource(n=2))
    assert [len(item) for item in out.samples[0]] == [2, 2]  # rewards 1, 0, 1, 0: kept
    SEEN_BY_FILTER.clear()
    args = _args(
        monkeypatch,
        custom_generate_function_path=f"{__name__}.fanout_generate",
        dynamic_sampling_filter_path=f"{__name__}.recording_filter",
    )
    await generate_rollout_async(args, 0, _DataSource(n=2))
    assert SEEN_BY_FILTER == [["Sample"] * 4]  # the filter gets the group's samples, flattened


async def empty_for_odd_generate(args, sample, sampling_params):
    """Answers even-indexed samples; returns odd-indexed ones without generating anything."""
    if sample.index % 2 == 0:
        sample.append_response_tokens([A], log_probs=[-0.3], text="A")
    sample.status = Status.COMPLETED
    return sample


async def test_empty_responses_are_counted_and_not_trained_on(monkeypatch, caplog):
    args = _args(monkeypatch, custom_generate_function_path=f"{__name__}.empty_for_odd_generate", rollout_batch_size=2)
    with caplog.at_level(logging.WARNING, logger="slime_rollout.generation.rollout"):
        out, _ = await generate_rollout_async(args, 3, _DataSource(n=2))
    flat = [s for g in out.samples for s in g]
    assert [s.remove_sample for s in flat] == [False, True, False, True]
    assert out.metrics["rollout/num_empty_responses"] == 2.0
    assert "rollout 3: 2 samples have an empty response (from " in caplog.text and "[1, 3]" in caplog.text


async def env_fails_odd_generate(args, sample, sampling_params):
    """Answers every sample; odd-indexed ones then fail in their env, marked as `multi_turn._env_step` marks them."""
    sample.append_response_tokens([A], log_probs=[-0.3], text="A")
    sample.status = Status.COMPLETED
    if sample.index % 2:
        sample.status, sample.remove_sample = Status.FAILED, True
        sample.metadata["env_error"] = "RuntimeError: tool service down"
    return sample


async def test_samples_failed_by_their_env_are_counted_in_a_metric_and_one_line_per_rollout(monkeypatch, caplog):
    # Was: one warning per sample where the env failed, no count and no per-rollout line.
    args = _args(monkeypatch, custom_generate_function_path=f"{__name__}.env_fails_odd_generate", rollout_batch_size=2)
    with caplog.at_level(logging.WARNING, logger="slime_rollout.generation.rollout"):
        out, _ = await generate_rollout_async(args, 4, _DataSource(n=2))
    assert out.metrics["rollout/env_failed_samples"] == 2.0
    lines = [r.getMessage() for r in caplog.records if "failed in their env" in r.getMessage()]
    assert lines == [
        "rollout 4: 2 of 4 samples failed in their env and are not trained on (samples [1, 3]; 2 RuntimeError)"
    ]


async def backend_errors_generate(args, sample, sampling_params):
    """Sample i's episode saw i failed retrievals over two steps, as `multi_turn.generate` records env infos."""
    sample.append_response_tokens([A], log_probs=[-0.3], text="A")
    sample.status = Status.COMPLETED
    sample.metadata["env_info"] = [{"query": "q", "num_backend_errors": sample.index}, {"answer": "A"}]
    return sample


async def test_samples_shown_a_tool_backend_failure_are_counted(monkeypatch):
    # A retrieval server that was down showed the model an error (kept: the original's example does the same);
    # nothing counted it, so training on infra failures looked like training on the environment.
    args = _args(monkeypatch, custom_generate_function_path=f"{__name__}.backend_errors_generate", rollout_batch_size=2)
    out, _ = await generate_rollout_async(args, 4, _DataSource(n=2))
    assert sorted(s.index for g in out.samples for s in g) == [0, 1, 2, 3]
    assert out.metrics["rollout/env_backend_error_samples"] == 3.0  # samples 1, 2, 3
    assert out.metrics["rollout/env_failed_samples"] == 0.0  # shown, not failed


BATCH_CALLS: list[list[int]] = []


async def batch_reward(args, samples):
    """A batch-mode reward written for the original's fan-out path: one call per fan-out list."""
    BATCH_CALLS.append([s.metadata["k"] for s in samples])
    return [float(s.response == "A") for s in samples]


async def tagged_fanout_generate(args, sample, sampling_params):
    out = await fanout_generate(args, sample, sampling_params)
    for k, s in enumerate(out):
        s.metadata["k"] = k
    return out


def per_sample_reward(args, sample):
    return float(sample.response == "A")


async def test_a_fan_out_is_scored_by_one_call_with_its_list_as_the_original_does(monkeypatch):
    # The original's generate_and_rm scores a fan-out's list with batched_async_rm, which calls --custom-rm-path once
    # in batch mode. Here it was called per sample: a batch-mode reward failed ("'Sample' object is not iterable").
    BATCH_CALLS.clear()
    generate = f"{__name__}.tagged_fanout_generate"
    args = _args(monkeypatch, custom_generate_function_path=generate, custom_rm_path=f"{__name__}.batch_reward")
    out, _ = await generate_rollout_async(args, 0, _DataSource(n=2))
    assert BATCH_CALLS == [[0, 1], [0, 1]]  # one call per sample of the group, each with its fan-out of two
    assert [[s.reward for s in item] for item in out.samples[0]] == [[1.0, 0.0], [1.0, 0.0]]
    # A per-sample reward meets the list: one error naming it, the samples and the original's convention.
    args = _args(monkeypatch, custom_generate_function_path=generate, custom_rm_path=f"{__name__}.per_sample_reward")
    with pytest.raises(RewardFunctionError, match=r"per_sample_reward \(batch mode\) raised AttributeError on samples "
                       r"\[0, 0\]: .*fn\(args, samples\) -> list, as in the original"):  # fmt: skip
        await generate_rollout_async(args, 0, _DataSource(n=2))
