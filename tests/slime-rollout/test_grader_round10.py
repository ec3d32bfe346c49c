r"""Issue 27, round 10: dashes and full-width forms, the real line in words, roman-numeral statements, Python powers.

Each case was scored against the label as a careful grader reads it; `None` marks no case. Right answers score 1,
near misses 0, through `rule_based_reward("math", ...)` (the path every math grader shares).
"""

import time

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.roman_options import RomanOptions, roman_options
from slime_rollout.rewards.unicode_math import ascii_forms


def _math(answer: str, label: str) -> float:
    return rule_based_reward("math", rf"The answer is \boxed{{{answer}}}.", label)


# An en/em dash where a minus can stand is a minus (it scored 0 against -12); between two values it is a range.
_DASHES = [
    ("–12", "-12", 1.0),
    ("—12", "-12", 1.0),
    ("(–1, 2)", "(-1, 2)", 1.0),
    ("x = –3", "x = -3", 1.0),
    (r"2 \times –3", "-6", 1.0),
    ("x ≤ –2", r"x \le -2", 1.0),  # after a Unicode relation (rewritten as LaTeX only later)
    ("10^{–3}", "0.001", 1.0),
    (r"[–1, 1]", "[-1, 1]", 1.0),
    ("x ≤ –2", r"x \le 2", 0.0),
    ("1990–2000", "1990-2000", 0.0),
    (r"\begin{pmatrix} –1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}-1\\2\end{pmatrix}", 1.0),
    ("–12", "12", 0.0),
    ("3–5", "-2", 0.0),  # a range, not 3 - 5
    ("3–5", "3-5", 0.0),
    ("(–1, 2)", "(1, 2)", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _DASHES)
def test_a_dash_is_a_minus_only_where_a_minus_can_stand(answer, label, expected):
    assert _math(answer, label) == expected


def test_ascii_forms_keeps_ranges_and_superscripts():
    assert ascii_forms("3–5") == "3–5"
    assert ascii_forms("pages 10 — 12") == "pages 10 — 12"
    assert ascii_forms("–3, 4–5") == "-3, 4–5"
    assert ascii_forms(r"\pi – 3") == r"\pi - 3"  # after a command's name: an operand ends there, a minus follows
    assert ascii_forms("x²＋½") == "x²+½"  # NFKC would give "x2+1⁄2": only the full-width block is rewritten
    # Linear: a long answer full of dashes and spaces is rewritten in well under a second (no tight bound).
    start = time.perf_counter()
    assert ascii_forms("1 – " * 50_000).count("-") == 0
    assert time.perf_counter() - start < 10


_FULL_WIDTH = [
    ("＋12", "12", 1.0),
    ("１２", "12", 1.0),
    ("－１２", "-12", 1.0),
    ("（１，２）", "(1, 2)", 1.0),
    ("＋12", "-12", 0.0),
    ("１２", "13", 0.0),
    ("（１，２）", "(2, 1)", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _FULL_WIDTH)
def test_full_width_forms_are_their_ascii(answer, label, expected):
    assert _math(answer, label) == expected


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        ("The answer is Ｂ.", "B", 1.0),
        ("The answer is Ｂ.", "C", 0.0),
        ("The answer is (B).", "Ｂ", 1.0),
        ("The answer is (C).", "Ｂ", 0.0),
        (r"\boxed{Ｄ}", "D", 1.0),
    ],
)
def test_gpqa_reads_full_width_letters(response, label, expected):
    assert rule_based_reward("gpqa", response, label) == expected


def test_gpqa_matches_full_width_option_texts():
    choices = ["Ｐａｒｉｓ", "London", "Rome", "Berlin"]
    assert rule_based_reward("gpqa", "Final answer: Paris", "Paris", {"choices": choices}) == 1.0
    assert rule_based_reward("gpqa", "Final answer: Rome", "Paris", {"choices": choices}) == 0.0
    assert rule_based_reward("gpqa", "The answer is (A).", "–3 J", {"choices": ["–3 J", "4 J"]}) == 1.0


