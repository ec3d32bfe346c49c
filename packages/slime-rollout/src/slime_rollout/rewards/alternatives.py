r"""An unboxed alternative after the last box: `\boxed{6}. I'm not sure, it might be 5.` is a hedge.

A careful grader reads "\boxed{6} or 5", "\boxed{6}. Maybe it's 5.", "\boxed{6}, or perhaps \(\frac12\)",
"\boxed{6}, unless it is 5" and "\boxed{6}, though 5 is possible too" as two answers offered at once, which is
wrong whichever is right. `unboxed_alternative` finds them in the first two sentences after the last box:

* a lead that offers another answer ("or", "maybe", "perhaps", "possibly", "alternatively", "otherwise", "unless",
  "could / might / may (also) be", "another answer is"), then at most a few filler words ("it is", "the answer
  is", "x ="), then a value (a number, its sign maybe a dash `–6`, number words, roman-numeral statements `II`,
  or a formula: `\frac`, `\sqrt`, `\pi`, math in `$...$` or `\(...\)`) that ends its clause ("5.", "5)", "5
  though", "5 if n is odd");
* or a value said to be "also possible / plausible / valid" or "possible too / as well".

The value must differ from the box ("\boxed{5} or 5.0" and "\boxed{\frac12} or 0.5" restate it). A lead right after
another value is part of a derivation, not an alternative ("attained when n = 2 or 3"), and so is a value that goes
on ("Perhaps 2 more checks would help"); an alternative rejected right after it is none either ("Or is it 6? No, 5
is right.", "It might be 6, but 6 gives 13, so no."). gpqa reads option letters the same way after its stated pick
("Answer: B. Hmm, or C.", "Option C might also be correct").
"""

from __future__ import annotations

import re
from collections.abc import Callable

from slime_rollout.rewards.retraction import expand_contractions
from slime_rollout.rewards.roman_options import STATEMENTS_IN_TEXT

__all__ = ["unboxed_alternative"]

