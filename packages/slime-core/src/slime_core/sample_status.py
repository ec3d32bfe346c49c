"""`Status`: where a sample is in its life cycle, read from any spelling and from SGLang's finish reasons.

`slime_core.sample` re-exports every name here (`from slime_core.sample import Status` is their import path).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

__all__ = ["Status", "as_status", "status_from_finish_reason"]


class Status(enum.Enum):
    """Lifecycle of a sample.

    PENDING: not generated yet (or generation not finished).
    COMPLETED: the engine stopped on a stop token/string.
    TRUNCATED: the response-length budget ran out.
    ABORTED: the request was aborted (over-sampling surplus, weight update); may hold partial output.
    FAILED: a recoverable failure (e.g. env error); may hold partial output.
    """

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"

    @classmethod
    def _missing_(cls, value: object) -> Status | None:
        # A name or value in any case: the original's tau-bench example builds `Sample(status="completed")`.
        return cls.__members__.get(value.upper()) if isinstance(value, str) else None


def as_status(value: Any, what: str) -> Status:
    """`value` as a `Status`: a member, or its value or name as a string in any case ("completed", "COMPLETED").

    Raises:
        ValueError: anything else, naming `what` (e.g. "sample 3") and the valid values.
    """
    try:
        return value if isinstance(value, Status) else Status(value)
    except (ValueError, TypeError):
        raise ValueError(f"{what}: unknown status {value!r} (one of {[s.value for s in Status]})") from None


_FINISH_REASON_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


def status_from_finish_reason(finish_reason: Any) -> Status | None:
    """Maps SGLang's `meta_info.finish_reason` to a `Status`.

    Args:
        finish_reason: SGLang's value: a dict like `{"type": "stop", "matched": 151645}`, a bare type
            string, or None (still running).

    Returns:
        stop -> COMPLETED, length -> TRUNCATED, abort -> ABORTED; None for anything else (the caller
        keeps the current status).
    """
    if isinstance(finish_reason, Mapping):
        finish_reason = finish_reason.get("type")
    if not isinstance(finish_reason, str):
        return None
    return _FINISH_REASON_TO_STATUS.get(finish_reason)
