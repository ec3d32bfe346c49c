r"""Issue 27 pass 48: an answer longer than `GRADE_MAX_CHARS` is not compared; it counts as undecided, logged.

A 1 MB box of parts (`1, 1, 1, ...`) was split and cleaned on the event loop for 1-3 s and then scored 0 with no
word: not the label's number of parts. The symbolic check already skipped answers past `SYMBOLIC_MAX_CHARS` with a
counted warning; the cheap checks now stop at `GRADE_MAX_CHARS` the same way.
"""

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.math import math_reward_async, num_undecided
from slime_rollout.rewards.math_utils import grade_fast

GRADE_MAX_CHARS = 10_000  # `rewards.costly.GRADE_MAX_CHARS`, written out: the test reads the same number


async def test_a_huge_box_is_counted_undecided_and_names_the_sample(caplog):
    before = num_undecided()
    huge = "1, " * (GRADE_MAX_CHARS // 3 + 10)  # a list of parts just past the cap
    assert await math_reward_async(rf"So \boxed{{{huge}}}.", "5", num_workers=0, sample_index=41) == 0.0
    assert num_undecided() == before + 1
    [warning] = [r.getMessage() for r in caplog.records if "counted as wrong" in r.getMessage()]
    assert "sample 41" in warning
    assert f"an answer of {len(huge):,} characters, past the {GRADE_MAX_CHARS:,} graded" in warning


def test_an_answer_at_the_cap_is_still_graded():
    at_cap = "1" * GRADE_MAX_CHARS
    before = num_undecided()
    assert rule_based_reward("math", rf"\boxed{{{at_cap}}}", at_cap) == 1.0
    assert num_undecided() == before


def test_grade_fast_does_not_read_past_the_cap():
    long = "x" * (GRADE_MAX_CHARS + 1)
    # Undecided, the texts as given (not cleaned): the symbolic check then skips them as too long.
    assert grade_fast(long, long) == (None, long, long)
    assert grade_fast(r"\text{5}", "5")[0] is True


def test_the_cap_is_the_graders():
    from slime_rollout.rewards.costly import GRADE_MAX_CHARS as cap

    assert cap == GRADE_MAX_CHARS
