r"""Throughput of the rule-based graders on CPU: `uv run python benchmarks/bench_grader.py [--num-pairs 2000]`.

Grades `--num-pairs` (response, label) pairs with `slime_rollout.rewards.rule_based_reward`, the call every sample
of every rollout goes through: the 149 human-labelled pairs of `tests/fixtures/graders/pairs.jsonl`, then pairs
generated from a fixed seed (`--seed`) until there are `--num-pairs`: integers and decimals, fractions and mixed
numbers, lists, named parts (`x = 2, y = 3`), units, percents, number words, times of day, choice letters, roman
statements, GSM8K `#### x` labels, hedges, retracted boxes, `<think>` blocks, long derivations (2–8 KB) and the
dapo, deepscaler, f1 and gpqa graders. About half of the generated answers are wrong.

One untimed pass first grades every pair (warm-up: imports, sympy's start-up) and notes which pairs reach the
symbolic check (math-verify and sympy, milliseconds each, a cost this benchmark does not measure); the timed
rounds (`--repeats`, each timed with `time.process_time`, the CPU time of this process) grade the other pairs,
the cheap path every grade takes (`--include-symbolic` times all of them). Prints one JSON line:
`pairs_per_s` (timed pairs / the median round), every round's seconds, the counts, and `checksum`, the
SHA-256 of every pair's score in order (dapo: its `acc`), which a faster grader must leave unchanged.
CPU only; about 10 s at the defaults.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import random
import time
from collections.abc import Callable
from typing import Any

import _common

import slime_rollout.rewards.math as math_rewards
from slime_rollout.rewards import rule_based_reward
from slime_rollout.rewards.normalize import clean_answer

PAIRS_FILE = _common.REPO / "tests" / "fixtures" / "graders" / "pairs.jsonl"

Pair = dict[str, Any]

# Filler of a derivation: sentences with inline math, as a model writes before its final answer.
_STEPS = (
    r"First, note that $a^2 + b^2 = {n}$ and $ab = {m}$.",
    r"Substituting $x = {n}$ gives $\frac{{{m}}}{{{n}}} + 1$.",
    r"We check the case $n = {m}$: the sum is ${n} \cdot {m} = {p}$.",
    r"By the triangle inequality, $|x - {n}| \le {m}$, so $x \in [{n}, {p}]$.",
    r"Therefore the area is $\frac{{1}}{{2}} \times {n} \times {m} = {q}$ square units.",
    r"Let $f(x) = x^2 - {n}x + {m}$; its discriminant is ${n}^2 - 4 \cdot {m}$.",
    r"Dividing both sides by ${m}$, we get $y = \dfrac{{{p}}}{{{m}}}$.",
    r"Wait, let me double-check the arithmetic: ${n} + {m} = {s}$.",
)


def _derivation(rng: random.Random, sentences: int) -> str:
    lines = []
    for _ in range(sentences):
        n, m = rng.randint(2, 999), rng.randint(2, 99)
        step = rng.choice(_STEPS)
        lines.append(step.format(n=n, m=m, p=n * m, q=n * m / 2, s=n + m))
    return " ".join(lines)


def _boxed(rng: random.Random, answer: str) -> str:
    lead = rng.choice(("The answer is ", "Final answer: ", "So we get ", "Hence ", ""))
    return f"{lead}$\\boxed{{{answer}}}$."


def _number(rng: random.Random) -> tuple[str, str]:
    value = rng.randint(0, 10**6)
    right = rng.random() < 0.5
    shown = value if right else value + rng.choice((1, -1, 10))
    spelled = rng.choice((str(shown), f"{shown:,}", f"{shown}.0", f"{shown}.00"))
    return spelled, rng.choice((str(value), f"{value:,}"))


def _fraction(rng: random.Random) -> tuple[str, str]:
    den = rng.choice((2, 4, 5, 8, 10, 16, 20, 25))
    num = rng.randint(1, 4 * den)
    value = num / den
    pred = rng.choice((f"\\frac{{{num}}}{{{den}}}", f"\\dfrac{{{num}}}{{{den}}}", f"{num}/{den}", f"{value:g}"))
    if num > den and num % den:
        pred = rng.choice((pred, f"{num // den}\\frac{{{num % den}}}{{{den}}}"))
    gold = rng.choice((f"\\frac{{{num}}}{{{den}}}", f"{value:g}", f"\\frac{{{num + 1}}}{{{den}}}"))
    return pred, gold


def _unit(rng: random.Random) -> tuple[str, str]:
    value = rng.randint(1, 5000)
    unit = rng.choice(
        ("\\text{ cm}", "\\ \\mathrm{kg}", " \\text{meters}", "^\\circ", " \\text{ dollars}", "\\text{ cm}^2", " km/h")
    )
    pred = rng.choice((f"{value}{unit}", f"\\${value}", f"{value} \\text{{ apples}}"))
    return pred, rng.choice((str(value), f"{value}{unit}", f"{value + 1}"))


def _percent(rng: random.Random) -> tuple[str, str]:
    value = rng.randint(1, 99)
    return rng.choice((f"{value}\\%", f"{value}%", f"{value} \\text{{ percent}}")), rng.choice(
        (str(value), f"{value / 100:g}", f"{value + 1}\\%")
    )


def _words(rng: random.Random) -> tuple[str, str]:
    words = rng.choice((("two million", "2000000"), ("three hundred", "300"), ("a dozen", "12"), ("2.5k", "2500")))
    return rng.choice((f"\\text{{{words[0]}}}", words[0])), rng.choice((words[1], "12"))


def _time(rng: random.Random) -> tuple[str, str]:
    hour, minute = rng.randint(1, 12), rng.choice(("00", "15", "30", "45"))
    meridiem = rng.choice(("AM", "PM", "p.m."))
    gold_hour = hour % 12 + (12 if meridiem != "AM" else 0)
    return f"{hour}:{minute} \\text{{ {meridiem}}}", f"{gold_hour}:{minute}"


def _letter(rng: random.Random) -> tuple[str, str]:
    letter = rng.choice("ABCDE")
    value = rng.randint(1, 99)
    pred = rng.choice((f"({letter})", f"\\text{{({letter}) }} {value}", letter, f"\\text{{Option {letter}}}"))
    return pred, rng.choice((letter, f"({letter}) {value}", "C"))


def _roman(rng: random.Random) -> tuple[str, str]:
    sets = ("I only", "II only", "I and III", "II and III", "I, II, and III")
    pred, gold = rng.choice(sets), rng.choice(sets)
    return rng.choice((f"\\text{{{pred}}}", pred.replace(" only", ""))), gold


def _named(rng: random.Random) -> tuple[str, str]:
    x, y = rng.randint(-9, 9), rng.randint(-9, 9)
    pred = rng.choice((f"x = {x}, y = {y}", f"y = {y}, x = {x}", f"x={y}, y={x}"))
    return pred, f"x = {x}, y = {y}"


def _symbolic_form(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(2, 50)
    forms = ((f"2\\sqrt{{{n}}}", f"\\sqrt{{{4 * n}}}"), (f"{n}\\pi", f"\\pi {n}"), (f"x^{n}", f"x^{{{n}}}"))
    return rng.choice(forms)


_ANSWERS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _number, _number, _number, _fraction, _fraction, _unit, _percent, _words, _time, _letter, _roman, _named,
    _symbolic_form,
)  # fmt: skip


def _math_pair(rng: random.Random) -> Pair:
    pred, gold = rng.choice(_ANSWERS)(rng)
    shape = rng.random()
    body = _derivation(rng, rng.randint(1, 6))
    if shape < 0.55:  # one final box after a short derivation
        response = f"{body} {_boxed(rng, pred)}"
    elif shape < 0.65:  # a long derivation with earlier, superseded boxes
        draft = _derivation(rng, rng.randint(20, 80))
        response = f"{draft} So far $\\boxed{{{rng.randint(0, 99)}}}$. {draft[::-1][:400]} {_boxed(rng, pred)}"
    elif shape < 0.75:  # reasoning in <think>, with a draft box there
        response = f"<think>{body} maybe $\\boxed{{{rng.randint(0, 99)}}}$</think>\n{_boxed(rng, pred)}"
    elif shape < 0.82:  # a hedge
        other = rng.randint(0, 99)
        joint = rng.choice((" or ", ", but maybe ", ". Alternatively, "))
        response = f"{body} $\\boxed{{{pred}}}${joint}$\\boxed{{{other}}}$"
    elif shape < 0.87:  # a retracted answer
        response = f"{body} $\\boxed{{{pred}}}$. Wait, that's wrong; I made an error."
    elif shape < 0.92:  # a multi-part answer in several boxes
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        response, gold = f"{body} The answers are $\\boxed{{{a}}}$ and $\\boxed{{{b}}}$.", f"{a}, {rng.choice((b, a))}"
    else:  # a GSM8K label
        gold = f"{body}\n#### {gold}"
        response = f"{body} {_boxed(rng, pred)}"
    return {"grader": "math", "response": response, "label": gold}


def _other_pair(rng: random.Random) -> Pair:
    grader = rng.choice(("dapo", "deepscaler", "f1", "gpqa"))
    pred, gold = _number(rng)
    body = _derivation(rng, rng.randint(1, 5))
    if grader == "dapo":
        return {"grader": grader, "response": f"{body}\nAnswer: {rng.choice((pred, '**' + pred + '**'))}",
                "label": gold}  # fmt: skip
    if grader == "deepscaler":
        return {"grader": grader, "response": f"<think>{body}</think> {_boxed(rng, pred)}", "label": gold}
    if grader == "f1":
        words = rng.sample(("the", "red", "fox", "jumps", "over", "lazy", "dog", "quickly", "brown"), 5)
        return {"grader": grader, "response": f"{body} The answer is {' '.join(words[:4])}",
                "label": " ".join(words[1:])}  # fmt: skip
    letter = rng.choice("ABCD")
    response = f"{body} {rng.choice(('The answer is', 'Answer:', 'I pick'))} ({letter})."
    return {"grader": grader, "response": response, "label": rng.choice("ABCD")}


def make_pairs(num_pairs: int, seed: int) -> list[Pair]:
    """The fixture's pairs, then generated ones (`seed`), `num_pairs` in all (the fixture's first ones if fewer).

    Raises:
        ValueError: `num_pairs` < 1.
    """
    if num_pairs < 1:
        raise ValueError(f"--num-pairs must be >= 1, got {num_pairs}")
    pairs = [json.loads(line) for line in PAIRS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(seed)
    while len(pairs) < num_pairs:
        pairs.append(_math_pair(rng) if rng.random() < 0.85 else _other_pair(rng))
    return pairs[:num_pairs]


def score(pair: Pair) -> float:
    """The pair's score as a float (dapo's dict: its `acc`)."""
    out = rule_based_reward(pair["grader"], pair["response"], pair["label"], pair.get("metadata"))
    return float(out["acc"]) if pair["grader"] == "dapo" else float(out)


def checksum(scores: list[float]) -> str:
    """SHA-256 (hex, first 16 digits) of the scores in order, each as `repr(float)`, one a line."""
    return hashlib.sha256("\n".join(map(repr, scores)).encode()).hexdigest()[:16]


def first_pass(pairs: list[Pair]) -> tuple[list[float], list[bool]]:
    """Grades every pair once; returns the scores and, per pair, whether it reached the symbolic check."""
    calls = 0
    real = math_rewards.symbolic_equal_with_timeout

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    scores, symbolic = [], []
    math_rewards.symbolic_equal_with_timeout = counted  # the inline math graders look it up in this module
    try:
        for pair in pairs:
            before = calls
            scores.append(score(pair))
            symbolic.append(calls > before)
    finally:
        math_rewards.symbolic_equal_with_timeout = real
    return scores, symbolic


def _clear_caches() -> None:
    """Empties the graders' caches, so that a round does not reuse what the previous one cleaned (a real rollout
    grades new responses; what it reuses is within one grade and one group's label)."""
    cache_clear = getattr(clean_answer, "cache_clear", None)  # absent before the grader had a cache
    if cache_clear is not None:
        cache_clear()


