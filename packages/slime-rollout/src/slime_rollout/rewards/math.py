r"""Rule-based math graders: `--rm-type math` and `--rm-type deepscaler` (see `math_utils`).

`math_reward` / `deepscaler_reward` grade inline (blocking). Their `_async` twins, used by `async_rm`,
keep the cheap checks inline (no box, equal strings, equal numbers) and send only the symbolic check to
the worker pool of `slime_rollout.rewards.pool`, so most GSM8K-style answers never pay the IPC; a grading
that times out or crashes counts as "not equal" (0.0) and logs one warning.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures.process import BrokenProcessPool

from slime_rollout.rewards import pool
from slime_rollout.rewards.math_utils import (
    extract_boxed,
    extract_label_answer,
    grade_answer,
    grade_fast,
    symbolic_equal_with_timeout,
)

logger = logging.getLogger(__name__)

__all__ = ["deepscaler_reward", "deepscaler_reward_async", "math_reward", "math_reward_async"]

# Seconds a worker may spend on one symbolic check (math-verify + sympy fallback, one SIGALRM budget).
WORKER_TIMEOUT_S = 10
# Process-wide: set when the grading pool proved unusable (its workers die before returning anything).
_pool_unusable = threading.Event()
_ANSWER_PREVIEW_CHARS = 80


def _preview(answer: str) -> str:
    return answer if len(answer) <= _ANSWER_PREVIEW_CHARS else answer[:_ANSWER_PREVIEW_CHARS] + "..."


def math_reward(response: str, label: object) -> float:
    r"""1.0 if the last `\boxed{}` of `response` equals the label's final answer, else 0.0.

    Args:
        response: model output.
        label: ground truth: a bare answer, a boxed answer or a GSM8K solution ending in `#### x`.

    Raises:
        ValueError: if `label` is None.
    """
    gold = extract_label_answer(label)
    return 1.0 if grade_answer(extract_boxed(response), gold) else 0.0


def _deepscaler_region(response: str) -> str | None:
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "###Response" in response:
        return response.rsplit("###Response", 1)[1]
    return None


def deepscaler_reward(response: str, label: object) -> float:
    r"""DeepScaleR grading: only the text after the last `</think>` (else after `###Response`) counts.

    Returns:
        1.0 if that region's last `\boxed{}` equals the label's answer; 0.0 otherwise, including when
        neither marker is present.
    """
    region = _deepscaler_region(response)
    return 0.0 if region is None else math_reward(region, label)


async def math_reward_async(
    response: str, label: object, *, num_workers: int, sample_index: int | None = None
) -> float:
    r"""`math_reward` with the symbolic check in the grading pool; never blocks the event loop on sympy.

    Args:
        response: model output.
        label: ground truth (as for `math_reward`).
        num_workers: grading processes (`--rm-num-workers`); 0 grades inline exactly like `math_reward`.
        sample_index: `Sample.index`, named in the warning of a timed-out or crashed grading.

    Returns:
        1.0 or 0.0; 0.0 also when the grading timed out or its worker crashed.

    Raises:
        ValueError: if `label` is None.
    """
    gold = extract_label_answer(label)
    pred = extract_boxed(response)
    if num_workers <= 0 or _pool_unusable.is_set():
        return 1.0 if grade_answer(pred, gold) else 0.0
    verdict, gold_n, pred_n = grade_fast(pred, gold)
    if verdict is not None:
        return 1.0 if verdict else 0.0
    try:
        verdict = await pool.run_in_pool(
            symbolic_equal_with_timeout, gold_n, pred_n, WORKER_TIMEOUT_S, num_workers=num_workers
        )
        failure = None if verdict is not None else f"over its {WORKER_TIMEOUT_S} s budget in the worker"
    except BrokenProcessPool as e:
        if pool.has_returned():  # it graded before: this input killed its worker; count it wrong
            verdict, failure = None, f"{type(e).__name__}: {e}"
        elif not _pool_unusable.is_set():
            # Workers die before grading anything (e.g. an unguarded main module that spawn re-imports): 0.0
            # here would silently corrupt every reward, so grade inline (correct, on the event loop) from now on.
            _pool_unusable.set()
            logger.error("reward grading pool unusable (%s); grading math answers inline from now on", e)
        if _pool_unusable.is_set():
            return 1.0 if grade_answer(pred, gold) else 0.0
    except Exception as e:  # the parent-side deadline or a crashed worker: never raise into the rollout
        verdict, failure = None, f"{type(e).__name__}: {e}"
    if verdict is None:
        logger.warning(
            "math reward of sample %s counted as wrong: symbolic grading of %r against %r failed (%s)",
            sample_index,
            _preview(pred_n),
            _preview(gold_n),
            failure,
        )
        return 0.0
    return 1.0 if verdict else 0.0


async def deepscaler_reward_async(
    response: str, label: object, *, num_workers: int, sample_index: int | None = None
) -> float:
    """`deepscaler_reward` with the symbolic check in the grading pool (see `math_reward_async`)."""
    region = _deepscaler_region(response)
    if region is None:
        return 0.0
    return await math_reward_async(region, label, num_workers=num_workers, sample_index=sample_index)
