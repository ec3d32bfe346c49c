r"""Issue 27, fresh hostile pass (round 8): "or" solution sets, 12/24-hour times, wrapped functions, Unicode math.

Each 1.0 case scored 0 before this pass: `x<1 \text{ or } x>2` was split at "or" into two parts against the
label's one union (either side the label); `5:30 PM` was compared with `17:30` as the text `5:30`;
`\operatorname{lcm}(4,6)` was unwrapped to the letters `lcm(4,6)`, which math-verify reads as l·c·m(4, 6); "infinity"
in words stayed letters; Unicode math (`√2`, `x²`, `½`, `3·4`) was read by nothing. The 0.0 cases are the near
misses that must stay wrong.
"""

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.inequalities import as_interval_union


def _score(answer: str, label: str) -> float:
    return rule_based_reward("math", f"So the answer is $\\boxed{{{answer}}}$.", label)


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        # A union of intervals written as inequalities joined by "or", either side the label.
        (r"x<1 \text{ or } x>2", r"(-\infty,1)\cup(2,\infty)", 1.0),
        (r"x < 1 or x > 2", r"(-\infty, 1) \cup (2, \infty)", 1.0),
        (r"(-\infty,1)\cup(2,\infty)", r"x<1 \text{ or } x>2", 1.0),
        (r"x \le -1 \lor x \ge 3", r"(-\infty,-1]\cup[3,\infty)", 1.0),
        (r"1 < x < 2 \text{ or } x \geq 5", r"(1,2)\cup[5,\infty)", 1.0),
        (r"2 > x > 1 \text{ or } x > 5", r"(1,2)\cup(5,\infty)", 1.0),
        (r"x<\frac{1}{2} \text{ or } x>\sqrt{2}", r"(-\infty,\frac12)\cup(\sqrt2,\infty)", 1.0),
        (r"x>2 \text{ or } x<1", r"x<1 \text{ or } x>2", 1.0),
        (r"x < 1,000 \text{ or } x > 2{,}000", r"(-\infty,1000)\cup(2000,\infty)", 1.0),
        (r"x < 1,000 \text{ or } x > 2{,}000", r"(-\infty,100)\cup(2000,\infty)", 0.0),
        (r"x < 1 \text{ or } x > 2", r"\{x \mid x<1 \text{ or } x>2\}", 1.0),
        (r"\{x : x \le 1 \lor x > 2\}", r"(-\infty,1]\cup(2,\infty)", 1.0),
        (r"\{x \mid x<1 \text{ or } x>3\}", r"x<1 \text{ or } x>2", 0.0),
        # Near misses: another endpoint, a closed end for an open one, another variable, one piece only.
        (r"x<1 \text{ or } x>3", r"(-\infty,1)\cup(2,\infty)", 0.0),
        (r"x \le 1 \text{ or } x>2", r"(-\infty,1)\cup(2,\infty)", 0.0),
        (r"(-\infty,1]\cup(2,\infty)", r"x<1 \text{ or } x>2", 0.0),
        (r"y<1 \text{ or } y>2", r"x<1 \text{ or } x>2", 0.0),
        (r"x<1", r"x<1 \text{ or } x>2", 0.0),
        (r"x<1 \text{ or } x>2", r"x<1", 0.0),
        (r"x>2", r"(-\infty,1)\cup(2,\infty)", 0.0),
        (r"1<x<2", r"x<1 \text{ or } x>2", 0.0),
        # Times of day: 12-hour with AM/PM and 24-hour name one minute of the day.
        (r"5:30 PM", "17:30", 1.0),
        (r"5:30 \text{ p.m.}", "17:30", 1.0),
        (r"17:30", r"5:30\text{ PM}", 1.0),
        (r"12:15 AM", "0:15", 1.0),
        (r"12:15 AM", "00:15", 1.0),
        (r"12:15 PM", "12:15", 1.0),
        (r"7:05pm", "19:05", 1.0),
        (r"5:30 AM", "17:30", 0.0),
        (r"5:30", "17:30", 0.0),
        (r"12:15 PM", "0:15", 0.0),
        (r"5:30 PM", "5:30 AM", 0.0),
        (r"5:75 PM", "18:15", 0.0),
        # Functions written as `\operatorname{...}`, `\mathrm{...}`, `\text{...}` or bare before "(".
        (r"\operatorname{lcm}(4,6)", "12", 1.0),
        (r"\operatorname{gcd}(12,18)", "6", 1.0),
        (r"\mathrm{lcm}(4, 6)", "12", 1.0),
        (r"\text{gcd}(12, 18)", "6", 1.0),
        (r"lcm(4,6)", "12", 1.0),
        (r"\operatorname{max}(3, 5)", "5", 1.0),
        (r"\operatorname{lcm}(4,6)", r"\text{lcm}(4,6)", 1.0),
        (r"\operatorname{arctan}(1)", r"\frac{\pi}{4}", 1.0),
        (r"\operatorname{lcm}(4,6)", "24", 0.0),
        (r"\operatorname{gcd}(12,18)", "3", 0.0),
        (r"\operatorname{min}(3, 5)", "5", 0.0),
        (r"\operatorname{arctan}(1)", r"\frac{\pi}{3}", 0.0),
        # Unicode math, as chat models write it, is the LaTeX it stands for.
        ("√2", r"\sqrt{2}", 1.0),
        ("2√2", r"\sqrt8", 1.0),
        ("√3/2", r"\frac{\sqrt3}{2}", 1.0),
        ("√(x+1)", r"\sqrt{x+1}", 1.0),
        ("∛8", "2", 1.0),
        ("x² + 1", "x^2+1", 1.0),
        ("10⁻³", "0.001", 1.0),
        ("½", r"\frac12", 1.0),
        ("1½", "1.5", 1.0),
        ("⅔", r"0.\overline{6}", 1.0),
        ("3·4", "12", 1.0),
        ("12 cm²", "12 cm^2", 1.0),
        ("½, ⅓", r"\frac12, \frac13", 1.0),
        ("√2", r"\sqrt{3}", 0.0),
        ("x³", "x^2", 0.0),
        ("3²", "6", 0.0),
        ("½", r"\frac13", 0.0),
        ("12 cm²", r"12\text{ cm}", 0.0),
        # Scientific notation with a letter x or * for the times sign.
        (r"6.02 x 10^{23}", r"6.02\times10^{23}", 1.0),
        (r"6.02*10^23", "602000000000000000000000", 1.0),
        (r"6.02 x 10^{23}", r"6.02\times10^{22}", 0.0),
        (r"x10^{2}", "100", 0.0),
        # Unit words that are also function names stay units.
        (r"5\text{ min}", "5", 1.0),
        (r"5\text{ min}", r"5\text{ sec}", 0.0),
        (r"30\text{ sec}", r"30 \text{ s}", 1.0),
        # Infinity in words is the value.
        (r"\infty", "infinity", 1.0),
        (r"\text{Infinity}", r"\infty", 1.0),
        (r"(-\text{infinity}, 1)", r"(-\infty,1)", 1.0),
        (r"-\text{infinity}", r"\infty", 0.0),
        (r"\text{infinitely many}", r"\infty", 0.0),
    ],
)
def test_round8_answer_forms(answer: str, label: str, expected: float) -> None:
    assert _score(answer, label) == expected


