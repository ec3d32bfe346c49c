r"""The final-answer rule reads each side once per grade, and roman-numeral statements have one pattern.

`final_pairs` split the label up to 5 times and the answer up to 4 per grade (`answer_parts` with and without
unwrapping, `same_part_count`, `named_pairs`, `one_joiner`); `roman_options` ran on both sides in `final_pairs` and
again in `grade_fast`; `rewards.alternatives` kept its own copy of the numerals, without `VI`-`X` after "and".
"""

import pytest

from slime_rollout.rewards import parts, rule_based_reward
from slime_rollout.rewards.answers import final_boxed_answers
from slime_rollout.rewards.math_utils import final_pairs
from slime_rollout.rewards.parts import Split, answer_parts
from slime_rollout.rewards.roman_options import roman_options


@pytest.mark.parametrize(
    ("text", "wrapped", "unwrapped", "joined"),
    [
        ("5", ["5"], ["5"], "5"),
        ("(1, 2)", ["(1, 2)"], ["1", "2"], "(1, 2)"),
        (r"\{1, 2\}", ["{1, 2}"], ["1", "2"], r"\{1, 2\}"),
        ("two and 3", ["two", "3"], ["two", "3"], "2, 3"),
        (r"\pm 2", ["+ 2", "- 2"], ["+ 2", "- 2"], "+ 2, - 2"),
        ("x = 5, y = 6", ["x = 5", "y = 6"], ["x = 5", "y = 6"], "x = 5, y = 6"),
    ],
)
def test_split_holds_both_readings_of_answer_parts(text, wrapped, unwrapped, joined):
    split = Split.of(text)
    assert (split.wrapped, split.unwrapped) == (wrapped, unwrapped)
    assert (split.wrapped, split.unwrapped) == (answer_parts(text, unwrap=False), answer_parts(text))
    assert split.joined() == joined


def test_same_count_reads_either_way():
    assert Split.of(r"\{1, 2\}").same_count(Split.of("1, 2"))  # unwrapped: 2 and 2
    assert Split.of(r"(-\infty, 3)").same_count(Split.of("7"))  # as written: 1 and 1
    assert not Split.of("1, 2").same_count(Split.of("5"))


@pytest.mark.parametrize(
    ("response", "label", "pairs"),
    [
        (r"$\boxed{1, 2}$", "(1, 2)", [("1, 2", "(1, 2)")]),
        (r"$\boxed{y = 6, x = 5}$", "x = 5, y = 6", [("x = 5", "x = 5"), ("y = 6", "y = 6")]),
        (r"$\boxed{two and 3}$", "2, 3", [("2, 3", "2, 3")]),
    ],
)
def test_final_pairs_splits_each_side_once(monkeypatch, response, label, pairs):
    calls = []
    real = parts._bracketed
    monkeypatch.setattr(parts, "_bracketed", lambda text: calls.append(text) or real(text))
    assert final_pairs(final_boxed_answers(response), label) == pairs
    assert sorted(calls) == sorted([label, final_boxed_answers(response).answers[0]])  # was 9 calls


def test_roman_options_is_read_once_per_text_per_grade():
    roman_options.cache_clear()
    assert rule_based_reward("math", r"So $\boxed{\text{I and III}}$.", r"\text{I, III}") == 1.0
    info = roman_options.cache_info()
    assert (info.misses, info.hits > 0) == (2, True)  # the answer and the label; `grade_fast` reuses both


@pytest.mark.parametrize(
    ("box", "after", "score"),
    [
        (r"\text{II and IV}", "Maybe II and VI.", 0.0),  # scored 1: "VI" after "and" was no numeral there
        (r"\text{II and VI}", "Maybe II and VI.", 1.0),  # a restatement
        (r"\text{I only}", "Maybe II.", 0.0),
        (r"\text{I only}", "Maybe I and VIII.", 1.0),  # a bare "I" is the pronoun unless "only" follows
    ],
)
def test_an_alternative_naming_statements_reads_every_numeral(box, after, score):
    assert rule_based_reward("math", rf"So $\boxed{{{box}}}$. {after}", box) == score
