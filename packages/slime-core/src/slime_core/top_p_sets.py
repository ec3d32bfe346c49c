"""Top-p replay sets as an engine reply carries them: the token ids the engine kept at each generated position.

An engine asked for them (`sampling_params["custom_params"] = {"return_top_p_token_ids": True}`, sent with
`--rollout-top-p < 1`) returns `meta_info["top_p_token_ids"]` (flat) and `meta_info["top_p_token_offsets"]`
(`[n + 1]`), as JSON lists or base64 of little-endian int32 (the original's `decode_int32_meta_array` reads both,
and the `top_p_kept_token_*` spellings). `Sample.append_response_tokens(meta_info=...)` reads them from the reply as
the original's does; the rollout's own generate functions read them here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slime_core.routing_replay import decode_int32_meta_array
from slime_core.sample import validate_top_p_offsets

__all__ = ["TOP_P_ID_KEYS", "TOP_P_OFFSET_KEYS", "parse_top_p_sets"]

TOP_P_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _decode(meta: Mapping[str, Any], keys: tuple[str, ...], what: str) -> list[int] | None:
    values = decode_int32_meta_array(meta, keys, what=what)
    return None if values is None else values.tolist()


def parse_top_p_sets(
    meta: Mapping[str, Any], num_tokens: int, *, what: str = "engine reply"
) -> tuple[list[int], list[int]] | None:
    """The kept ids and offsets of a generate reply's `num_tokens` output tokens, or None if it has none.

    Args:
        meta: the reply's `meta_info`.
        num_tokens: output tokens of the reply.
        what: names the reply in errors (e.g. "sample 3: engine reply").

    Returns:
        `(token_ids [K], offsets [num_tokens + 1])` int lists, or None when `meta` holds neither array.

    Raises:
        ValueError: only one of the two arrays, or offsets that do not describe `num_tokens` positions.
    """
    ids, offsets = _decode(meta, TOP_P_ID_KEYS, what), _decode(meta, TOP_P_OFFSET_KEYS, what)
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        raise ValueError(f"{what} has top-p token ids or offsets but not both (meta_info top_p_token_*)")
    validate_top_p_offsets(ids, offsets, num_tokens, what=what)
    return ids, offsets
