"""`--rm-type` dispatches through the reward registry: a grader is one record, its function and its entry point.

A record registered in this process (as an installed package's entry point would be) is graded by
`rule_based_reward` and `async_rm` with the `boxed_` rules, pooled when it names a pooled grader, and posted to
`--rm-url` when it names neither factory nor grader. Rewards are exact (string comparisons).
"""

import pytest

import slime_rollout.rewards as rewards
from slime_core import registry
from slime_core.config import PluginArgs, SlimeArgs
from slime_core.extensions import REWARDS, RewardSpec
from slime_core.registry import source_entry_points
from slime_core.sample import Sample
from slime_rollout.rewards import async_rm, rule_based_reward
from slime_rollout.rewards.checks import RewardFunctionError

SEEN: list[tuple] = []


def exact(response, label, metadata, boxed):
    """1.0 when the response is the label, 2.0 for it with the boxed_ prefix; records every call."""
    SEEN.append((response, label, metadata, boxed))
    return (2.0 if boxed else 1.0) * float(response.strip() == label)


async def exact_pooled(response, label, metadata, boxed, *, num_workers, sample_index):
    SEEN.append(("pooled", num_workers, sample_index))
    return exact(response, label, metadata, boxed)


def _args(**fields):
    return PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields}))


@pytest.fixture
def registered():
    """Registers `exact` (answer only), `exact_box` (reads its box) and `exact_pool` (pooled) for one test."""
    specs = [
        RewardSpec(name="exact", grader=exact, grades_label=True),
        RewardSpec(name="exact_box", grader=f"{__name__}:exact", reads_box=True),
        RewardSpec(name="exact_pool", grader=exact, pooled_grader=exact_pooled),
        RewardSpec(name="judge", needs_url=True),
        RewardSpec(name="empty"),
    ]
    SEEN.clear()
    for spec in specs:
        REWARDS.register(spec)
    yield
    for spec in specs:
        REWARDS.unregister(spec.name)


def test_a_registered_grader_is_a_rule_with_the_boxed_rules(registered):
    assert rule_based_reward("exact", "42", "42", {"k": 1}) == 1.0
    assert SEEN[-1] == ("42", "42", {"k": 1}, False)
    # boxed_: a grader that does not read the box gets the final box's content, one that does the whole text.
    assert rule_based_reward("boxed_exact", r"so \boxed{42}", "42") == 2.0
    assert SEEN[-1] == ("42", "42", None, True)
    assert rule_based_reward("boxed_exact", r"\boxed{41} or \boxed{42}", "42") == 0.0  # a hedge: no answer
    assert SEEN[-1][0] == ""
    assert rule_based_reward("boxed_exact_box", r"so \boxed{42}", "42") == 0.0
    assert SEEN[-1] == (r"so \boxed{42}", "42", None, True)
    assert {"exact", "exact_box", "exact_pool", "judge", "empty", "math", "remote_rm"} <= set(rewards.RM_TYPES)


def test_unknown_or_non_rule_types_list_the_rules(registered):
    for name in ("nope", "boxed_nope", "judge", "remote_rm"):
        with pytest.raises(KeyError, match=r"unknown --rm-type '\w+'; known: .*exact, exact_box.*math.*boxed_<type>"):
            rule_based_reward(name, "", "")
    with pytest.raises(KeyError) as e:
        rule_based_reward("judge", "", "")
    assert "remote_rm" not in str(e.value) and "judge" not in str(e.value).partition("known:")[2]


async def test_async_rm_grades_inline_or_in_the_pool_as_the_record_says(registered):
    sample = Sample(response=r"it is \boxed{7}", label="7", index=5, metadata={"rm_type": "boxed_exact"})
    assert await async_rm(_args(rm_type="math"), sample) == 2.0  # metadata rm_type wins over --rm-type
    assert SEEN[-1] == ("7", "7", {"rm_type": "boxed_exact"}, True)
    sample = Sample(response="7", label="7", index=5)
    assert await async_rm(_args(rm_type="exact_pool", rm_num_workers=3), sample) == 1.0
    assert SEEN[-2:] == [("pooled", 3, 5), ("7", "7", {}, False)]


async def test_a_record_with_neither_factory_nor_grader_is_a_remote_reward_model(registered, monkeypatch):
    posted = []

    async def remote_reward(url, payload):
        posted.append((url, payload))
        return 0.5

    monkeypatch.setattr(rewards, "remote_reward", remote_reward)
    sample = Sample(prompt="q", response=r"x \boxed{3}", label="3")
    assert await async_rm(_args(rm_type="boxed_judge", rm_url="http://rm:1/score"), sample) == 0.5
    assert posted == [("http://rm:1/score", {"prompt": "q", "response": "3", "label": "3"})]
    with pytest.raises(ValueError, match="--rm-type empty: its record names no factory and no grader"):
        await async_rm(_args(rm_type="empty"), sample)


def test_the_builtin_graders_are_found_from_source_without_metadata(monkeypatch):
    # A source checkout on PYTHONPATH has no dist-info: the fallback reads slime-rollout's pyproject.toml.
    assert REWARDS._builtins == source_entry_points("slime_rollout", "slime.rewards")
    assert {"math", "deepscaler", "dapo", "f1", "gpqa", "remote_rm", "random"} <= set(REWARDS._builtins)
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [])
    REWARDS.refresh()
    try:
        assert REWARDS.names() == sorted(REWARDS._builtins)
        assert rule_based_reward("boxed_f1", r"text \boxed{paris}", "paris") == 1.0
        assert REWARDS.get("math").reads_box and REWARDS.get("math").pooled_grader is not None
    finally:
        monkeypatch.undo()
        REWARDS.refresh()


def broken(response, label, metadata, boxed):
    """A grader with a bug: a KeyError on every response (as `metadata["choices"]` on a row without it)."""
    return {}["choices"]


async def broken_pooled(response, label, metadata, boxed, *, num_workers, sample_index):
    raise RuntimeError("worker state lost")


async def test_a_grader_raising_anything_names_itself_and_the_sample():
    # Pass 48: only a ValueError was re-raised naming the sample; a KeyError or RuntimeError from a grader reached
    # the rollout bare ("KeyError: 'choices'"), naming neither the grader nor the sample.
    specs = [
        RewardSpec(name="broken", grader=broken),
        RewardSpec(name="broken_pool", grader=f"{__name__}:broken", pooled_grader=broken_pooled),
    ]
    for spec in specs:
        REWARDS.register(spec)
    try:
        sample = Sample(response="seven", label="7", index=12)
        with pytest.raises(RewardFunctionError) as e:
            await async_rm(_args(rm_type="broken"), sample)
        assert str(e.value) == (
            f"--rm-type broken grader {__name__}:broken raised KeyError on sample 12 (label '7', response 'seven'): "
            "'choices'"
        )
        assert isinstance(e.value.__cause__, KeyError)
        with pytest.raises(
            RewardFunctionError,
            match=r"^--rm-type boxed_broken_pool grader "
            rf"{__name__}:broken_pooled raised RuntimeError on sample 12 .*: worker state lost$",
        ):
            await async_rm(_args(rm_type="boxed_broken_pool"), sample)
    finally:
        for spec in specs:
            REWARDS.unregister(spec.name)