def main(argv: list[str] | None = None) -> dict:
    """Grades the pairs, times the rounds and emits the JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-pairs", type=int, default=2000, help="pairs graded (fixture first, then generated)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds; the median is reported")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated pairs")
    p.add_argument("--include-symbolic", action="store_true", help="also time the pairs that reach sympy")
    p.add_argument("--profile", type=pathlib.Path, help="write a cProfile of one more round to this file")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats must be >= 1, got {a.repeats}")
    _common.setup_logging()
    pairs = make_pairs(a.num_pairs, a.seed)
    scores, symbolic = first_pass(pairs)
    timed_pairs = [pair for pair, sym in zip(pairs, symbolic, strict=True) if a.include_symbolic or not sym]
    rounds = []
    for _ in range(a.repeats):
        _clear_caches()
        start = time.process_time()
        for pair in timed_pairs:
            score(pair)
        rounds.append(time.process_time() - start)
    if a.profile is not None:
        import cProfile

        _clear_caches()
        cProfile.runctx("for pair in timed_pairs: score(pair)", globals(), {"timed_pairs": timed_pairs},
                        str(a.profile))  # fmt: skip
    seconds = _common.median(rounds)
    result = {
        "num_pairs": len(pairs),
        "num_timed": len(timed_pairs),
        "num_symbolic": sum(symbolic),
        "include_symbolic": a.include_symbolic,
        "seed": a.seed,
        "repeats": a.repeats,
        "round_s_all": [round(s, 6) for s in rounds],
        "round_s_median": round(seconds, 6),
        "pairs_per_s": round(len(timed_pairs) / seconds, 1) if seconds > 0 else None,
        "score_sum": sum(scores),
        "checksum": checksum(scores),
        "cpus": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
    }
    return _common.emit("grader", result)


if __name__ == "__main__":
    main()
