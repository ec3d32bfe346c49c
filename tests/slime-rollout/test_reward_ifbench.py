"""`--rm-type ifbench` (the original's IFBench reward): registered, graded with IFBench's own `evaluation_lib`.

IFBench's checks are not installed here, so a stand-in `evaluation_lib` with the same interface (`InputExample`,
`test_instruction_following_strict`) implements two instructions by hand; it also records what it was given, so the
tests see how the row's metadata reaches IFBench. Before this, `--rm-type ifbench` was refused as an unknown type.
"""

import asyncio
import dataclasses
import json
import pathlib
import sys
import types

import pytest

from slime_core.config import parse_args
from slime_core.extensions import REWARDS, run_preflight_hooks
from slime_core.sample import Sample
from slime_rollout.rewards import async_rm, rule_based_reward


@dataclasses.dataclass
class _InputExample:
    key: int
    instruction_id_list: list[str]
    prompt: str
    kwargs: list[dict]


def _fake_lib(seen: list) -> types.ModuleType:
    """IFBench's interface: `change_case:english_lowercase` and `length_constraints:number_words` (max_words)."""

    def strict(example: _InputExample, prompt_to_response: dict[str, str]):
        seen.append((example, dict(prompt_to_response)))
        response = prompt_to_response[example.prompt]
        followed = []
        for instruction, kwargs in zip(example.instruction_id_list, example.kwargs, strict=True):
            if instruction == "change_case:english_lowercase":
                followed.append(response == response.lower())
            elif instruction == "length_constraints:number_words":
                followed.append(len(response.split()) <= kwargs["max_words"])
        return types.SimpleNamespace(follow_all_instructions=all(followed), follow_instruction_list=followed)

    return types.SimpleNamespace(InputExample=_InputExample, test_instruction_following_strict=strict)


@pytest.fixture
def seen(monkeypatch) -> list:
    calls: list = []
    monkeypatch.setitem(sys.modules, "evaluation_lib", _fake_lib(calls))
    return calls


_META = {
    "instruction_id_list": ["change_case:english_lowercase", "length_constraints:number_words"],
    "kwargs": [{"language": None}, {"max_words": 3, "relation": None}],
    "prompt_text": "Say hi in lowercase, in at most 3 words.",
    "record_id": 17,
}


def test_it_is_registered_as_in_the_original():
    assert "ifbench" in REWARDS.names()
    assert REWARDS.get("ifbench").grades_label is False  # the instructions are the answer key, not the label


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("hi there", 1.0),
        ("Hi there", 0.0),  # not lowercase
        ("hi there you all", 0.0),  # 4 words
        ("<think>Let Me Think About Many Words Here</think>hi there", 1.0),  # the reasoning is not checked
        ("<think>hi there", 0.0),  # reasoning never closed: no answer
    ],
)
def test_every_instruction_must_be_followed(seen, response, expected):
    assert rule_based_reward("ifbench", response, None, _META) == expected


def test_metadata_reaches_ifbench_as_its_data_writes_it(seen):
    rule_based_reward("ifbench", "<think>X</think>hi", None, _META)
    ((example, prompt_to_response),) = seen
    assert example == _InputExample(
        key=17,
        instruction_id_list=["change_case:english_lowercase", "length_constraints:number_words"],
        prompt="Say hi in lowercase, in at most 3 words.",
        kwargs=[{}, {"max_words": 3}],  # null arguments dropped, as IFBench's preprocessing does
    )
    assert prompt_to_response == {"Say hi in lowercase, in at most 3 words.": "hi"}


def test_one_kwargs_dict_applies_to_every_instruction(seen):
    meta = {"instruction_id_list": ["length_constraints:number_words", " ", None], "kwargs": {"max_words": 1}}
    assert rule_based_reward("ifbench", "hi", None, meta) == 1.0
    assert seen[0][0].kwargs == [{"max_words": 1}]  # blank and null ids dropped
    assert seen[0][0].prompt == "" and seen[0][0].key == 0


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        (None, "no metadata naming its instructions"),
        ({}, r"instruction_id_list'\] must be a list"),
        ({"instruction_id_list": "change_case:english_lowercase"}, "must be a list"),
        ({"instruction_id_list": [None, ""]}, "names no instruction"),
        ({"instruction_id_list": ["a", "b"], "kwargs": [{}]}, r"kwargs'\] has 1 entries for 2 instructions"),
        ({"instruction_id_list": ["a"], "kwargs": ["x"]}, r"kwargs'\]\[0\] must be a dict"),
        ({"instruction_id_list": ["a"], "kwargs": 3}, "must be a list of dicts or a dict"),
        ({"instruction_id_list": ["a"], "record_id": "r-7"}, "record_id'] must be an integer"),
    ],
)
def test_bad_metadata_is_one_error(seen, metadata, message):
    # The original scored these 0.0 (or padded/truncated kwargs) without a word.
    with pytest.raises(ValueError, match=message):
        rule_based_reward("ifbench", "hi", None, metadata)
    assert seen == []


def test_async_rm_names_the_sample(seen):
    args = types.SimpleNamespace(custom_rm_path=None, rm_type="ifbench", use_opd=False)
    sample = Sample(prompt="p", response="hi", label=None, metadata={"instruction_id_list": []}, index=5)
    with pytest.raises(ValueError, match=r"--rm-type ifbench on sample 5 .*names no instruction"):
        asyncio.run(async_rm(args, sample))
    sample.metadata = dict(_META)
    assert asyncio.run(async_rm(args, sample)) == 1.0


def test_without_ifbench_the_launch_says_how_to_install_it(tmp_path: pathlib.Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "evaluation_lib", None)  # import fails as when it is not installed
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "Say hi.", "metadata": _META}) + "\n")
    cfg = parse_args(
        ["--train-backend", "fsdp", "--prompt-data", str(data), "--input-key", "prompt", "--rm-type", "ifbench",
         "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--global-batch-size", "2", "--num-rollout",
         "1", "--rollout-max-response-len", "8", "--actor-num-gpus-per-node", "1"]
    )  # fmt: skip
    errors = [p for p in run_preflight_hooks(cfg) if p.severity == "error"]
    assert [p.message.split(" (")[0] for p in errors] == ["--rm-type ifbench: needs IFBench's evaluation_lib"]
    assert "https://github.com/allenai/IFBench" in errors[0].message and errors[0].exception is ImportError
    with pytest.raises(ImportError, match="allenai/IFBench"):
        rule_based_reward("ifbench", "hi", None, _META)
