r"""Issue 27, item 1, sixth pass: an unboxed alternative anywhere in the two sentences after the last box is a hedge.

The fifth pass caught one only right after the box and only as digits: "\boxed{6}. I'm not sure, it might be 5",
"\boxed{6} or \frac{1}{2}" and "\boxed{6}, unless it is 5" scored 1.
"""

import pytest

from slime_rollout.rewards import rule_based_reward

HEDGES = [
    r"\boxed{6}. Hmm, or 5.",
    r"\boxed{6}. I'm not sure, it might be 5.",
    r"\boxed{6}. I'm not confident though; it might be 5.",
    r"\boxed{6}. Maybe it's 5.",
    r"\boxed{6}, or perhaps \(5\).",
    r"\boxed{6}, or 5 if we include zero.",
    r"\boxed{6}. The answer might also be 5.",
    r"\boxed{6} or \frac{1}{2}",
    r"\boxed{6} or \(\frac{1}{2}\)",
    r"\boxed{6} or five",
    r"\boxed{6}, or maybe five.",
    r"\boxed{6} or \sqrt{2}",
    r"\boxed{6} or $\sqrt{2}$",
    r"\boxed{6}, though 5 is possible too.",
    r"\boxed{6}. Though honestly it could be 5.",
    r"\boxed{6} (alternatively \(5\))",
    r"\boxed{6}. Alternatively, \(\frac{1}{2}\).",
    r"\boxed{6}. Another possible answer is \(\frac12\).",
    r"\boxed{6}. Or it's 5, I can't tell.",
    r"\boxed{6}, unless it is 5.",
    r"\boxed{6}, otherwise 5.",
]

# A derivation, a check, a restatement or a value that goes on after the box is no alternative.
NOT_HEDGES = [
    r"\boxed{6}, attained when n = 2 or 3.",
    r"\boxed{6}. Perhaps 2 more checks would help.",
    r"\boxed{6}. Maybe I should double check: 2*3 = 6.",
    r"\boxed{6}, or equivalently 12/2.",
    r"\boxed{6} or 6.0",
    r"\boxed{6}, or six.",
    r"\boxed{6}. It could be written as \frac{12}{2}.",
    r"\boxed{6}. Note that for n = 1 or 2 the formula fails.",
    r"\boxed{6}. Otherwise, we would get 7, which contradicts the condition.",
    r"\boxed{6}, unless stated otherwise.",
    r"\boxed{6}. The probability could be 1/2 for a fair coin, but here it is 6.",
    r"\boxed{6}. Perhaps one more check: 1+2+3 = 6.",
    "\\boxed{6}\n\nThe remaining case (n = 0 or 1) gives nothing.",
]


@pytest.mark.parametrize("response", HEDGES)
def test_unboxed_alternative_is_a_hedge(response):
    assert rule_based_reward("math", response, "6") == 0.0  # all of these were 1.0
    assert rule_based_reward("boxed_dapo", response, "6")["acc"] is False


@pytest.mark.parametrize("response", NOT_HEDGES)
def test_text_after_the_box_without_an_alternative_keeps_the_answer(response):
    assert rule_based_reward("math", response, "6") == 1.0
    assert rule_based_reward("boxed_dapo", response, "6")["acc"] is True


# The same in gpqa: another option offered after the stated pick, in a later sentence or with "also ... right".
GPQA_HEDGES = [
    "Answer: B. Hmm, or C.",
    "Answer: B. I'm not sure, it might be C.",
    "Answer: B. Though C could also be right.",
    "Answer: B. Option C might also be correct.",
    r"\boxed{B}. Or C.",
]
GPQA_PICKS = [
    "Answer: B. A quick check confirms it.",
    "Answer: B. Options A, C and D are wrong.",
    "Answer: B. Maybe I should explain: A is a distractor.",
    "Answer: B. Perhaps A is tempting, but it ignores spin.",
    "Answer: (B). It cannot be C, since C violates parity.",
    "Answer: B\n\nExplanation: option C might seem right at first but fails.",
]


