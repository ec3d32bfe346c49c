"""Issue 27: a plugin's int label of more than 4,300 digits (Python's int-to-text limit).

JSONL refuses such a number when it reads it (file:line); a custom data source or generate function can still set
one. It crashed in the grader (`str(label)`), then again while the error naming the sample was formatted
(`{label!r:.60}`): a bare "Exceeds the limit (4300 digits)" naming neither sample nor flag. A checkpoint of samples
(`--save` with a partial-rollout buffer, fully-async held groups) raised the same bare error from json.dumps.
"""

import asyncio
from types import SimpleNamespace

import pytest

from slime_core.sample import Sample
from slime_core.sample_json import dumps_with_samples
from slime_rollout.rewards import async_rm, rule_based_reward

_BIG = 10**5000


@pytest.mark.parametrize("rm_type", ["math", "dapo", "deepscaler", "f1", "gpqa", "boxed_math"])
def test_a_label_past_the_int_to_text_limit_is_one_error_naming_the_reward(rm_type):
    with pytest.raises(ValueError, match=rf"--rm-type {rm_type}: the label is an int of 5,001 digits.*as a string"):
        rule_based_reward(rm_type, r"The answer is \boxed{5}", _BIG, {})


@pytest.mark.parametrize("rm_type", ["math", "gpqa"])
def test_async_rm_names_the_sample(rm_type):
    args = SimpleNamespace(custom_rm_path=None, rm_type=rm_type, rm_num_workers=0, use_opd=False)
    sample = Sample(index=7, response=r"\boxed{5}", label=_BIG)
    with pytest.raises(ValueError, match=rf"--rm-type {rm_type} on sample 7: the label is an int of 5,001 digits"):
        asyncio.run(async_rm(args, sample))


def test_labels_at_the_limit_still_grade():
    # 4,300 digits is within the limit: graded as text, as before.
    label = 10**4299
    assert rule_based_reward("math", rf"\boxed{{{label}}}", label) == 1.0
    assert rule_based_reward("math", r"\boxed{5}", 5) == 1.0


def test_a_sample_checkpoint_names_the_sample_and_the_field():
    sample = Sample(index=3, label=_BIG)
    with pytest.raises(ValueError, match=r"--save: buffer: sample 3's field 'label' holds an int of 5,001 digits"):
        dumps_with_samples({"samples": [sample.to_dict()]}, [sample], what="--save: buffer")
    sample = Sample(index=4, metadata={"answer": _BIG})
    with pytest.raises(ValueError, match=r"sample 4's metadata\['answer'\] holds an int of 5,001 digits"):
        dumps_with_samples({"samples": [sample.to_dict()]}, [sample], what="--save: buffer")


def test_the_remote_reward_names_the_sample_before_posting():
    # json.dumps meets the same limit: the post failed inside the reward call with Python's bare message.
    args = SimpleNamespace(
        custom_rm_path=None, rm_type="remote_rm", rm_url="http://127.0.0.1:9/rm", rm_timeout_secs=5.0,
        slow_call_warning_secs=5.0, use_opd=False,
    )  # fmt: skip
    sample = Sample(index=9, response="5", label=_BIG)
    with pytest.raises(ValueError, match=r"--rm-type remote_rm on sample 9: the label is an int of 5,001 digits"):
        asyncio.run(async_rm(args, sample))
