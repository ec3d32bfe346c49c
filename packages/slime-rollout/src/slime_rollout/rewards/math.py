r"""Rule-based math graders: `--rm-type math` and `--rm-type deepscaler`.

What is graded (`slime_rollout.rewards.answers`): the boxed answers of the response's final statement (after its
reasoning; a box inside `<think>` never counts; a box taken back by the text after it counts as no answer; a box
followed by more derivation or a correction and then another box is superseded by it, as the original's last-box
rule reads it). One distinct boxed answer is compared with the label (`math_utils.grade_answer`). Several
different ones offered together (`\boxed{3} or \boxed{5}`, `\boxed{3}, \boxed{5}`) are a hedge and wrong, unless
together they are the label's multi-part answer (`\boxed{3}, \boxed{5}` for `3, 5`; as many parts as the label,
labelled parts in the label's order: `math_utils.final_pairs`).

`math_reward` / `deepscaler_reward` grade inline, each symbolic check bounded by `WORKER_TIMEOUT_S` on any
thread. Their `_async` twins, used by `async_rm`, keep the cheap checks inline and send the symbolic check to the
worker pool of `slime_rollout.rewards.pool` (so the event loop never blocks on sympy); with `--rm-num-workers 0`
they grade inline too. A grading that is skipped (an answer too costly to evaluate), runs out of budget or
crashes its worker counts as wrong and logs one warning naming the sample and the first 200 characters of each
answer; such gradings are counted (`num_undecided`, per rollout `rollout/num_reward_undecided`). So is an answer
(or label answer) longer than `GRADE_MAX_CHARS`, which is not compared at all.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures.process import BrokenProcessPool

from slime_core.error_text import preview
from slime_rollout.rewards import pool
from slime_rollout.rewards.math_utils import (
    GRADE_MAX_CHARS,
    PREVIEW_CHARS,
    SYMBOLIC_MAX_CHARS,
    extract_label_answer,
    final_boxed_answers,
    final_pairs,
    grade_fast,
    require_label,
    symbolic_equal_with_timeout,
)

logger = logging.getLogger(__name__)

__all__ = [
    "deepscaler_reward",
    "deepscaler_reward_async",
    "grade_final_answers",
    "math_reward",
    "math_reward_async",
    "num_undecided",
]

# Seconds one symbolic check may take (inline or in a worker): math-verify plus the sympy fallback.
WORKER_TIMEOUT_S = 10
# Process-wide: set when the grading pool proved unusable (its workers die before returning anything).
_pool_unusable = threading.Event()

Symbolic = Callable[[str, str], Awaitable[tuple[bool | None, str | None]]]
_undecided_lock = threading.Lock()
_num_undecided = 0  # gradings counted as wrong because the symbolic check gave no verdict, this process


def num_undecided() -> int:
    """Gradings this process counted as wrong because the symbolic check gave no verdict.

    Skipped (an answer too costly to evaluate), over its `WORKER_TIMEOUT_S` budget, past the pool's deadline or
    lost with a crashed worker: each is one warning naming the sample, and this running count, which the default
    rollout reports per rollout as `rollout/num_reward_undecided`.
    """
    return _num_undecided


def _count_undecided() -> int:
    global _num_undecided
    with _undecided_lock:  # graders run on several threads' event loops
        _num_undecided += 1
        return _num_undecided


async def grade_final_answers(
    response: str, label: object, symbolic: Symbolic, *, sample_index: int | None = None
) -> float:
    """1.0 if the response's final boxed answer(s) equal the label's answer, else 0.0 (module docstring).

    Args:
        response: the model output (or the region of it that is graded).
        label: ground truth (a bare answer, a boxed answer or a GSM8K solution ending in `#### x`).
        symbolic: `(gold, pred) -> (verdict or None, failure reason)`, the symbolic check to use.
        sample_index: `Sample.index`, named in the warning of an undecided grading.

    Raises:
        ValueError: if `label` is None.
    """
    gold = extract_label_answer(label)
    final = final_boxed_answers(response)
    longest = max((len(answer) for answer in final.answers), default=0)
    if max(longest, len(gold)) > GRADE_MAX_CHARS:  # splitting and cleaning it would hold the event loop for seconds
        pred = final.answers[0] if len(final.answers) == 1 else ", ".join(final.answers)
        reason = f"an answer of {max(longest, len(gold)):,} characters, past the {GRADE_MAX_CHARS:,} graded"
        _note_undecided(sample_index, pred, gold, reason)
        return 0.0
    pairs = final_pairs(final, gold)
    if pairs is None:
        return 0.0  # no answer, a hedge, or not the label's number of parts
    for pred, gold_part in pairs:
        if not await _equal(pred, gold_part, symbolic, sample_index):
            return 0.0
    return 1.0


async def _equal(pred: str, gold: str, symbolic: Symbolic, sample_index: int | None) -> bool:
    """One comparison: the cheap checks, then the symbolic one (undecided counts as not equal, logged)."""
    verdict, gold_n, pred_n = grade_fast(pred, gold)
    if verdict is not None:
        return verdict
    if max(len(gold_n), len(pred_n)) > SYMBOLIC_MAX_CHARS:  # the check skips it: no need to ship it to a worker
        verdict, failure = None, f"longer than {SYMBOLIC_MAX_CHARS} characters"
    else:
        verdict, failure = await symbolic(gold_n, pred_n)
    if verdict is None:
        _note_undecided(sample_index, pred_n, gold_n, failure)
        return False
    return verdict


def _note_undecided(sample_index: int | None, pred: str, gold: str, reason: str | None) -> None:
    """Warns that a grading without a verdict counted as wrong (naming the sample) and counts it (`num_undecided`)."""
    logger.warning(
        "math reward of sample %s counted as wrong: symbolic grading of %s against %s failed (%s; %d such "
        "grading(s) in this process)",
        sample_index,
        preview(pred, PREVIEW_CHARS),
        preview(gold, PREVIEW_CHARS),
        reason,
        _count_undecided(),
    )


async def _inline(gold_n: str, pred_n: str) -> tuple[bool | None, str | None]:
    verdict = symbolic_equal_with_timeout(gold_n, pred_n, WORKER_TIMEOUT_S)
    return verdict, None if verdict is not None else f"too costly or over its {WORKER_TIMEOUT_S} s budget"


def _run_sync(coro) -> float:
    # The inline symbolic check never awaits anything: the coroutine finishes in one step.
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("inline grading awaited")  # pragma: no cover - _inline never suspends


def math_reward(response: str, label: object, *, sample_index: int | None = None) -> float:
    r"""1.0 if the final boxed answer of `response` equals the label's final answer, else 0.0 (inline).

    Args:
        response: model output.
        label: ground truth: a bare answer, a boxed answer or a GSM8K solution ending in `#### x`.
        sample_index: `Sample.index`, for the warning of an undecided grading.

    Raises:
        ValueError: if `label` is None.
    """
    return _run_sync(grade_final_answers(response, label, _inline, sample_index=sample_index))


_num_without_marker = 0  # responses deepscaler scored 0 for lack of a marker, this process


def _deepscaler_region(response: str, sample_index: int | None) -> str | None:
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "###Response" in response:
        return response.rsplit("###Response", 1)[1]
    _note_without_marker(sample_index)
    return None


def _note_without_marker(sample_index: int | None) -> None:
    """Counts a response scored 0 for having no marker; warns at the 1st, 10th, 100th, ... (as the original, 0).

    A model that does not reason inside `<think>` tags gets no reward at all from deepscaler: said, not silent.
    """
    global _num_without_marker
    _num_without_marker += 1
    if math.log10(_num_without_marker).is_integer():
        logger.warning(
            "--rm-type deepscaler: %d response(s) so far had no </think> (or ###Response) and scored 0 (latest: "
            "sample %s); a model that does not reason in <think> tags gets no reward from it (--rm-type math "
            "grades the whole response)",
            _num_without_marker,
            sample_index,
        )


def deepscaler_reward(response: str, label: object, *, sample_index: int | None = None) -> float:
    r"""DeepScaleR grading: only the text after the last `</think>` (else after `###Response`) counts.

    Returns:
        1.0 if that region's final boxed answer equals the label's answer; 0.0 otherwise, including when
        neither marker is present (counted, with a warning at the 1st, 10th, 100th, ... such response).

    Raises:
        ValueError: if `label` is None (whether or not the response has a marker).
    """
    require_label(label)  # a missing label fails on every response, not only on those with a marker
    region = _deepscaler_region(response, sample_index)
    return 0.0 if region is None else math_reward(region, label, sample_index=sample_index)


def _pool_symbolic(num_workers: int) -> Symbolic:
    async def check(gold_n: str, pred_n: str) -> tuple[bool | None, str | None]:
        if _pool_unusable.is_set():
            return await _inline(gold_n, pred_n)
        try:
            verdict = await pool.run_in_pool(
                symbolic_equal_with_timeout, gold_n, pred_n, WORKER_TIMEOUT_S, num_workers=num_workers
            )
            return verdict, None if verdict is not None else f"too costly or over its {WORKER_TIMEOUT_S} s budget"
        except pool.PoolStartupError as e:
            # Not the answer's fault: grade it inline (bounded), and every later one, rather than count it wrong.
            if not _pool_unusable.is_set():
                _pool_unusable.set()
                logger.error("%s; grading math answers inline from now on", e)
            return await _inline(gold_n, pred_n)
        except BrokenProcessPool as e:
            if pool.has_returned():  # it graded before: this input killed its worker; count it wrong
                return None, f"{type(e).__name__}: {e}"
            if not _pool_unusable.is_set():
                # Workers die before grading anything (e.g. an unguarded main module that spawn re-imports): 0.0
                # here would silently corrupt every reward, so grade inline (bounded) from now on.
                _pool_unusable.set()
                logger.error("reward grading pool unusable (%s); grading math answers inline from now on", e)
            return await _inline(gold_n, pred_n)
        except Exception as e:  # the parent-side deadline or a crashed worker: never raise into the rollout
            return None, f"{type(e).__name__}: {e}"

    return check


async def math_reward_async(
    response: str, label: object, *, num_workers: int, sample_index: int | None = None
) -> float:
    r"""`math_reward` with the symbolic check in the grading pool; never blocks the event loop on sympy.

    Args:
        response: model output.
        label: ground truth (as for `math_reward`).
        num_workers: grading processes (`--rm-num-workers`); 0 grades inline exactly like `math_reward`.
        sample_index: `Sample.index`, named in the warning of a skipped, timed-out or crashed grading.

    Returns:
        1.0 or 0.0; 0.0 also when the grading was skipped, timed out or its worker crashed.

    Raises:
        ValueError: if `label` is None.
    """
    symbolic = _inline if num_workers <= 0 else _pool_symbolic(num_workers)
    return await grade_final_answers(response, label, symbolic, sample_index=sample_index)


async def deepscaler_reward_async(
    response: str, label: object, *, num_workers: int, sample_index: int | None = None
) -> float:
    """`deepscaler_reward` with the symbolic check in the grading pool (see `math_reward_async`)."""
    require_label(label)  # as `deepscaler_reward`
    region = _deepscaler_region(response, sample_index)
    if region is None:
        return 0.0
    return await math_reward_async(region, label, num_workers=num_workers, sample_index=sample_index)
