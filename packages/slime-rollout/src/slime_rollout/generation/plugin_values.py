"""The values of a sample a plugin built (a custom generate function, a sample hook), checked where it is handed over.

The default generate reads every engine reply through `engine_reply.parse_generate_reply`, which refuses a NaN
log-prob or a negative token id; this module applies the same checks (`checked_token_id`, `checked_log_prob`) to a
sample a custom generate function or a sample hook built (every agent example of the original, search-r1, retool,
multi_agent, tau-bench, sets `tokens`, `rollout_log_probs` and `response_length` itself). Checked here, the error names
the plugin and the sample at the hand-over. Unchecked, a NaN or infinite log-prob poisons the importance weights of a
whole step (even on a masked token: `0 * nan` is nan), a negative id indexes the embedding from its end on CPU and is
a device-side assert on a GPU, and text tokens or an unset `response_length` fail later as bare TypeErrors naming
neither. `slime_core.train_data.check_finite_log_probs` checks the log-probs again where the training batch is built,
for samples that pass no plugin hand-over (a custom `--rollout-function-path`, a replayed dump). Tensors and numpy
arrays stay accepted, as the original's trainer takes them.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence
from typing import Any

from slime_core.error_text import preview
from slime_core.sample import Sample
from slime_rollout.generation.engine_reply import checked_log_prob, checked_token_id

__all__ = ["check_plugin_sample_values"]

logger = logging.getLogger(__name__)
_logged_unset_masked = False


def _as_list(value: Any, field: str, what: str, expected: str) -> list[Any]:
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):  # a tensor or a numpy array
        value = value.tolist()
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{what}: {field} is {type(value).__name__} {preview(value)}, not {expected}")
    return list(value)


def check_plugin_sample_values(sample: Sample, *, trained: bool = True) -> None:
    """Checks the values a plugin set on `sample` that the trainer reads (lengths are `Sample.validate`'s).

    A `metadata` set to None becomes `{}`, as the original's readers take it (`sample.metadata and ...`).

    Args:
        sample: the sample a plugin returned.
        trained: False for an eval sample: its tokens and log-probs are read by nothing, so only `response_length`
            (eval metrics) and `metadata` are checked, as the original runs such an eval.

    Raises:
        TypeError: `response_length` is not an int; `tokens` (or `rollout_log_probs`) is not a list, tuple, tensor
            or array.
        ValueError: a token id that is not a non-negative integer (`tokens[i]`), a log-prob that is not a finite
            number (`rollout_log_probs[i]`, masked positions included; a None at a masked position is 0.0, see
            `_zero_unset_masked`).
    """
    what = f"sample {sample.index}"
    if sample.metadata is None:
        sample.metadata = {}
    length = sample.response_length
    if isinstance(length, bool) or not isinstance(length, numbers.Integral):
        raise TypeError(f"{what}: response_length is {type(length).__name__} {preview(length)}, not an int")
    if not trained:
        return
    tokens = _as_list(sample.tokens, "tokens", what, "a list of token ids")
    # Fast path (one pass in C) for the common case; the element loop finds the first bad one.
    if not (all(type(t) is int for t in tokens) and (not tokens or min(tokens) >= 0)):
        for i, t in enumerate(tokens):
            checked_token_id(t, f"{what}: tokens[{i}]")
    if sample.rollout_log_probs is None:
        return
    log_probs = _zero_unset_masked(
        sample, _as_list(sample.rollout_log_probs, "rollout_log_probs", what, "a list of log-probs")
    )
    # A finite sum of floats means every term is finite (nan and inf propagate); an overflowing sum rechecks each.
    if not (all(type(v) is float for v in log_probs) and math.isfinite(sum(log_probs))):
        for i, v in enumerate(log_probs):
            checked_log_prob(v, f"{what}: rollout_log_probs[{i}]")


def _zero_unset_masked(sample: Sample, log_probs: list[Any]) -> list[Any]:
    """`log_probs` with a None at a loss-masked position as 0.0 (set on `sample` too); other values as they are.

    strands-sglang (the original's `examples/strands_sglang`, which pins 0.4.2) gives the tokens of a tool result, a
    prompt segment it never sampled, a None log-prob; the example copies them into `rollout_log_probs`. Nothing reads
    a masked position's log-prob (0.0 is what `append_response_tokens` writes there), so it is set to 0.0 here; the
    original's trainer failed on the None (`torch.as_tensor`: "must be real number, not NoneType"). A None at a
    trained position stays an error. The first such sample of a process is logged with its count.
    """
    global _logged_unset_masked
    mask = sample.loss_mask
    if mask is None or len(mask) != len(log_probs) or not any(v is None for v in log_probs):
        return log_probs
    unset = [i for i, v in enumerate(log_probs) if v is None and not mask[i]]
    if not unset:
        return log_probs
    for i in unset:
        log_probs[i] = 0.0
    sample.rollout_log_probs = log_probs
    if not _logged_unset_masked:
        _logged_unset_masked = True
        logger.info(
            "sample %s: %d rollout log-probs of loss-masked tokens are None (e.g. strands-sglang's tool results); "
            "set to 0.0, which nothing reads (logged for the first such sample only)",
            sample.index,
            len(unset),
        )
    return log_probs