def test_dapo_and_f1_read_full_width_forms():
    assert rule_based_reward("dapo", "Answer：１２", "12")["score"] == 1.0  # a full-width colon and digits
    assert rule_based_reward("dapo", "Answer：１３", "12")["score"] == -1.0
    assert rule_based_reward("f1", "Ｐａｒｉｓ", "Paris") == 1.0
    assert rule_based_reward("f1", "Ｌｏｎｄｏｎ", "Paris") == 0.0


_REALS = [
    (r"\text{all real numbers}", r"\mathbb{R}", 1.0),
    (r"\text{All real numbers}", r"(-\infty,\infty)", 1.0),
    (r"\text{all reals}", r"(-\infty, \infty)", 1.0),
    (r"(-\infty, \infty)", "all reals", 1.0),
    (r"\mathbb{R}", r"\text{all real numbers}", 1.0),
    ("ℝ", r"(-\infty,\infty)", 1.0),
    (r"\text{all real values of } x", r"\mathbb{R}", 0.0),  # "of" is not the bare phrase: left to string equality
    (r"\text{all real numbers}", r"[0,\infty)", 0.0),
    (r"\text{all real numbers except } 2", r"\mathbb{R}", 0.0),
    (r"\text{all positive reals}", r"\mathbb{R}", 0.0),
    (r"\text{no real numbers}", r"\mathbb{R}", 0.0),
    (r"\mathbb{R}^2", r"\mathbb{R}", 0.0),
    (r"\mathbb{Z}", r"\text{all real numbers}", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _REALS)
def test_the_real_line_in_words_and_symbols(answer, label, expected):
    assert _math(answer, label) == expected


_ROMAN = [
    (r"\text{I only}", r"\text{I only}", 1.0),
    (r"\text{I only}", "I", 1.0),
    ("I, III", r"\text{I and III}", 1.0),
    (r"\text{III and I}", "I, III", 1.0),
    (r"\text{Both I and III}", r"\text{I and III}", 1.0),
    (r"\text{I, II, and III}", r"\text{I, II and III}", 1.0),
    ("(i) and (iii)", r"\text{I and III}", 1.0),
    (r"\text{I and III are true}", r"\text{I and III}", 1.0),
    (r"\text{I \& III}", r"\text{I and III}", 1.0),
    (r"\text{I and III are not true}", r"\text{I and III}", 0.0),  # "not": no list of statements, compared as text
    (r"\text{I and not II}", r"\text{I only}", 0.0),
    (r"\text{II only}", r"\text{I only}", 0.0),
    (r"\text{I and II}", r"\text{I only}", 0.0),
    ("I, III", r"\text{I, II and III}", 0.0),
    (r"\text{I or II}", r"\text{I only}", 0.0),  # a hedge, whichever is right
    (r"\text{I or II}", r"\text{I and II}", 0.0),
    (r"\text{either II or III}", r"\text{II}", 0.0),
    (r"\text{maybe I}", r"\text{I}", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _ROMAN)
def test_roman_numeral_statements_are_compared_as_sets(answer, label, expected):
    assert _math(answer, label) == expected


def test_roman_options_reads_only_lists_of_statements():
    assert roman_options(r"\text{II and III}") == RomanOptions(frozenset({"II", "III"}), hedged=False)
    assert roman_options("I or II") == RomanOptions(frozenset({"I", "II"}), hedged=True)
    assert roman_options("i") is None  # the imaginary unit
    assert roman_options("2I") is None and roman_options("x and y") is None and roman_options("only") is None
    assert roman_options("IV, VI") == RomanOptions(frozenset({"IV", "VI"}), hedged=False)


# The original (THUDM/slime rm_hub/math_utils.py, grade_answer_sympy) reads `x**2` through sympy as `x^2` (1);
# math-verify does not parse `**` (0). `**` has no other meaning in an answer, so it is read as the power.
# `e^{i\pi}` against -1 scores 0 in both (the original refuses sympy for an integer label; math-verify keeps `i`
# a symbol): an unevaluated restatement of the question is no answer, and 0 stays.
_POWERS = [
    ("x^2", "x**2", 1.0),
    ("x^{2}+1", "x**2 + 1", 1.0),
    ("2^{n+1}", "2**(n+1)", 1.0),
    ("x^{-1}", "x**-1", 1.0),
    (r"6.02\times10^{23}", "6.02*10**23", 1.0),
    ("x^3", "x**2", 0.0),
    ("x^{2}+2", "x**2 + 1", 0.0),
    ("2^{n}", "2**(n+1)", 0.0),
    (r"e^{i\pi}", "-1", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _POWERS)
def test_python_style_powers_in_labels(answer, label, expected):
    assert _math(answer, label) == expected


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [("Answer: x^2", "x**2", 1.0), ("Answer: 2^{n+1}", "2**(n+1)", 1.0), ("Answer: x^3", "x**2", -1.0)],
)
def test_python_style_powers_for_dapo_string_checks(response, label, expected):
    # dapo grades without sympy: the label's power is spelled as LaTeX writes it (`x^2`, `2^{n+1}`).
    assert rule_based_reward("dapo", response, label)["score"] == expected


# A row break `\\` followed by a space was read as the LaTeX space `\ `, so `1 \\ 2` became `1\2`: every spaced
# pmatrix answer scored 0 against its own label.
_MATRICES = [
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", 1.0),
    (r"\begin{pmatrix} -1 \\ \frac{1}{2} \end{pmatrix}", r"\begin{pmatrix}-1\\\frac12\end{pmatrix}", 1.0),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", 1.0),
    (r"\begin{pmatrix} 1 \\[4pt] 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", 1.0),  # row spacing
    (r"\begin{pmatrix} 1 \\[4pt] 3 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", 0.0),
    (r"\begin{pmatrix} 1 \\ 3 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", 0.0),
    (r"\begin{pmatrix} 1 & 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", 0.0),
    (r"\begin{pmatrix} 1 & 2 \\ 4 & 3 \end{pmatrix}", r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _MATRICES)
def test_spaced_matrices_keep_their_rows(answer, label, expected):
    assert _math(answer, label) == expected


# Probed and already right (kept so they stay so): thin spaces, percent words, \pm, degrees, grouped thousands.
_PROBED = [
    (r"5\,\text{m}", "5", 1.0),
    (r"1\,000\,000", "10^6", 1.0),
    ("1 000 000", "1000000", 1.0),
    ("10^{6}", "1 000 000", 1.0),
    (r"50\%", "50 percent", 1.0),
    (r"\pm 2", "2, -2", 1.0),
    (r"30^\circ", "30", 1.0),
    ("1 000 001", "1000000", 0.0),
    (r"\pm\sqrt{2}", r"\sqrt{2}", 0.0),
    (r"\frac{\pi}{6}", r"30^\circ", 0.0),  # degrees and radians: the label's unit decides, as in the original
]


@pytest.mark.parametrize(("answer", "label", "expected"), _PROBED)
def test_probed_forms(answer, label, expected):
    assert _math(answer, label) == expected


# An alternative offered after the box in a typographic minus or as a roman numeral was not read as one (scored 1).
@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        (r"The answer is \boxed{5}. Perhaps it is –6.", "5", 0.0),
        (r"The answer is \boxed{5}, or maybe −6.", "5", 0.0),
        (r"The answer is \boxed{\text{I only}}. Maybe II.", r"\text{I only}", 0.0),
        (r"The answer is \boxed{\text{II and III}}. Perhaps I only.", r"\text{II and III}", 0.0),
        (r"The answer is \boxed{5}. Or I could double-check.", "5", 1.0),  # the pronoun I is no alternative
        (r"The answer is \boxed{\text{II and III}}.", r"\text{II and III}", 1.0),
        (r"The answer is \boxed{–5}, or -5 written plainly.", "-5", 1.0),  # the same value restated
    ],
)
def test_alternatives_after_the_box_in_dashes_and_numerals_are_hedges(response, label, expected):
    assert rule_based_reward("math", response, label) == expected
