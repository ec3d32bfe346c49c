r"""Issue 27 pass 48: answers offered side by side ("Another answer: \boxed{5}", "Case 1: ... Case 2: ...").

The careful grader's rule (a corrected derivation keeps its last box; boxes offered together as alternatives are a
hedge, right only as the label's parts) applied to the spellings it missed. Rows marked "was" scored that before.
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.answers import final_boxed_answers

OFFERED = [
    # Another answer offered next to the first: two final answers, a hedge against one value...
    (r"The answer is \boxed{3}. Another answer: \boxed{5}", "5", 0.0),  # was 1.0
    (r"\boxed{3}. Another answer is \boxed{5}.", "5", 0.0),  # was 1.0
    (r"First answer: \boxed{3}. Second answer: \boxed{5}.", "5", 0.0),  # was 1.0
    (r"One answer: \boxed{3}. Other answer: \boxed{5}.", "3", 0.0),  # was 0.0 by reading only the 5
    # ... and the label's two parts when it has two.
    (r"\boxed{3}. Another solution is \boxed{5}.", "3, 5", 1.0),  # was 0.0
    # One box per case: the case answers together, in the cases' order.
    (r"Case 1: \boxed{3} Case 2: \boxed{5}", "5", 0.0),  # was 1.0
    (r"Case 1: $n$ even, \boxed{3}. Case 2: $n$ odd, \boxed{5}.", "5", 0.0),  # was 1.0
    (r"In case 1 we get \boxed{3}. In case 2 we get \boxed{5}.", "3, 5", 1.0),  # was 0.0
    (r"Answer 1: \boxed{3} Answer 2: \boxed{5}", "5", 0.0),  # was 1.0
    # Kept: a correction, a case given up, a case label with one box, "in this case".
    (r"At first \boxed{3}, but after fixing the sign error, \boxed{5}", "5", 1.0),
    (r"Case 1: \boxed{3}, which contradicts x > 4. Case 2: \boxed{5}", "5", 1.0),
    (r"Case 1: \boxed{3}. That's wrong. Case 2: \boxed{5}", "5", 1.0),
    (r"Case 1 gives x = 3, which fails the constraint. Case 2: \boxed{5}", "5", 1.0),
    (r"In this case \boxed{3}. Let me redo it with a case analysis: \boxed{5}", "5", 1.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), OFFERED)
def test_answers_offered_side_by_side(response, label, expected):
    assert rule_based_reward("math", response, label) == expected


def test_cases_are_labelled_parts_in_order():
    final = final_boxed_answers(r"Case 1: \boxed{3} Case 2: \boxed{5}")
    assert final.answers == ["3", "5"]
    assert final.labelled
    assert final.num_superseded == 0


def test_boxed_types_read_another_answer_as_a_hedge():
    # Graders of one answer (boxed_f1 and the like) get no answer from a hedge.
    assert rule_based_reward("boxed_f1", r"\boxed{Paris}. Another answer: \boxed{Lyon}", "Lyon") == 0.0
