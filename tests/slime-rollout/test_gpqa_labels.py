"""Issue 27, gpqa: labels that name no option, option letters in prose, option texts spaced differently.

Each case scored wrong before (the defect): a bool label was compared as the text "True", `I choose option b.`
scored 0, `4J` did not name the option `4 J`, and the index label 1.5 was truncated to 1. Near misses next to them
keep their score.
"""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from slime_core.sample import Sample
from slime_rollout.rewards import async_rm, rule_based_reward
from slime_rollout.rewards.gpqa import extract_choice_letter

_JOULES = {"choices": ["1 J", "4 J", "9 J", "16 J"]}


def _gpqa(response: str, label: object, metadata: dict | None = None) -> float:
    return rule_based_reward("gpqa", response, label, metadata)


@pytest.mark.parametrize("label", [True, False, np.bool_(True)])
def test_a_bool_label_is_refused(label: object) -> None:
    # It scored `Answer: True` 1 (compared as text); the original reads True as the index 1 (B).
    with pytest.raises(ValueError, match="is a bool, not an option"):
        _gpqa("Answer: True", label)
    with pytest.raises(ValueError, match="is a bool"):
        _gpqa("Answer: B", label, _JOULES)


def test_a_bool_correct_letter_is_refused() -> None:
    with pytest.raises(ValueError, match="correct_letter True is a bool"):
        _gpqa("Answer: B", None, {"correct_letter": True})


@pytest.mark.parametrize("label", [1.5, 0.999, float("nan"), float("inf")])
def test_a_fractional_index_label_is_refused(label: float) -> None:
    # 1.5 was truncated to 1 (B), as in the original; NaN raised "cannot convert float NaN to integer".
    with pytest.raises(ValueError, match="is no option index: an index label is a whole number"):
        _gpqa("Answer: B", label, _JOULES)


@pytest.mark.parametrize("label", [1, 1.0, np.int64(1), np.float64(1.0)])
def test_a_whole_index_label_names_its_option(label: object) -> None:
    # numpy's int64 (a plugin's row) is no `int`: it was read as the text "1", which names no option.
    assert _gpqa("Answer: B", label, _JOULES) == 1.0
    assert _gpqa("Answer: C", label, _JOULES) == 0.0


def test_the_refusal_names_the_sample() -> None:
    args = SimpleNamespace(custom_rm_path=None, rm_type="gpqa", use_opd=False, rm_num_workers=0)
    sample = Sample(index=7, prompt="q", response="Answer: B", label=1.5, metadata={})
    with pytest.raises(ValueError, match=r"--rm-type gpqa on sample 7 \(label 1\.5\): gpqa label 1\.5 is no option"):
        asyncio.run(async_rm(args, sample))


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("I choose option b.", "B"),
        ("I'll go with choice (c).", "C"),
        ("The answer is option d because it fits.", "D"),
        ("Option b is wrong, so I pick C.", "C"),
        ("I choose option e.", None),  # not one of the four options
        ("I choose option b or option c.", None),  # a hedge
        ("Consider a simpler case. B.", "B"),  # the article "a" is no option
    ],
)
def test_a_lower_case_letter_after_option_is_the_option(response: str, expected: str | None) -> None:
    assert extract_choice_letter(response, "ABCD") == expected


def test_option_b_in_prose_scores() -> None:
    # It scored 0: no statement pattern read "option b" and the fallback reads capital letters only.
    assert _gpqa("I choose option b.", "B", _JOULES) == 1.0
    assert _gpqa("I choose option b.", "C", _JOULES) == 0.0


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        ("Final answer: 4J", "B", 1.0),  # the choice is "4 J"
        ("Final answer: 4 J", "B", 1.0),
        ("Final answer: 16J", "D", 1.0),
        ("Final answer: 16J", "B", 0.0),  # "4 J" is not inside "16J"
        ("Final answer: 4 joules", "B", 0.0),  # no option's text
    ],
)
def test_an_option_text_matches_without_the_digit_letter_space(response: str, label: str, expected: float) -> None:
    assert _gpqa(response, label, _JOULES) == expected


def test_a_choice_without_the_space_matches_a_spaced_answer() -> None:
    assert _gpqa("Final answer: 4 J", "B", {"choices": ["1J", "4J", "9J"]}) == 1.0
    assert _gpqa("Final answer: h 2 o", "A", {"choices": ["H2O", "CO2"]}) == 1.0


def test_a_text_label_matches_its_choice_without_the_space() -> None:
    # The label "4J" named no option (choices "4 J"), so only a response stating the text "4J" scored.
    assert _gpqa("Answer: B", "4J", _JOULES) == 1.0
    assert _gpqa("Answer: C", "4J", _JOULES) == 0.0
    # Without choices the stated text is compared with the label the same way.
    assert _gpqa("Final answer: 4 J", "4J") == 1.0
    assert _gpqa("Final answer: 4 J", "14J") == 0.0
    # Digits stay apart: "2 3" is not "23".
    assert _gpqa("Final answer: 2 3", "23") == 0.0


@pytest.mark.parametrize(
    "response",
    [
        "I would not choose option b.",
        "I won't pick option B.",
        "It is not option b.",
        "I don't think the answer is B.",
        "I do not believe it's (B).",
        "I reject option B.",
        "After checking, rule out B.",
    ],
)
def test_a_negated_choice_is_no_answer(response: str) -> None:
    # Each scored as choosing B (label B: 1.0), as the original reads them: a choice made against is no pick.
    assert extract_choice_letter(response, "ABCD") is None
    assert _gpqa(response, "B") == 0.0


@pytest.mark.parametrize(
    ("response", "picked"),
    [
        ("I would choose option b, not option c.", "B"),  # it picked C, the option chosen against
        ("I would not choose option b. I choose option c.", "C"),
        ("I don't think the answer is B; the answer is C.", "C"),
        # Near misses: the negation is about something else.
        ("I am not sure, but the answer is B.", "B"),
        ("Not sure. Answer: B", "B"),
        ("I cannot rule out A, so the answer is B.", "B"),
        ("Whether or not A holds, the answer is B.", "B"),
        ("I choose option b.", "B"),
    ],
)
def test_a_choice_next_to_a_negated_one_is_the_pick(response: str, picked: str) -> None:
    assert extract_choice_letter(response, "ABCD") == picked


@pytest.mark.parametrize(
    ("response", "picked"),
    [
        ("The answer is not 4 J.", None),  # it picked B, the text said to be not the answer
        ("I would not choose 4 J.", None),
        ("4 J is wrong.", None),
        ("It is not 4 J, it is 9 J.", "C"),
        ("Final answer: 4 J", "B"),
    ],
)
def test_an_option_text_chosen_against_is_no_pick(response: str, picked: str | None) -> None:
    assert extract_choice_letter(response, "ABCD", _JOULES["choices"]) == picked
