"""The built-in graders against answer/label pairs labelled by careful-human judgement (issue 17).

`tests/fixtures/graders/pairs.jsonl`: one pair per line, `{grader, class, response, label, expected[, metadata,
note]}`, written for this test (not drawn from any evaluation set). `class` names the failure kind it covers:
exact numbers, units and words in the box, repeating decimals, sentences, choice letters, hedging, retracted and
unclosed boxes, `<think>` blocks, dapo markdown, gpqa choices, f1 markup. `expected` is 1/0 (for dapo: `acc`),
or the token F1 for f1 (compared to 1e-9). Every pair must be graded as labelled.
"""

import collections
import json
import pathlib

import pytest

from slime_rollout.rewards import rule_based_reward

PAIRS_FILE = pathlib.Path(__file__).parents[1] / "fixtures" / "graders" / "pairs.jsonl"
PAIRS = [json.loads(line) for line in PAIRS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


def _score(pair) -> float:
    out = rule_based_reward(pair["grader"], pair["response"], pair["label"], pair.get("metadata"))
    return float(out["acc"]) if pair["grader"] == "dapo" else float(out)


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{p['grader']}-{p['class']}-{i}" for i, p in enumerate(PAIRS)])
def test_pair_is_graded_as_labelled(pair):
    assert _score(pair) == pytest.approx(float(pair["expected"]), abs=1e-9), pair.get("note", "")


def test_the_set_covers_every_failure_class_of_the_issue():
    classes = collections.Counter((p["grader"], p["class"]) for p in PAIRS)
    wanted = {
        ("math", c)
        for c in ("exact", "units", "repeating", "sentence", "letter", "hedge", "retracted", "unclosed", "think")
    }
    wanted |= {("dapo", "markdown"), ("gpqa", "valid"), ("gpqa", "text"), ("f1", "think"), ("f1", "box")}
    assert wanted <= set(classes)
    assert len(PAIRS) >= 140