def test_interval_union_reads_pieces_and_refuses_the_rest() -> None:
    assert as_interval_union(r"x<1 \text{ or } x\geq 2") == ("x", r"(-\infty,1)\cup[2,\infty)")
    assert as_interval_union(r"-3 \le t < 0 \vee t > 4") == ("t", r"[-3,0)\cup(4,\infty)")
    assert as_interval_union("x > 2") is None  # one piece: only with min_pieces=1
    assert as_interval_union("x > 2", min_pieces=1) == ("x", r"(2,\infty)")
    assert as_interval_union("x < a or x > b") is None  # letter endpoints
    assert as_interval_union("x < 1 or y > 2") is None  # two variables
    assert as_interval_union("x = 1 or x = 2") is None  # equations are listed answers, not a set
    assert as_interval_union("1 < x > 2 or x < 0") is None  # no interval
    assert as_interval_union("x < 1 or x > 2" * 100) is None  # too long to be one solution set
    assert as_interval_union(r"\{y \mid x<1 \text{ or } x>2\}") is None  # the set's variable is not the pieces'


def test_a_hedge_between_boxed_unions_stays_wrong() -> None:
    response = r"Either $\boxed{x<1 \text{ or } x>2}$ or $\boxed{x<0 \text{ or } x>3}$."
    assert rule_based_reward("math", response, r"(-\infty,1)\cup(2,\infty)") == 0.0


