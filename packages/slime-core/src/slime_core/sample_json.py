"""JSON text of checkpoint state that holds samples, with one clear error for a value JSON cannot store.

Both checkpoint writers that hold samples (the data source's partial-rollout buffer, the fully-async rollout's
held groups) store `Sample.to_dict()` as JSON. Since `to_dict` carries plugin attributes (`sample.x = obj`) and
`metadata` as they are, a plugin can put any object there; json's own message names only the type
("Object of type X is not JSON serializable"), not the sample or the attribute.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from slime_core.error_text import int_digits

if TYPE_CHECKING:
    from slime_core.sample import Sample

__all__ = ["dumps_with_samples"]


def dumps_with_samples(payload: Any, samples: Iterable[Sample], *, what: str) -> str:
    """`json.dumps(payload)`, where `payload` holds the `to_dict()` of `samples`.

    Args:
        payload: the JSON value to write (built from `[s.to_dict() for s in samples]`).
        samples: the samples inside `payload`, searched only when `json.dumps` fails.
        what: the writer, for the message (`"--save: the data source's partial-rollout buffer"`).

    Returns:
        The JSON text.

    Raises:
        TypeError: a value JSON cannot store; names the sample (its `index`), the key (a plugin attribute, a
            `metadata` key or a field) and the value's type.
        ValueError: the same for an int of more than 4,300 digits (Python's int-to-text limit, which json.dumps
            meets): it raised Python's bare "Exceeds the limit" naming nothing, failing a `--save` after a rollout.
    """
    try:
        return json.dumps(payload)
    except (TypeError, ValueError) as e:  # ValueError: an int of more than 4,300 digits (Python's int-to-text limit)
        for sample in samples:
            record = sample.to_dict()
            attributes = sample.plugin_attributes()
            for key, value in record.items():
                if key == "metadata":
                    bad = next((k for k, v in value.items() if not _is_json(v)), None)
                    if bad is not None:
                        where, value = f"metadata[{bad!r}]", value[bad]
                    else:
                        continue
                elif _is_json(value):
                    continue
                else:
                    where = f"plugin attribute {key!r}" if key in attributes else f"field {key!r}"
                raise type(e)(
                    f"{what}: sample {sample.index}'s {where} holds {_described(value)}, which JSON cannot store; "
                    "plugin attributes (Sample.plugin_attributes) and metadata must be JSON values"
                ) from None
        raise type(e)(f"{what}: a value JSON cannot store ({e})") from None


def _described(value: Any) -> str:
    """What a value JSON refused is: its type, or an int's length past Python's int-to-text limit."""
    if isinstance(value, int) and not isinstance(value, bool) and not _is_json(value):
        return f"an int of {int_digits(value):,} digits (past Python's int-to-text limit: store it as a string)"
    return f"a value of type {type(value).__name__}"


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
