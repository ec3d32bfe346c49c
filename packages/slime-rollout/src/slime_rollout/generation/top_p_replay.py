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

from typing import TYPE_CHECKING

from slime_core.top_p_sets import parse_top_p_sets

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["TOP_P_REQUEST", "parse_top_p_sets", "wants_top_p_sets"]  # parse_top_p_sets: slime_core.top_p_sets's

TOP_P_REQUEST = {"return_top_p_token_ids": True}


def wants_top_p_sets(cfg: SlimeArgs, *, evaluation: bool) -> bool:
    """Whether generate calls ask for the kept ids: training rollouts with `--rollout-top-p < 1`."""
    return not evaluation and cfg.rollout_top_p < 1.0
