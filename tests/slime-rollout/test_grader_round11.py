r"""Issue 27, round 11: typesetting around an answer (MATH's `10,\!000`, colours, font switches, spacing), `\frac\pi3`,
`0.\bar{3}`, `-\infty < x < \infty`.

Each right answer scored 0 before (the defect); the near misses next to it keep scoring 0. All go through
`rule_based_reward("math", ...)`, the path every math grader shares; labels are read as the data sets write them.
"""

import time

import pytest

from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.markup import strip_markup
from slime_rollout.rewards.normalize import clean_answer, parse_number
from slime_rollout.rewards.parts import answer_parts


def _math(answer: str, label: str) -> float:
    return rule_based_reward("math", rf"The answer is \boxed{{{answer}}}.", label)


# MATH writes thousands as `10,\!000` (a negative thin space closes the gap after the comma); the original removes
# `\!` and `,\!`. Here `\!` became a space, so `10, 000` was read as the two parts 10 and 0.
_THOUSANDS = [
    ("10000", r"10,\!000", 1.0),
    (r"10,\!000", "10000", 1.0),
    (r"\$1,\!000", "1000", 1.0),
    ("1234567", r"1,\!234,\!567", 1.0),
    ("10001", r"10,\!000", 0.0),
    ("10, 0", r"10,\!000", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _THOUSANDS)
def test_math_thousands_separator(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


def test_a_closed_up_thousands_separator_is_one_part() -> None:
    assert answer_parts(r"10,\!000") == ["10000"]
    assert answer_parts(r"1, 2") == ["1", "2"]  # a list keeps its parts


# Presentational markup inside a box (or a label): the value is what it wraps.
_MARKUP = [
    (r"\textcolor{red}{5}", "5", 1.0),
    (r"\color{red}5", "5", 1.0),
    (r"{\color{blue} \frac{1}{2}}", "0.5", 1.0),
    (r"\underline{5}", "5", 1.0),
    (r"\bf 5", "5", 1.0),
    (r"{\bf 5}", "5", 1.0),
    (r"\large 5", "5", 1.0),
    (r"\hspace{1cm}5", "5", 1.0),
    (r"5\kern2pt", "5", 1.0),
    (r"\boldsymbol{\frac{3}{4}}", "0.75", 1.0),
    (r"\bm{x} = 3", "3", 1.0),
    (r"\colorbox{yellow}{$12$}", "12", 1.0),
    (r"\textcolor[rgb]{1,0,0}{\sqrt{2}}", r"\sqrt2", 1.0),
    (r"\emph{(B)}", "B", 1.0),
    ("5", r"\underline{5}", 1.0),
    (r"\textcolor{red}{6}", "5", 0.0),
    (r"\underline{5}", "6", 0.0),
    (r"\bf 6", "5", 0.0),
    (r"\hspace{5cm}6", "5", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _MARKUP)
def test_markup_around_the_value(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


def test_meaningful_commands_stay() -> None:
    assert strip_markup(r"0.\overline{3}") == r"0.\overline{3}"  # a repeating decimal, not decoration
    assert strip_markup(r"5\text{ cm}") == r"5\text{ cm}"  # a unit, read by `units`
    assert strip_markup(r"\rm{lcm}(4,6)") == r"\rm{lcm}(4,6)"  # a function name, read by `normalize`
    assert strip_markup(r"\{1, 2\}") == r"\{1, 2\}"  # set braces are no group
    assert strip_markup(r"\textcolor{red}{5") == r"\textcolor{red}{5"  # an unclosed argument: as written
    assert _math(r"\rm{lcm}(4,6)", "12") == 1.0


def test_markup_stripping_is_linear() -> None:
    # Nested and unclosed wrappers: one scan of the markup, one of the braces.
    for text in (r"\underline{" * 50_000 + "5" + "}" * 50_000, r"\textcolor{red}{" * 50_000, r"\bf" * 100_000):
        start = time.perf_counter()
        strip_markup(text)
        assert time.perf_counter() - start < 5.0  # ~0.1 s here; quadratic work took minutes


class _CopyCountingText(str):
    """Text that counts the characters its slices and strips copy."""

    copied = 0

    def _counted(self, piece: str) -> "_CopyCountingText":
        type(self).copied += len(piece)
        return _CopyCountingText(piece)

    def __getitem__(self, key):  # type: ignore[override]
        return self._counted(str.__getitem__(self, key))

    def strip(self, chars=None):  # type: ignore[override]
        return self._counted(str.strip(self, chars))


def test_math_delimiters_are_taken_off_in_linear_work() -> None:
    # A box of nested `$` was cut one pair per slice, each copying the rest: 1 MB took 14 s of inline CPU in
    # `grade_fast`, on the event loop and outside every grading deadline.
    from slime_rollout.rewards.normalize import _strip_delimiters

    n = 10_000
    _CopyCountingText.copied = 0
    assert _strip_delimiters(_CopyCountingText("$" * n + " 5 " + "$" * n)) == "5"
    assert _CopyCountingText.copied <= 4 * n  # was about 2n² characters
    assert _strip_delimiters(r" $ \( \frac12 \) $ ") == r"\frac12"
    assert _strip_delimiters(r"\[x\]") == "x"
    assert _strip_delimiters("$5") == "$5"
    assert _strip_delimiters("$$") == ""
    # Graded whole up to `GRADE_MAX_CHARS` (10,000 characters; a longer answer is not compared, counted undecided).
    m = 4_000
    assert rule_based_reward("math", r"So \boxed{" + "$" * m + "5" + "$" * m + "}.", "5") == 1.0


# `\frac` with a command as an unbraced argument, as TeX reads it.
_FRACTIONS = [
    (r"\frac{\pi}{3}", r"\frac\pi3", 1.0),
    (r"\frac\pi3", r"\frac{\pi}{3}", 1.0),
    (r"\frac{\pi}3", r"\frac{\pi}{3}", 1.0),
    (r"\dfrac\pi 4", r"\frac{\pi}{4}", 1.0),
    (r"\frac\pi3", r"\frac{\pi}{4}", 0.0),
    (r"\sfrac{1}{2}", "0.5", 1.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _FRACTIONS)
def test_unbraced_fraction_arguments(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


def test_unbraced_fraction_text() -> None:
    assert clean_answer(r"\frac\pi3").text == r"\frac{\pi}{3}"
    assert clean_answer(r"\frac12").text == r"\frac{1}{2}"
    assert clean_answer(r"\fraction").text == r"\fraction"


# A repeating decimal with a bar (`\bar`, as well as `\overline` and `\dot`).
@pytest.mark.parametrize(
    ("answer", "value"),
    [(r"0.\bar{3}", "1/3"), (r"0.\bar3", "1/3"), (r"0.1\bar{6}", "1/6"), (r"-2.\bar{18}", "-24/11")],
)
def test_bar_repeating_decimal(answer: str, value: str) -> None:
    from fractions import Fraction

    assert parse_number(answer) == Fraction(value)
    assert _math(answer, str(Fraction(value))) == 1.0


def test_bar_repeating_decimal_near_miss() -> None:
    assert _math(r"0.\bar{3}", "0.3") == 0.0
    assert _math(r"0.\bar{3}", r"\frac{3}{10}") == 0.0


# The real line written as an inequality that bounds nothing.
_REAL_LINE = [
    (r"-\infty < x < \infty", r"(-\infty,\infty)", 1.0),
    (r"(-\infty,\infty)", r"-\infty < x < \infty", 1.0),
    (r"-\infty < x < \infty", r"\mathbb{R}", 1.0),
    (r"-\infty < x < 3", r"(-\infty,\infty)", 0.0),
    (r"-\infty < x < \infty", r"(0,\infty)", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _REAL_LINE)
def test_real_line_as_an_inequality(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


# Growing functions of unevaluated arithmetic: `(10^{100})!` parses as factorial(Pow(10, 100)), which the literal
# check missed; sympy then recursed for 17.5 s against a 10 s budget (`\binom{10^6}{5\cdot10^5}`: the whole budget,
# `\Gamma(10^6)`: 5.7 s). Their argument is estimated now, and they are not evaluated.
@pytest.mark.parametrize(
    "answer",
    [r"(10^{100})!", r"\binom{10^{6}}{5\cdot 10^{5}}", r"\Gamma(10^{6})", r"(2 \cdot 10^{4})!", r"2^{(10)(10^{5})}"],
)
def test_growing_functions_of_big_values_are_not_evaluated(answer: str) -> None:
    from math_verify import parse

    from slime_rollout.rewards.costly import tree_too_big
    from slime_rollout.rewards.math_utils import symbolic_equal_with_timeout

    assert tree_too_big(parse(rf"\boxed{{{answer}}}", parsing_timeout=None)[0])
    start = time.perf_counter()
    assert symbolic_equal_with_timeout("5", answer, 10.0) is None  # undecided: too costly, counted wrong
    assert time.perf_counter() - start < 8.0  # ~0.5 s here; over 17 s before


@pytest.mark.parametrize(
    ("answer", "label"),
    [
        ("5!", "120"),
        (r"\binom{10}{3}", "120"),
        (r"\Gamma(5)", "24"),
        (r"(2^{3})!", "40320"),
        (r"\binom{2 \cdot 5}{3}", "120"),
    ],
)
def test_small_growing_functions_are_still_evaluated(answer: str, label: str) -> None:
    assert _math(answer, label) == 1.0


# Invisible characters (format characters, variation selectors) and mathematical alphanumerics: a reader sees `5`,
# `12`, `2π`; each scored 0 (a label scraped from a web page carries zero-width spaces and soft hyphens).
_INVISIBLE = [
    ("5\u200b", "5", 1.0),
    ("\ufeff5", "5", 1.0),
    ("5\ufe0f", "5", 1.0),
    ("5\u00ad", "5", 1.0),
    ("1\u200b2", "12", 1.0),
    ("5", "\u200e5\u200f", 1.0),
    ("2\U0001d70b", r"2\pi", 1.0),  # mathematical italic pi
    ("\U0001d7d3", "5", 1.0),  # mathematical bold digit five
    ("6\u200b", "5", 0.0),
    ("2\U0001d70b", r"3\pi", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _INVISIBLE)
def test_invisible_characters_and_math_alphanumerics(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


def test_invisible_characters_in_other_graders() -> None:
    assert rule_based_reward("dapo", "Answer: 1\u200b000", "1000")["acc"] is True
    assert rule_based_reward("gpqa", "Answer: B\u200b", "B") == 1.0
    assert rule_based_reward("f1", "Par\u00adis", "Paris") == 1.0


# A remark in parentheses after the value, inside the box or the label: words only (it scored 0 as `5(verified)`).
_REMARKS = [
    (r"5 \text{ (verified)}", "5", 1.0),
    (r"5 \quad \text{(checked)}", "5", 1.0),
    (r"5 (approx.)", "5", 1.0),
    ("5", r"5 \text{ (approximately)}", 1.0),
    (r"12 \text{ (in centimeters)}", "12", 1.0),
    (r"x + 1 \text{ (simplified)}", "1 + x", 1.0),
    (r"6 \text{ (verified)}", "5", 0.0),
    # Remarks that change the answer stay, and so do products and option names.
    (r"5 \text{ (or 6)}", "5", 0.0),
    (r"5 \text{ (if n is odd)}", "5", 0.0),
    (r"5 \text{ (not simplified)}", "5", 0.0),
    (r"2 (ab)", "2", 0.0),
    (r"5 (II)", "5", 0.0),
]


@pytest.mark.parametrize(("answer", "label", "expected"), _REMARKS)
def test_a_remark_after_the_value(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


def test_products_are_no_remarks() -> None:
    assert clean_answer("2(ab)").text == "2(ab)"
    assert clean_answer("2 (ab)").text == "2(ab)"
    assert clean_answer("f(x)").text == "f(x)"


# A label that is a worked solution boxing several parts in its final statement: all of them are the answer, read by
# the rule a response's final boxes are read by. As its last box alone, the whole answer scored 0 and half of it 1.
_SOLUTION = r"Solving the system, $x = \boxed{2}$ and $y = \boxed{3}$."
_TWO_STATEMENTS = r"In the first case we get $\boxed{4}$, which is impossible. So the total is $\boxed{7}$."


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        (r"\boxed{2}, \boxed{3}", _SOLUTION, 1.0),
        (r"$x = \boxed{2}$, $y = \boxed{3}$", _SOLUTION, 1.0),
        (r"\boxed{2, 3}", _SOLUTION, 1.0),
        (r"\boxed{3}", _SOLUTION, 0.0),  # half the answer
        (r"$x = \boxed{3}$, $y = \boxed{2}$", _SOLUTION, 0.0),  # labelled parts in the label's order
        (r"\boxed{7}", _TWO_STATEMENTS, 1.0),  # an earlier statement's box is superseded
        (r"\boxed{4}, \boxed{7}", _TWO_STATEMENTS, 0.0),
        (r"\boxed{5}", r"So $\boxed{5}$, that is $\boxed{5.0}$.", 1.0),  # a restatement is one part
    ],
)
def test_a_solution_label_with_several_final_boxes(response: str, label: str, expected: float) -> None:
    assert rule_based_reward("math", response, label) == expected


def test_label_answer_of_a_solution() -> None:
    from slime_rollout.rewards.math_utils import extract_label_answer

    assert extract_label_answer(_SOLUTION) == "2, 3"
    assert extract_label_answer(_TWO_STATEMENTS) == "7"
    assert extract_label_answer(r"$\boxed{12}$") == "12"


# A multi-part answer written in sentences: each box named in words. It was read as a derivation, the last box
# superseding the others, and scored 0 against the label's parts.
_NAMED_PARTS = [
    (r"The minimum is \boxed{2} and the maximum is \boxed{3}.", "2, 3", 1.0),
    (r"The value for $x$ is \boxed{2} and for $y$ is \boxed{3}.", "x = 2, y = 3", 1.0),
    (r"The smallest is \boxed{2}, the largest is \boxed{3}.", "2, 3", 1.0),
    (r"\boxed{2} for part (a) and \boxed{3} for part (b).", "2, 3", 1.0),
    (r"(a) The area is \boxed{2}. (b) The perimeter is \boxed{3}.", "2, 3", 1.0),
    (r"The minimum is \boxed{3} and the maximum is \boxed{2}.", "2, 3", 0.0),  # named parts in the label's order
    (r"The minimum is \boxed{2} and the maximum is \boxed{4}.", "2, 3", 0.0),
    # Not parts: an intermediate result against a one-part label, a recomputation, a correction.
    (r"The discriminant is \boxed{9}. So the root is \boxed{3}.", "3", 1.0),
    (r"The area is \boxed{2}. Recomputing, the area is \boxed{3}.", "3", 1.0),
    (r"The area is \boxed{2}. Recomputing, the area is \boxed{3}.", "2, 3", 0.0),
    (r"The minimum is \boxed{2}. That is wrong; the minimum is \boxed{3}.", "2, 3", 0.0),
    (r"We get \boxed{2}. Then the answer is \boxed{3}.", "2, 3", 0.0),
]


@pytest.mark.parametrize(("response", "label", "expected"), _NAMED_PARTS)
def test_parts_named_in_words(response: str, label: str, expected: float) -> None:
    assert rule_based_reward("math", response, label) == expected


def test_named_parts_rule() -> None:
    from slime_rollout.rewards.named_parts import names_next_part

    assert names_next_part("The minimum is ", " and the maximum is ")
    assert names_next_part("", ". (b) The perimeter is ")
    assert not names_next_part("The answer is ", ". So the answer is ")
    assert not names_next_part("The area is ", ". Oops, I made a mistake. The perimeter is ")
    assert not names_next_part("", " and " + "x " * 200 + "the maximum is ")  # a long derivation


# A float label (a numeric Parquet or JSON column) of a non-terminating value: the column cannot hold 1/3, so the
# exact answer scored 0 against it. It is the simplest fraction whose float it is; short decimals are as typed.
@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        (r"\frac{1}{3}", 1 / 3, 1.0),
        (r"0.\overline{3}", 1 / 3, 1.0),
        (r"-\frac{2}{3}", -2 / 3, 1.0),
        (r"\frac{2}{7}", 2 / 7, 1.0),
        ("0.333", 1 / 3, 0.0),  # a rounded decimal is not the exact value
        (r"\frac{1}{3}", 0.333, 0.0),
        ("0.1", 0.1, 1.0),
        (r"\frac{1}{10}", 0.1, 1.0),
        ("2.5", 2.5, 1.0),
        ("18", 18.0, 1.0),
        ("3.14159", 3.14159, 1.0),
    ],
)
def test_float_labels(answer: str, label: float, expected: float) -> None:
    assert _math(answer, label) == expected
    assert rule_based_reward("dapo", f"Answer: {answer}", label)["acc"] is (expected == 1.0)


@pytest.mark.parametrize(
    "response",
    [r"\boxed{\underline{Paris}}", r"\boxed{\textcolor{red}{Paris}}", r"\boxed{\emph{Paris}}", r"\boxed{{\bf Paris}}"],
)
def test_f1_reads_through_typesetting(response: str) -> None:
    # `\underline{Paris}` was the token "underlineparis": F1 0 (`{\bf Paris}`: 0.67).
    assert rule_based_reward("f1", response, "Paris") == 1.0
    assert rule_based_reward("boxed_f1", f"So {response}.", "Paris") == 1.0


def test_a_colour_switch_before_a_letter() -> None:
    assert strip_markup(r"\color{red}x^2") == "x^2"  # the switch ends at its argument, whatever follows
    assert _math(r"{\color{red}x^2 + 1}", "x^2+1") == 1.0
    assert strip_markup(r"\itemize") == r"\itemize"  # a longer command is no switch


# Marks and layout around the value: a check mark, an end-of-proof mark, an equation tag, a closing row break, an
# arrow or "therefore" that opens it, a trailing semicolon. Each scored 0 against 5.
@pytest.mark.parametrize(
    "answer",
    [r"5 \checkmark", r"5 \qed", r"5 \blacksquare", r"5 \hfill", r"x = 5 \tag{1}", r"5 \label{eq:ans}", r"5 \\",
     r"\implies 5", r"\therefore x = 5", r"\Rightarrow 5", "5;"],
)  # fmt: skip
def test_marks_and_layout_around_the_value(answer: str) -> None:
    assert _math(answer, "5") == 1.0
    assert _math(answer.replace("5", "6"), "5") == 0.0


def test_marks_keep_what_has_a_value() -> None:
    assert _math(r"\approx 5", "5") == 0.0  # an approximation is not the exact value
    assert strip_markup(r"\begin{pmatrix}1\\2\end{pmatrix}") == r"\begin{pmatrix}1\\2\end{pmatrix}"
    start = time.perf_counter()
    strip_markup("\\\\ " * 100_000)  # closing row breaks: one backward scan
    assert time.perf_counter() - start < 5.0  # ~0.02 s here; 0.7 s with slices, quadratic


# A variable said to be in a set lists the set's elements (it was one part against the label's two: 0).
@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        (r"x \in \{1, 2\}", "1, 2", 1.0),
        (r"x_1 \in \{1, 2\}", "2, 1", 1.0),
        (r"x \in \{1, 2\}", r"\{1, 2\}", 1.0),
        (r"x \in \{1, 3\}", "1, 2", 0.0),
        (r"x \in \{1, 2, 3\}", "1, 2", 0.0),
        (r"x \in (1, 2)", r"\{1, 2\}", 0.0),  # an interval is not the set {1, 2}
    ],
)
def test_membership_in_a_listed_set(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


# A matrix typeset as an `array` between brackets is that matrix (math-verify reads pmatrix, not array: 0).
_ARRAY_MATRIX = r"\left(\begin{array}{cc} 1 & 2 \\ 3 & 4 \end{array}\right)"


@pytest.mark.parametrize(
    ("answer", "label", "expected"),
    [
        (_ARRAY_MATRIX, r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", 1.0),
        (r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", _ARRAY_MATRIX, 1.0),
        (r"\left[\begin{array}{c} 1 \\ 2 \end{array}\right]", r"\begin{bmatrix}1\\2\end{bmatrix}", 1.0),
        (_ARRAY_MATRIX.replace("3 & 4", "4 & 3"), r"\begin{pmatrix}1&2\\3&4\end{pmatrix}", 0.0),
    ],
)
def test_array_between_brackets_is_a_matrix(answer: str, label: str, expected: float) -> None:
    assert _math(answer, label) == expected


def test_array_rewriting_is_linear() -> None:
    from slime_rollout.rewards.normalize import _array_as_matrix

    for text in ("(\\begin{array}{c}" * 50_000 + "\\end{array}", "(\\begin{array}{c}1\\end{array})" * 30_000):
        start = time.perf_counter()
        _array_as_matrix(text)
        assert time.perf_counter() - start < 5.0  # ~0.03 s here; slicing the prefix per array took 1 s, quadratic
