"""Top-p replay on the rollout side: ask the engine for the token ids it kept, read them from its reply.

With `--rollout-top-p < 1` training rollouts send `sampling_params["custom_params"] = {"return_top_p_token_ids":
True}` (the original slime's request; SGLang ignores it unless built with the replay patch, the CPU reference
engine honours it). An engine that honours it returns, per generated token, the nucleus it sampled from as
`meta_info["top_p_token_ids"]` (flat) and `meta_info["top_p_token_offsets"]` (`[n + 1]`), either as JSON lists
or as base64 of little-endian int32 (the original's `decode_int32_meta_array` accepts both, and the
`top_p_kept_token_*` spellings). The trainer then computes log-probs over the same truncated distribution
(`slime_core.algorithms.top_p`). An engine that returns nothing leaves training on the full softmax (one warning
from `slime_core.train_data`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slime_core.routing_replay import decode_int32_meta_array
from slime_core.sample import validate_top_p_offsets

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["TOP_P_REQUEST", "parse_top_p_sets", "wants_top_p_sets"]

TOP_P_REQUEST = {"return_top_p_token_ids": True}
_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def wants_top_p_sets(cfg: SlimeArgs, *, evaluation: bool) -> bool:
    """Whether generate calls ask for the kept ids: training rollouts with `--rollout-top-p < 1`."""
    return not evaluation and cfg.rollout_top_p < 1.0


def _decode(meta: Mapping[str, Any], keys: tuple[str, ...]) -> list[int] | None:
    values = decode_int32_meta_array(meta, keys, what="engine reply")
    return None if values is None else values.tolist()


def parse_top_p_sets(meta: Mapping[str, Any], num_tokens: int) -> tuple[list[int], list[int]] | None:
    """The kept ids and offsets of a generate reply's `num_tokens` output tokens, or None if it has none.

    Raises:
        ValueError: only one of the two arrays, or offsets that do not describe `num_tokens` positions.
    """
    ids, offsets = _decode(meta, _ID_KEYS), _decode(meta, _OFFSET_KEYS)
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        raise ValueError("engine reply has top-p token ids or offsets but not both (meta_info top_p_token_*)")
    validate_top_p_offsets(ids, offsets, num_tokens, what="engine reply")
    return ids, offsets
