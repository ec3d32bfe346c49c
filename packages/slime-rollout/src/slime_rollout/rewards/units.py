r"""Units after a number in a final answer: which trailing words are a unit, and the unit's one spelling.

A unit is taken off an answer only when what is left is a number (so the value does not change), and only when it
is one of:

* a `\text{...}` / `\mathrm{...}` group at the end (`5\text{ m}`, `12\text{ cm}^2`, `5\ \mathrm{kg}`): the author
  marked it as words, so any known unit (single-letter symbols included) or one count noun ("apples");
* a known unit written bare (`5 kg`, `45mph`, `3 hours`, `12 square feet`, `3 m/s`; a one-letter symbol only
  after a space: `5 m`), or one count noun of 4+ letters after a space (`73 apples`, `15 students`).

A bare letter right after a number is a variable, never a unit (`4r`, `3b`, `2\sqrt3 s`, `\frac12 ah`), and
words that carry meaning are never units: number and scale words, "or"/"and", negations ("5 is wrong"),
comparisons, ambiguous magnitudes ("3 mil"). The original strips only `\text{ ...}` units (`remove_right_units`)
and a fixed list of words; it reads `4r` as `4r` too.

`canonical` spells a unit one way (`centimeters` = `centimetre` = `cm`, `square feet` = `ft^2`, `mph` =
`miles per hour` = `mi/h`), so two answers that both carry a unit must carry the same one (`5\text{ m}` ≠
`5\text{ cm}`, `12 cm^2` ≠ `12 cm`); a unit on one side only is dropped (`5 cm` = `5`).
"""

from __future__ import annotations

import re

from slime_rollout.rewards.number_words import MULTIPLE_WORDS, NUMBER_WORDS

__all__ = ["canonical", "split_bare_unit", "take_text_unit"]

_SPELLINGS = {
    "mm": "millimeter millimetre", "cm": "centimeter centimetre", "m": "meter metre", "km": "kilometer kilometre",
    "inch": "inches in in.", "ft": "foot feet", "yd": "yard yards", "mi": "mile miles",
    "mg": "milligram", "g": "gram gm", "kg": "kilogram kgs kilo kilos", "lb": "pound lbs", "oz": "ounce",
    "t": "ton tonne", "ms": "millisecond msec", "s": "second sec secs", "min": "minute mins",
    "h": "hour hr hrs", "day": "", "week": "wk", "month": "", "year": "yr yrs", "decade": "", "century": "centuries",
    "mi/h": "mph", "km/h": "kph kmh", "ml": "milliliter millilitre", "l": "liter litre", "gal": "gallon",
    "quart": "qt", "pint": "pt", "cup": "", "deg": "degree", "rad": "radian", "dollar": "usd dollars bucks",
    "cent": "cents", "euro": "eur", "yen": "", "yuan": "rmb", "rupee": "", "unit": "", "j": "joule", "kj": "kilojoule",
    "degc": "celsius", "degf": "fahrenheit", "cal": "calorie", "kcal": "kilocalorie", "w": "watt", "kw": "kilowatt",
    "v": "volt", "n": "newton",
    "pa": "pascal", "hz": "hertz", "k": "kelvin", "a": "ampere amp", "ohm": "ohms", "mol": "mole",
    "acre": "", "hectare": "ha", "sq": "",
}  # fmt: skip
_CANONICAL = {name: name for name in _SPELLINGS}
_CANONICAL.update({alias: name for name, aliases in _SPELLINGS.items() for alias in aliases.split()})
# Bare symbols that are also common words or letters read only inside `\text{}` (`\text{ in}`, `\text{ a}`).
_TEXT_ONLY = {"in", "in.", "a", "t", "k", "n", "v", "w", "j", "l", "pt", "sq"}
# One-letter symbols that may follow a number after a space ("5 m"); any other letter is a variable.
_SPACED_SYMBOLS = {"m", "g", "s", "h"}
_POWERS = {"square": "^2", "sq": "^2", "cubic": "^3"}
# Words that carry meaning and so are never units or count nouns.
_NOT_UNITS = NUMBER_WORDS | frozenset(
    "or and nor not no never none is are was were be wrong false true right correct incorrect invalid either "
    "neither both than less more least most fewer greater smaller larger about approximately approx roughly nearly "
    "almost around exactly only at to from plus minus times over per each all some any if otherwise unless when "
    "else maybe possibly perhaps remainder rem total mil mln mio sin cos tan cot sec csc log ln exp sqrt max min "
    "mod gcd lcm abs det arg lim sum prod inf infinity undefined percent percentage pct am pm minimum maximum "
    "minimal maximal optimal exact approximate estimated estimate only solution solutions answer answers".split()
) - {"min", "sec"}
_WORD = re.compile(r"[A-Za-z]+\.?")
_POWER = re.compile(r"\^\s*\{?\s*([23])\s*\}?")
_TEXT_GROUP = re.compile(
    r"\\(?:text|textrm|textnormal|mathrm|mbox|operatorname)\s*\{([^{}]*)\}((?:\s*\^\s*\{?\s*[23]\s*\}?)?)\s*\.?\s*$"
)