AFTER_CHARS = 300  # text after the last box that is read
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
# Math delimiters and text wrappers are dropped so that "$5$", "\(5\)" and "\text{or 5}" read as "5" and "or 5".
_MARKUP = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{|\\[\[\]()]|\$|\\[,;:! ]|\\q?quad")
_NUMBER_WORD = (
    r"(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen"
    r"|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million"
    r"|billion|half|halves|thirds?|quarters?|fourths?|fifths?)"
)
_BRACED = r"\{[^{}]{0,40}\}"
# A sign may be a typographic minus or dash ("Perhaps it is –6."): `differs` reads it (`unicode_math.ascii_forms`).
_SIGN = r"[-\u2212\u2012-\u2015]?"
_FRAC = r"\\[dt]?frac\s*(?:" + _BRACED + r"|\d)\s*(?:" + _BRACED + r"|\d)"
_VALUE = (
    r"(?P<value>(?<![A-Za-z])" + STATEMENTS_IN_TEXT + "|" + _SIGN + r"\s*(?:" + _FRAC +
    r"|\\sqrt\s*(?:\[[^\]]{0,10}\])?\s*(?:" + _BRACED + r"|\d+)|\\pi\b"
    r"|\d[\d.,/]*\d(?:\s*\\%|\s*%)?|\d(?:\s*\\%|\s*%)?"
    r"|(?<![A-Za-z])" + _NUMBER_WORD + r"(?:[\s-]+(?:and\s+|a\s+)*" + _NUMBER_WORD + r")*\b))"
)  # fmt: skip
# An option letter, for gpqa ("Answer: B. Hmm, or C."): a capital, maybe in brackets or after "option".
_LETTER_VALUE = r"(?:(?:option|choice)\s+)?\(?(?P<value>(?-i:[A-Z]))\)?"
# What may stand between a lead and its value ("or maybe it is 5", "or the answer is x = 5").
# One word per step and each step atomic: overlapping choices ("it is" and "it" + "is") made the match exponential in
# the number of fillers (" it is" × 15 took minutes).
_FILLER = (
    r"(?>[\s,:;(]+(?:also|else|maybe|possibly|perhaps|even|just|it|its|is|be|the answer|the result|I think|I guess"
    r"|[a-z]\s*=)\b)*"
)
_LEAD = (
    r"\b(?:or|maybe|perhaps|possibly|alternatively|otherwise|unless|(?:could|might|may)(?:\s+also)?\s+be"
    r"|another (?:possible )?(?:answer|value|solution|possibility|option|candidate)"
    r"(?:\s+(?:is|would be|could be|might be))?)"
)
# The value ends its clause: the sentence or bracket ends, or a hedge word or a condition follows.
_CLAUSE_END = r"(?=\s*(?:$|[.,;!?)\]}]|(?:though|instead|too|as well|if|when|depending|I|but)\b))"
_POSSIBLE = r"(?:possible|plausible|valid|acceptable|work|correct|right)"


def _patterns(value: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The lead form and the "also possible" form for one kind of value (`_VALUE` or `_LETTER_VALUE`)."""
    led = re.compile(_LEAD + _FILLER + r"[\s,:;(]*" + value + _CLAUSE_END, re.IGNORECASE)
    also = re.compile(
        r"(?<![\w.,/\\])"
        + value
        + r"\s+(?:is|would|could|might|may|seems)\s+(?:be\s+)?(?:also\s+(?:be\s+)?"
        + _POSSIBLE
        + r"|"
        + _POSSIBLE
        + r"\s+(?:too|as well))\b",
        re.IGNORECASE,
    )
    return led, also


_NUMBER_PATTERNS = _patterns(_VALUE)
_LETTER_PATTERNS = _patterns(_LETTER_VALUE)
# A lead right after a value ("n = 2 or 3", "2, possibly 3") continues a derivation.
_VALUE_BEFORE = re.compile(r"(?:\d|\}|\\pi)[\s,]*$")
# An alternative considered and rejected right after it is no hedge ("Or is it 6? No, 5 is right.", "It might be 6,
# but 6 gives 13, so no.", "Maybe 6? ... so 5."): a "no", a verdict against it, or a conclusion that returns to the box.
_REJECT_CHARS = 160
_NO = re.compile(
    r"(?:^|[.?!;:,]\s*|\b(?:but|so|then)\s+)(?:no|nope|nah)(?=\s*(?:[,.;:!?]|$))",  # "No, ...", not "no idea"
    re.IGNORECASE,
)
_VERDICT = r"(?:fails|does not (?:work|satisfy|fit)|is (?:wrong|incorrect|impossible|ruled out|rejected)|contradicts)\b"
# A verdict on the alternative itself: right after it ("6? That fails"), or naming it again ("6 gives 13, so 6 fails").
_AGAINST_AT = re.compile(r"^[\s,;:?.!-]*(?:(?:but|which|and)\s+)?(?:(?:that|this|it)\s+)?" + _VERDICT, re.IGNORECASE)
_AGAINST_NAMED = re.compile(r"(?<![\w.])(?P<named>[^\s,;:?.!]+)\s+" + _VERDICT, re.IGNORECASE)
# The condition of a counterfactual alternative denied right after it ("5 if we counted zero, but we do not").
_DENIED = re.compile(
    r"^[^.?!]{0,80}?\bbut\s+(?:we|it|they|this|that|there|the \w+)\s+(?:do|does|did|is|are|was|were|has|have)\s+not\b",
    re.IGNORECASE,
)


def _back_to(value: str) -> re.Pattern[str]:
    """A conclusion naming a value again ("so 5", "it is B", "5 is right"): with the box's value, a rejection."""
    return re.compile(
        r"\b(?:so|thus|hence|therefore|answer is|stick with|go with|keep|it is|this is|that is)\s+"
        r"(?:it is\s+|the answer is\s+)?"
        + value
        + r"|"
        + value.replace("?P<value>", "?P<again>")
        + r"\s+(?:is|it is)\s+(?:right|correct|the answer)\b",
        re.IGNORECASE,
    )


_NUMBER_BACK_TO = _back_to(_VALUE)
_LETTER_BACK_TO = _back_to(_LETTER_VALUE)


def _rejected(alternative: str, rest: str, differs: Callable[[str], bool], back_to: re.Pattern[str]) -> bool:
    """Whether `rest`, the text right after `alternative`, rejects it.

    By a "no", a verdict on it, its condition denied, or a conclusion `back_to` the box's value.
    """
    rest = rest[:_REJECT_CHARS]
    if _NO.search(rest) or _AGAINST_AT.match(rest) or _DENIED.match(rest):
        return True
    if any(m.group("named") == alternative.strip() for m in _AGAINST_NAMED.finditer(rest)):
        return True
    for m in back_to.finditer(rest):
        value = m.group("value") or m.group("again")
        if value and not differs(value):
            return True
    return False


def unboxed_alternative(after: str, differs: Callable[[str], bool], *, letters: bool = False) -> bool:
    r"""Whether the text after the last box offers another value without a box (the module docstring).

    Args:
        after: the text that follows the last box (only its first `AFTER_CHARS` characters are read).
        differs: whether a value (its text, e.g. "5", "\frac{1}{2}", "five") differs from the box's answer.
        letters: read option letters ("or C", "C might also be correct": gpqa) instead of numbers and formulas.

    Returns:
        True when the first two sentences after the box offer a different value as an alternative.
    """
    text = expand_contractions(_MARKUP.sub(" ", after[:AFTER_CHARS])).strip().lstrip(".,;:!? ")
    near = " ".join(_SENTENCE_BREAK.split(text, maxsplit=2)[:2])
    led, also = _LETTER_PATTERNS if letters else _NUMBER_PATTERNS
    back_to = _LETTER_BACK_TO if letters else _NUMBER_BACK_TO
    for match in [*led.finditer(near), *also.finditer(near)]:
        if match.re is led and match.start() > 0 and _VALUE_BEFORE.search(near[: match.start()]):
            continue
        value = match.group("value")
        if differs(value) and not _rejected(value, text[match.end() :], differs, back_to):
            return True
    return False
