r"""Retractions, negations and hedges, read by one rule in math, dapo and gpqa (issue 27, round 3).

Each row was written by hand for this test: grader, response, label, the careful grade. Rows marked "was 1.0"
scored 1.0 before the fix (a false positive); the others pin what must stay right (earlier fixes included).
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.retraction import expand_contractions, judged_wrong, negated_before, retracts


def _grade(grader, response, label):
    out = rule_based_reward(grader, response, label, {})
    return float(out["acc"]) if grader == "dapo" else float(out)


# Item 5: contractions expanded, negation as a class of words, giving up; label 5 unless given.
RETRACTIONS = [
    ("math", r"So \boxed{5}. Hmm, that isn't right; I'm not able to finish.", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{5}. Wait, this answer is wrong. I give up.", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{5}. No wait, that's not it.", "5", 0.0),  # was 1.0
    ("math", r"So \boxed{5}. Actually, I was wrong above; I cannot determine it.", "5", 0.0),  # was 1.0
    ("math", r"\boxed{5} is false.", "5", 0.0),  # was 1.0
    ("math", r"\boxed{5} isn't correct.", "5", 0.0),  # was 1.0
    ("math", "\\boxed{5} isn\u2019t correct.", "5", 0.0),  # a typographic apostrophe
    ("math", r"It cannot be \boxed{5}.", "5", 0.0),  # was 1.0
    ("math", r"It can't be $\boxed{5}$.", "5", 0.0),
    ("math", r"The answer is never \boxed{5}.", "5", 0.0),  # was 1.0
    ("math", r"The answer is $\boxed{\text{5 is wrong}}$.", "5", 0.0),
    ("dapo", "Answer: 5\nActually, that's wrong.", "5", 0.0),  # was 1.0
    ("dapo", "Answer: 5 is wrong", "5", 0.0),
    ("gpqa", "Answer: B. Actually no, it's A.", "B", 0.0),  # was 1.0
    ("gpqa", "Answer: B. Actually no, it's A.", "A", 1.0),  # the correction names the new pick
    ("gpqa", "Answer: B. Wait, that's wrong.", "B", 0.0),
    ("gpqa", "A is not correct. The answer is not A.", "A", 0.0),  # was 1.0
    ("gpqa", "Answer: A, C", "A", 0.0),  # was 1.0
    ("gpqa", "Answer: A, C.", "C", 0.0),
    # Kept right: an affirmation, a judgement of something else, a negated box beside the answer.
    ("math", r"\boxed{5}. So the correct answer is 5.", "5", 1.0),
    ("math", r"Option B is wrong, so the answer is \boxed{5}", "5", 1.0),
    ("math", r"\boxed{5}. Option B isn't correct because it double counts.", "5", 1.0),
    ("math", r"The answer is not \boxed{3}; it is \boxed{5}.", "5", 1.0),
    ("math", r"The answer is \boxed{5}, definitely not \boxed{3}.", "5", 1.0),
    ("math", r"\boxed{5}. My mistake earlier was the sign; now it is fixed.", "5", 1.0),
    ("math", r"The answer is $\boxed{\text{False}}$.", r"\text{False}", 1.0),  # a word alone is an answer
    ("dapo", "Answer: 5\nThat is the answer.", "5", 1.0),
    ("dapo", "Answer: 5\nThe correct answer is 5.", "5", 1.0),
    ("gpqa", "The answer is (B), not (A).", "B", 1.0),
    ("gpqa", "I think A is wrong, B is wrong, C is correct.", "C", 1.0),
    ("gpqa", "Answer: B. The other options are wrong.", "B", 1.0),
    ("gpqa", "Answer: B, I think.", "B", 1.0),
]

# Item 6: doubt or a condition around the last box makes the boxes a hedge, not a self-correction.
HEDGES = [
    ("math", r"It is \boxed{3}; I'd also accept \boxed{5}.", "5", 0.0),  # was 1.0
    ("math", r"It is \boxed{3}. Some might argue \boxed{5}.", "5", 0.0),  # was 1.0
    ("math", r"\boxed{3} (if we count the empty set) and \boxed{5} otherwise.", "5", 0.0),  # was 1.0
    ("math", r"\boxed{3}. I'm torn; \boxed{5}.", "5", 0.0),  # was 1.0
    ("math", r"\boxed{3} when n is even, \boxed{5} when n is odd.", "5", 0.0),
    ("math", r"\boxed{3}. Then \boxed{5}, unless n = 0.", "5", 0.0),
    # Kept right: a corrected derivation settles on its last box.
    ("math", r"At first I got \boxed{3}, but after fixing the sign error the result is \boxed{5}.", "5", 1.0),
    ("math", r"Final answer: \boxed{3}. Let me re-check: 2+3=5. Final answer: \boxed{5}", "5", 1.0),
    ("math", r"\boxed{3}. Oops, that's wrong; if we fix the sign it is \boxed{5}.", "5", 1.0),
    ("math", r"\boxed{5}, if I have read the question right.", "5", 1.0),  # one box: no second answer
    ("math", r"I get \boxed{3}. If I recheck step 2, x = 5, so the answer is \boxed{5}.", "5", 1.0),
    ("math", r"I get \boxed{3}. When I recheck step 2, the answer is \boxed{5}.", "5", 1.0),
]


@pytest.mark.parametrize(("grader", "response", "label", "expected"), RETRACTIONS + HEDGES)
def test_retractions_negations_and_hedges(grader, response, label, expected):
    assert _grade(grader, response, label) == expected


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("that isn't right", "that is not right"),
        ("it can't be", "it cannot be"),
        ("that's not it", "that is not it"),
        ("I'd also accept", "I would also accept"),
        ("I\u2019m torn", "I am torn"),
        ("the cat's toy", "the cat's toy"),  # a possessive stays
    ],
)
def test_expand_contractions(text, expanded):
    assert expand_contractions(text) == expanded


def test_negation_spans_are_measured_on_the_written_text():
    assert negated_before("It can't be $") == len("can't be $")
    assert negated_before("It is ") == 0
    assert judged_wrong(" isn't correct.") == len(" isn't correct")
    assert judged_wrong(" is correct.") == 0


def test_a_correction_retracts_only_a_different_value():
    assert retracts(". Actually, the correct answer is 6.", lambda value: value != "5")
    assert not retracts(". So the correct answer is 5.", lambda value: value != "5")