@pytest.mark.parametrize("response", GPQA_HEDGES)
def test_gpqa_option_offered_after_the_pick_is_a_hedge(response):
    assert rule_based_reward("gpqa", response, "B", {}) == 0.0  # all of these were 1.0


@pytest.mark.parametrize("response", GPQA_PICKS)
def test_gpqa_other_options_discussed_after_the_pick_keep_it(response):
    assert rule_based_reward("gpqa", response, "B", {}) == 1.0


# An alternative considered and rejected right after it keeps the box (these were 0.0 with the rule above).
REJECTED_ALTERNATIVES = [
    (r"\boxed{5}. Wait, or is it 6? No, 5 is right.", 1.0),
    (r"\boxed{5}. Maybe 6? Checking: 6 gives 13, not 12, so 5.", 1.0),
    (r"\boxed{5}. It might be 6, but 6 gives 13, so no.", 1.0),
    (r"\boxed{5}. Maybe 6? That fails: 6 + 1 = 7.", 1.0),
    # Still hedges: doubt that rejects nothing, or a verdict on something else.
    (r"\boxed{5}, or 6; no idea which.", 0.0),
    (r"\boxed{5}, or 6 if the first guess is wrong.", 0.0),
    (r"\boxed{5}. Or 6. So no clear answer.", 0.0),
]


@pytest.mark.parametrize(("response", "expected"), REJECTED_ALTERNATIVES)
def test_an_alternative_rejected_right_after_it_keeps_the_box(response, expected):
    assert rule_based_reward("math", response, "5") == expected


# dapo's Answer: line by the same rule: another value offered on the lines after it is a hedge.
DAPO_LINES = [
    ("Answer: 6\nOr maybe 5.", False),  # was True
    ("Answer: 6\nI am not sure, it might be \\frac{1}{2}.", False),  # was True
    ("Answer: 6\nOr is it 5? No, 6 is right.", True),
    ("Answer: 6\nCheck: 2*3 = 6.", True),
]


@pytest.mark.parametrize(("response", "acc"), DAPO_LINES)
def test_dapo_answer_line_followed_by_another_value_is_a_hedge(response, acc):
    assert rule_based_reward("dapo", response, "6")["acc"] is acc


# A counterfactual alternative whose condition is denied, or after which the text returns to the pick, is no hedge;
# gpqa's "another option in the pick's sentence" rule read past the line break after "Answer: B".
COUNTERFACTUALS = [
    ("gpqa", "Answer: B\n\nExplanation: the product could be A if heated, but at room temperature it is B.", "B", 1.0),
    ("gpqa", "Answer: B\nOr maybe C.", "B", 0.0),
    ("gpqa", "Answer: B. It might be C, but I am not sure.", "B", 0.0),
    ("math", r"\boxed{6}. It could be 5 if we counted zero, but we do not.", "6", 1.0),
    ("math", r"\boxed{6}, or 5 but I am not sure.", "6", 0.0),
    ("math", r"\boxed{6}, or 5 if zero counts, but it may not.", "6", 0.0),
]


@pytest.mark.parametrize(("rm_type", "response", "label", "expected"), COUNTERFACTUALS)
def test_a_denied_counterfactual_keeps_the_answer(rm_type, response, label, expected):
    assert rule_based_reward(rm_type, response, label, {}) == expected


@pytest.mark.parametrize("tail", [" maybe it is it is it is" * 15, " maybe the answer is the answer is" * 10])
def test_the_alternative_rule_is_not_exponential_in_filler_words(tail):
    import time

    start = time.perf_counter()
    assert rule_based_reward("math", r"\boxed{5}" + tail, "5") == 1.0
    assert rule_based_reward("gpqa", "Answer: B" + tail, "B", {}) == 1.0
    assert time.perf_counter() - start < 1.0  # overlapping filler words ("it is", "it" + "is"): minutes