def test_many_different_boxes_are_a_hedge_judged_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every box was compared with every earlier distinct one: 1,000 different boxes (12 KB) took 29 s of inline
    # CPU, 3,000 took 291 s. Now the answers are compared with the first one only, and stop at a difference.
    from slime_rollout.rewards import math_utils

    calls = []
    real = math_utils.grade_fast
    monkeypatch.setattr(math_utils, "grade_fast", lambda p, g: calls.append(p) or real(p, g))
    response = " ".join(rf"\boxed{{{i}}}" for i in range(1000))
    assert rule_based_reward("math", response, "5") == 0.0
    assert len(calls) <= 2
    # One value restated in a few spellings is still one answer; the same box repeated is compared once.
    calls.clear()
    assert rule_based_reward("math", r"\boxed{5} " * 1000 + r"so $\boxed{5.0}$, i.e. $\boxed{x = 5}$", "5") == 1.0
    assert len(calls) <= 4
    # More spellings than a restatement has: a hedge.
    spellings = " ".join(rf"\boxed{{5{'.' if k else ''}{'0' * k}}}" for k in range(20))
    assert rule_based_reward("math", spellings, "5") == 0.0


def test_only_the_last_boxes_are_read_for_the_final_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every box of the response went through the negation checks (~75 µs each): 100,000 boxes (1 MB) held the
    # event loop, where grading runs, for 4.5 s. The final statement is at the end: the last 256 boxes are read.
    from slime_rollout.rewards import answers

    checked = []
    real = answers.negated_before
    monkeypatch.setattr(answers, "negated_before", lambda text: checked.append(text) or real(text))
    final = answers.final_boxed_answers(r"\boxed{5} " * 10_000)
    assert final.answers == ["5"] * 256 and final.num_superseded == 10_000 - 256
    assert len(checked) == 256
    assert rule_based_reward("math", r"\boxed{5} " * 10_000, "5") == 1.0
    assert rule_based_reward("math", r"\boxed{4}. Hmm. " * 5_000 + r"So $\boxed{5}$.", "5") == 1.0
    assert rule_based_reward("math", " ".join(rf"\boxed{{{i}}}" for i in range(5_000)), "4999") == 0.0  # a hedge


def test_gpqa_reads_only_the_last_letters_for_its_fallback_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every capital letter got a negation check: "not A, " × 140,000 (1 MB) held the event loop 4.7 s.
    from slime_rollout.rewards import gpqa

    checked = []
    real = gpqa.negated_before
    monkeypatch.setattr(gpqa, "negated_before", lambda text: checked.append(text) or real(text))
    metadata = {"choices": ["12 J", "42 J", "7 J", "0 J"]}
    assert rule_based_reward("gpqa", "not A, " * 10_000, "A", metadata) == 0.0
    assert len(checked) <= 256
    assert rule_based_reward("gpqa", "Hmm. " * 10_000 + "I pick B", "B", metadata) == 1.0
