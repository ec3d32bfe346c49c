"""Reading an engine's `/generate` reply: its token ids and log-probs, checked before anything is kept.

SGLang answers `{"text", "output_ids", "meta_info": {"output_token_logprobs": [[logprob, token_id, text], ...],
"finish_reason", ...}}`. A proxy's HTML error page, an empty body or a broken engine gives something else, and an
unchecked reply failed far from its cause: `'str' object has no attribute 'get'` naming neither the engine reply nor
the sample, or worse, it passed: a NaN log-prob poisoned the importance weights of a whole step, a negative or
fractional token id (-7, 5.7 read as 5) reached the trainer's embedding. `parse_generate_reply` is the one reader
for the default generate, the multi-turn generate and the agent adapter; `finish_status` reads the finish reason, which
SGLang always sends. Both name the engine that answered when the caller knows it (`engines.pool.answering_engine`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from slime_core.error_text import preview
from slime_core.sample import Status, status_from_finish_reason

__all__ = ["checked_log_prob", "checked_token_id", "finish_status", "parse_generate_reply"]


def checked_token_id(value: Any, at: str) -> int:
    """One token id, checked (also for a plugin's `Sample.tokens`: `plugin_values`).

    Args:
        value: an int, or a whole-valued real (`5.0`, a numpy integer); not a bool.
        at: where it was read, the message's prefix (`"... output_token_logprobs[3]"`, `"sample 2: tokens[7]"`).

    Returns:
        The id as an int.

    Raises:
        ValueError: `"{at}: token id ... is not a non-negative integer"` (negative, fractional, text, None, bool).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value).is_integer() or value < 0:
        raise ValueError(f"{at}: token id {preview(value)} is not a non-negative integer")
    return int(value)


def checked_log_prob(value: Any, at: str) -> float:
    """One per-token log-prob (natural log), checked (also for a plugin's `Sample.rollout_log_probs`).

    Args:
        value: a real number; not a bool.
        at: where it was read, the message's prefix.

    Returns:
        The log-prob as a float.

    Raises:
        ValueError: `"{at}: log-prob ... is not a finite number"` (NaN, ±inf, text, None, bool).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{at}: log-prob {preview(value)} is not a finite number")
    return float(value)


def parse_generate_reply(
    reply: Any, *, what: str, engine: str | None = None
) -> tuple[list[int], list[float], Mapping[str, Any]]:
    """The generated token ids, their log-probs and `meta_info` of one `/generate` reply, checked.

    Args:
        reply: the decoded reply body (a dict from SGLang; a str when the body was not JSON, None when empty).
        what: names the call in errors, e.g. "sample 7".
        engine: base URL of the engine that answered (`slime_rollout.engines.pool.answering_engine`), named in
            errors as `engine <url>/generate`; None when unknown.

    Returns:
        `(token_ids, log_probs, meta_info)`: ids as ints (`[n]`), log-probs as floats (`[n]`, natural log).

    Raises:
        ValueError: the reply is not a JSON object, has no `meta_info.output_token_logprobs` (was `return_logprob`
            sent?), an entry is not `[logprob, token_id, ...]`, a log-prob is not finite, a token id is not a
            non-negative integer, `text` is not a string, or `output_ids` is not a list of the same ids.
    """
    source = f"engine {engine}/generate reply" if engine else "engine reply"
    if not isinstance(reply, Mapping):
        named = f"engine {engine}/generate's reply" if engine else "engine's /generate reply"
        raise ValueError(f"{what}: the {named} is {type(reply).__name__} {preview(reply)}, not a "
                         "JSON object")  # fmt: skip
    meta = reply.get("meta_info") or {}
    if not isinstance(meta, Mapping):
        raise ValueError(f"{what}: {source} meta_info is {type(meta).__name__} {preview(meta)}, not an object")
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ValueError(f"{what}: {source} has no meta_info.output_token_logprobs (was return_logprob sent?)")
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence):
        raise ValueError(f"{what}: {source} meta_info.output_token_logprobs is {preview(entries)}, not a list")
    tokens, log_probs = [], []
    for i, entry in enumerate(entries):
        at = f"{what}: {source} meta_info.output_token_logprobs[{i}]"
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) < 2:
            raise ValueError(f"{at} is {preview(entry)}, not [logprob, token_id, ...]")
        log_probs.append(checked_log_prob(entry[0], at))
        tokens.append(checked_token_id(entry[1], at))
    text = reply.get("text")
    if text is not None and not isinstance(text, str):
        # It became the response the reward grades: a number was a bare TypeError in `Sample.response += text`.
        raise ValueError(f"{what}: {source} text is {preview(text)}, not a string")
    output_ids = reply.get("output_ids")
    if output_ids is not None:
        # A number or an object here was a bare `TypeError: 'int' object is not iterable` naming nothing.
        if isinstance(output_ids, (str, bytes, Mapping)) or not isinstance(output_ids, Sequence):
            raise ValueError(f"{what}: {source} output_ids is {preview(output_ids)}, not a list of token ids")
        if list(output_ids) != tokens:
            raise ValueError(f"{what}: {source} output_ids {preview(list(output_ids)[:8])}... disagree with the "
                             f"output_token_logprobs ids {preview(tokens[:8])}... ({len(output_ids)} ids, "
                             f"{len(tokens)} log-prob entries)")  # fmt: skip
    return tokens, log_probs, meta


def finish_status(meta: Mapping[str, Any], *, what: str, engine: str | None = None) -> Status:
    """The sample status a `/generate` reply's `meta_info.finish_reason` gives, checked.

    SGLang 0.5.16 finishes every request with a `finish_reason` of type "stop", "length" or "abort"
    (`schedule_batch.py`, the `BaseFinishReason.to_json` subclasses). Without one, or with another type, the
    rollout cannot tell a response that ended from one cut at the budget (overlong penalties and the truncation
    metrics read that), so it fails rather than guess COMPLETED (it warned and did).

    Args:
        meta: the reply's `meta_info`.
        what: names the call in errors, e.g. "sample 7".
        engine: base URL of the engine that answered, or None.

    Returns:
        COMPLETED, TRUNCATED or ABORTED.

    Raises:
        ValueError: no `finish_reason`, or one that is not a known `{"type": ...}`.
    """
    reason = meta.get("finish_reason")
    status = status_from_finish_reason(reason)
    if status is None:
        source = f"engine {engine}/generate reply" if engine else "engine reply"
        raise ValueError(
            f"{what}: {source} meta_info.finish_reason is {preview(reason)}, not SGLang's "
            '{"type": "stop" | "length" | "abort", ...}: the rollout cannot tell how the response ended'
        )
    return status
