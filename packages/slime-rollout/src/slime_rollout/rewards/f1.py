r"""`--rm-type f1`: SQuAD token-level F1 (Rajpurkar et al., 2016) between the response's answer and the label.

The answer is what a grader would read: the response's final part (after its reasoning; a `<think>` that never
closes has no answer), reduced to its final `\boxed{}` answer when it has a box (by the math graders' final-answer
rule, `math_utils.single_final_answer`: a box taken back, negated or offered with another is no answer), with LaTeX
text markup (`\text{...}`, `$`) and typesetting (`\underline{...}`, `\textcolor{red}{...}`, `{\bf ...}`:
`rewards.markup`) taken off; a last box whose brace never closes (a response cut off inside it) is no answer, as the
original's `boxed_f1` reads it. Then the original's metric: lower-case, no punctuation or articles, token-overlap F1;
`yes`/`no`/`noanswer` must match exactly.
"""

from __future__ import annotations

import collections
import re
import string

from slime_rollout.rewards.answers import find_boxes, strip_reasoning
from slime_rollout.rewards.markup import strip_markup
from slime_rollout.rewards.math_utils import single_final_answer
from slime_rollout.rewards.unicode_math import ascii_forms

__all__ = ["answer_text", "f1_precision_recall", "f1_reward", "normalize_text"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_EXACT_ONLY = {"yes", "no", "noanswer"}
_PUNCTUATION = set(string.punctuation)
_TEXT_COMMANDS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{([^{}]*)\}")


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD normalization).

    Full-width forms are their ASCII first (`Ｐａｒｉｓ` is `paris`; `unicode_math.ascii_forms`).
    """
    text = "".join(ch for ch in ascii_forms(text).lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_text(response: str) -> str:
    r"""The part of `response` that is graded: after the reasoning, its final box answer if it has a box, no markup."""
    region = strip_reasoning(str(response or ""))
    if region is None:
        return ""
    boxes = find_boxes(region)
    if boxes and not boxes[-1].closed:
        return ""  # cut off inside its box: no answer
    if boxes:
        # The math graders' final-answer rule: a box taken back ("is wrong"), negated or offered with another
        # ("\boxed{London} or \boxed{Paris}") is no answer; the last box alone scored them 1.0.
        region = single_final_answer(region) or ""
    text = strip_markup(region)  # `\underline{Paris}` is Paris (`rewards.markup`)
    return _TEXT_COMMANDS.sub(r"\1", text).replace("$", " ")


def f1_precision_recall(response: str, label: str) -> tuple[float, float, float]:
    """`(f1, precision, recall)` of the normalized tokens; `yes`/`no`/`noanswer` must match exactly.

    Args:
        response: predicted answer text.
        label: one ground-truth answer.

    Returns:
        Three floats in [0, 1]; all 0 when no token is shared.
    """
    pred, gold = normalize_text(str(response)), normalize_text(str(label))
    if (pred in _EXACT_ONLY or gold in _EXACT_ONLY) and pred != gold:
        return 0.0, 0.0, 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0, 0.0, 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_reward(response: str, label: object) -> float:
    """Token F1 in [0, 1]; `yes`/`no`/`noanswer` answers must match exactly (F1 is then 0 or 1).

    Args:
        response: model output.
        label: ground-truth answer (a list of references takes the best F1).

    Raises:
        ValueError: if `label` (or one of its references) is None: compared as the text "None", any response
            "None" scored 1.
    """
    if label is None:
        raise ValueError("f1 reward needs a label (set --label-key)")
    if isinstance(label, list | tuple):
        return max((f1_reward(response, ref) for ref in label), default=0.0)
    return f1_precision_recall(answer_text(response), str(label))[0]
