"""The value types `Sample.from_dict` accepts for each field, checked before the sample is built.

A dump or a buffer file edited by hand (or written by other code) reached `Sample(**data)` unchecked: `tokens="no"`
built a sample whose tokens were characters, and the error came much later, far from the file. Every form the
original's `Sample.from_dict` round-trips stays accepted: numbers as any `int`/`float` (numpy scalars included),
lists or tuples for sequences, the original OPD's `teacher_log_probs` tensor, routes as a tensor, nested lists or
the `{"dtype", "shape", "data"}` encoding of `Sample.to_dict`. `label` may be anything, `status` is checked by
`from_dict` itself.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

from slime_core.error_text import preview

__all__ = ["ORIGINAL_ONLY_FIELDS", "check_field_types"]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real)  # bool included: a reward function may return True


def _is_tensor(x: Any) -> bool:
    # Duck-typed so reward workers need not import torch.
    return hasattr(x, "shape") and hasattr(x, "dtype") and callable(getattr(x, "tolist", None))


def _list_of(element: Callable[[Any], bool], name: str) -> tuple[Callable[[Any], str | None], str]:
    """A check for a list or tuple whose every element passes `element`; the check returns what is wrong, or None."""

    def check(value: Any) -> str | None:
        if not isinstance(value, list | tuple):
            return type(value).__name__
        for position, x in enumerate(value):
            if not element(x):
                return f"{type(value).__name__} with a {type(x).__name__} at position {position}"
        return None

    return check, f"a list of {name}"


def _one_of(*types: type, name: str) -> tuple[Callable[[Any], str | None], str]:
    return (lambda value: None if isinstance(value, types) else type(value).__name__), name


def _optional(check: tuple[Callable[[Any], str | None], str]) -> tuple[Callable[[Any], str | None], str]:
    fn, name = check
    return (lambda value: None if value is None else fn(value)), f"{name} or None"


def _reward(value: Any) -> str | None:
    return None if value is None or _is_number(value) or isinstance(value, Mapping) else type(value).__name__


def _int(value: Any) -> str | None:
    return None if _is_int(value) else type(value).__name__


def _number(value: Any) -> str | None:
    return None if _is_number(value) else type(value).__name__


def _prompt(value: Any) -> str | None:
    return None if isinstance(value, str | list) else type(value).__name__


def _log_probs_or_tensor(value: Any) -> str | None:
    return None if value is None or _is_tensor(value) else _NUMBERS[0](value)


def _routes(value: Any) -> str | None:
    return (
        None
        if value is None or _is_tensor(value) or isinstance(value, Mapping | list | tuple)
        else type(value).__name__
    )


_INTS = _list_of(_is_int, "int")
_NUMBERS = _list_of(_is_number, "numbers")
_STR = _one_of(str, name="a str")
_DICT = _one_of(Mapping, name="a dict")

# field -> (check returning what is wrong or None, what it expects)
_FIELDS: dict[str, tuple[Callable[[Any], str | None], str]] = {
    "prompt": (_prompt, "a str or a list of chat messages"),
    "tokens": _INTS,
    "response": _STR,
    "response_length": (_int, "an int"),
    "reward": (_reward, "a number, a dict or None"),
    "loss_mask": _optional(_INTS),
    "rollout_log_probs": _optional(_NUMBERS),
    "rollout_top_p_token_ids": _optional(_INTS),
    "rollout_top_p_token_offsets": _optional(_INTS),
    "metadata": _DICT,
    "group_index": _optional((_int, "an int")),
    "index": _optional((_int, "an int")),
    "rollout_id": _optional((_int, "an int")),
    "weight_versions": _one_of(list, tuple, name="a list"),
    "remove_sample": _one_of(bool, name="a bool"),
    "session_id": _optional(_STR),
    "train_metadata": _optional(_DICT),
    "non_generation_time": (_number, "a number"),
    "generate_function_path": _optional(_STR),
    "custom_rm_path": _optional(_STR),
    "apply_chat_template_kwargs": _DICT,
    "multimodal_inputs": _optional(_DICT),
    "multimodal_train_inputs": _optional(_DICT),
    "teacher_log_probs": (_log_probs_or_tensor, "a list of numbers, a tensor or None"),
    "multimodal_train_input_id": _optional(_STR),
    "rollout_routed_experts": (_routes, "a tensor, nested int lists, an encoded tensor or None"),
}


# Fields of the original's `Sample` (slime/utils/types.py) this version does not keep, with what they hold: its
# debug dumps (`--save-debug-rollout-data`) carry them, so `from_dict` reads past them (the caller counts and logs).
ORIGINAL_ONLY_FIELDS: Mapping[str, str] = {
    "spec_info": "SGLang speculative-decoding counts (metrics only)",
    "prefix_cache_info": "SGLang prefix-cache hit counts (metrics only)",
}


def check_field_types(data: Mapping[str, Any], *, where: str = "Sample.from_dict") -> None:
    """Checks the type of every known field of a sample dict (unknown names are the caller's concern).

    Args:
        data: field name -> value, as `Sample.to_dict` writes it (or the original's `to_dict`).
        where: names the caller in the error.

    Raises:
        TypeError: the first field of the wrong type, e.g. `Sample.from_dict: field 'tokens' must be a list of int,
            got str ('no')`.
    """
    for field, (check, expected) in _FIELDS.items():
        if field not in data:
            continue
        value = data[field]
        wrong = check(value)
        if wrong is not None:
            raise TypeError(f"{where}: field {field!r} must be {expected}, got {wrong} ({preview(value, 40)})")