def _unit_word(word: str, marked: bool) -> str | None:
    """The canonical name of one unit word, or None."""
    lower = word.lower()
    if lower in _NOT_UNITS and lower not in ("min", "sec"):
        return None
    name = _CANONICAL.get(lower) or _CANONICAL.get(lower.rstrip("."))
    if name is None and lower.endswith("s") and len(lower) > 3:
        name = _CANONICAL.get(lower[:-1])  # plurals: "meters", "grams", "hours"
    if name is None:
        return None
    if not marked and lower in _TEXT_ONLY:
        return None
    return name


def canonical(words: str, *, marked: bool, spaced: bool = True) -> str | None:
    r"""The one spelling of a unit expression, or None if `words` is not a unit (module docstring).

    Args:
        words: the trailing text (`"cm^2"`, `"square feet"`, `"miles per hour"`, `"m/s"`, `"apples"`).
        marked: the words came from `\text{}`/`\mathrm{}` (one-letter symbols allowed).
        spaced: the words were separated from the number by a space (needed for bare one-letter symbols and
            count nouns).

    Returns:
        E.g. `"cm^2"`, `"ft^2"`, `"mi/h"`, `"m/s"`, `"apple"`; None when any word is not part of a unit.
    """
    text = re.sub(r"\s*/\s*|\s+per\s+", " / ", words.strip().rstrip(".").strip())
    text = _POWER.sub(lambda m: f" ^{m.group(1)}", text)
    tokens = text.split()
    if not tokens:
        return None
    if len(tokens) == 1 and _WORD.fullmatch(tokens[0]) and not _unit_word(tokens[0], marked):
        noun = tokens[0].lower().rstrip(".")
        # One count noun ("3 apples"): after a space, 4+ letters (3 in \text{}), not a word that carries meaning.
        if noun.isalpha() and len(noun) >= (3 if marked else 4) and spaced and noun not in _NOT_UNITS:
            return noun[:-1] if noun.endswith("s") else noun
        return None
    parts, power = [], ""
    for token in tokens:
        if token == "/":
            parts.append("/")
        elif token.startswith("^") and parts and parts[-1] != "/":
            parts[-1] += token
        elif token.lower() in _POWERS and not power:
            power = _POWERS[token.lower()]
        else:
            name = _unit_word(token, marked) if _WORD.fullmatch(token) else None
            if name is None or (len(name) == 1 and not marked and not spaced):
                return None
            if name in ("degc", "degf") and parts and parts[-1] == "deg":
                parts.pop()  # "degrees Celsius" is one unit, the one "30°C" names
            parts.append(name + power)
            power = ""
    if power or not parts or parts[0] == "/" or parts[-1] == "/" or "//" in "".join(parts):
        return None
    return "".join(parts)


def take_text_unit(s: str) -> tuple[str, str | None]:
    r"""Takes a trailing `\text{unit}` group (and its power) off `s`.

    Returns:
        `(rest, canonical unit)`, or `(s, None)` when the group is not a unit (`\text{5 is wrong}`, `\text{ AM}`).
    """
    m = _TEXT_GROUP.search(s) if "\\" in s else None  # every group starts with a command
    if not m or not m.group(1).strip():
        return s, None
    unit = canonical(m.group(1) + m.group(2), marked=True)
    return (s[: m.start()], unit) if unit else (s, None)


_TAIL_CHARS = 80
# Trailing words after a number: up to 6 tokens of letters, powers, "/" and "per".
_BARE_TAIL = re.compile(
    r"(?P<space>\s*)(?P<unit>[A-Za-z][A-Za-z.]*(?:\s*(?:\^\s*\{?\s*[23]\s*\}?|/|\s)\s*[A-Za-z.]*){0,5})$"
)


def _of_a_multiple(words: list[str]) -> bool:
    """Whether `words` start with "of (a|one) <multiple>": the numeral goes on ("half of a million dollars")."""
    lower = [word.lower() for word in words]
    if lower[1:2] in (["a"], ["one"]):
        lower.pop(1)
    return lower[:1] == ["of"] and lower[1:2] != [] and lower[1] in MULTIPLE_WORDS


def split_bare_unit(s: str) -> tuple[str, str | None]:
    """Splits `"5 kg"` into `("5", "kg")` when the trailing words are a unit (module docstring).

    The caller checks that the rest is a number. Number words before the unit stay with the number:
    `"3 million dollars"` → `("3 million", "dollar")`.

    Returns:
        `(rest, canonical unit)`, or `(s, None)`.
    """
    offset = max(0, len(s) - _TAIL_CHARS)  # units are short: a long answer costs no more than its tail
    m = _BARE_TAIL.search(s, offset)
    if not m:
        return s, None
    words = m.group("unit").split()
    # Number words belong to the value ("3 million dollars"); the unit is what follows them.
    n = 0
    while n < len(words) and (words[n].lower() in NUMBER_WORDS or _of_a_multiple(words[n : n + 3])):
        n += 1
    if m.start() == 0 and n == 0:
        return s, None  # only words: no number before them
    unit_words = words[n:]
    if n and unit_words[:1] == ["of"]:  # "3 hundredths of a meter"
        unit_words = unit_words[2:] if unit_words[1:2] in (["a"], ["an"]) else unit_words[1:]
    if not unit_words:
        return s, None
    spaced = bool(m.group("space")) or n > 0
    unit = canonical(" ".join(unit_words), marked=False, spaced=spaced)
    if unit is None:
        return s, None
    rest = (s[: m.start()] + m.group("space") + " ".join(words[:n])).strip()
    return rest, unit
