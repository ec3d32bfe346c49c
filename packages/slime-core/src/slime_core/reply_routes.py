"""Generate side of `--use-rollout-routing-replay`: ask the engine for its MoE routes and keep them on the sample.

Every `/generate` call sends `return_routed_experts` (SGLang's request flag; the engine runs with
`--enable-return-routed-experts`) and no `routed_experts_start_len`, so the reply's `meta_info.routed_experts`
covers every token the engine ran: the request's `input_ids` (the sample's tokens so far, earlier turns and a
partial response included) plus the new output, minus the last token. The routes of a call therefore replace the
sample's previous ones and stay aligned with `Sample.tokens` across turns and partial-rollout continuations; a
tool observation appended after the last call has none (training data refuses that sample with one line).
Decoding and shapes: `slime_core.routing_replay`. The rollout's generate functions call `attach_routed_experts` after
each reply, and so does `Sample.append_response_tokens(args, ..., meta_info=...)` for a reply that carries routes, as
the original's append decodes them (a generate function written for the original keeps them without a call here).
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Mapping
from typing import Any

from slime_core.routing_replay import (
    ROUTED_EXPERTS_KEY,
    decode_routed_experts,
    int32_values,
    moe_shape,
    validate_routes,
)
from slime_core.sample import Sample, Status, status_from_finish_reason

__all__ = ["ROUTED_EXPERTS_REQUEST", "attach_routed_experts", "wants_routed_experts"]

#: What a `/generate` payload adds to get the routes back.
ROUTED_EXPERTS_REQUEST = {"return_routed_experts": True}


def wants_routed_experts(args: Any) -> bool:
    """Whether generation asks for routes (`--use-rollout-routing-replay`; plugin `args` may lack the field)."""
    return bool(getattr(args, "use_rollout_routing_replay", False))


@functools.cache
def _moe_shape(hf_checkpoint: str) -> tuple[int, int]:
    """`(num_hidden_layers, num_experts_per_tok)` of `--hf-checkpoint`.

    Raises:
        ValueError: a dense model.
    """
    config = json.loads((pathlib.Path(hf_checkpoint) / "config.json").read_text(encoding="utf-8"))
    shape = moe_shape(config)
    if shape is None:
        raise ValueError(f"--use-rollout-routing-replay: --hf-checkpoint {hf_checkpoint} is not an MoE model")
    return shape


def attach_routed_experts(args: Any, sample: Sample, meta_info: Mapping[str, Any]) -> None:
    """Stores the reply's routes on `sample` (call after its tokens were appended); nothing without the flag.

    Args:
        args: the run config (plugin view); reads `use_rollout_routing_replay`, `hf_checkpoint`.
        sample: the sample the reply's tokens were just appended to.
        meta_info: the reply's `meta_info`.

    Raises:
        ValueError: the reply lacks the routes (an engine without `--enable-return-routed-experts`), they do not
            cover `len(sample.tokens) - 1` tokens of `num_hidden_layers × num_experts_per_tok`, they hold another
            top-k than `--hf-checkpoint`'s (named as such), or are not int32 values (a JSON object, text that is not
            base64).
    """
    if not wants_routed_experts(args):
        return
    value = meta_info.get(ROUTED_EXPERTS_KEY)
    if value is None:
        # Not `(finish_reason or {}).get("type")`: a finish reason that is no object was a bare AttributeError.
        if status_from_finish_reason(meta_info.get("finish_reason")) is Status.ABORTED:
            sample.rollout_routed_experts = None  # aborted: regenerated (partial rollout) or dropped, never trained
            return
        raise ValueError(
            f"sample {sample.index}: --use-rollout-routing-replay but the engine reply has no meta_info.routed_experts "
            "(start the engine with --enable-return-routed-experts and send return_routed_experts)"
        )
    num_layers, topk = _moe_shape(str(args.hf_checkpoint))
    what = f"sample {sample.index}"
    flat = int32_values(value, what=f"{what}: meta_info.routed_experts")
    rows = len(sample.tokens) - 1
    if rows > 0 and flat.numel() != rows * num_layers * topk and flat.numel() % (rows * num_layers) == 0:
        # Decoded with the config's top-k these made another row count, and the error blamed the tokens.
        raise ValueError(
            f"{what}: meta_info.routed_experts holds {flat.numel() // (rows * num_layers)} experts per token and "
            f"layer ({flat.numel()} values for {rows} tokens × {num_layers} layers), but --hf-checkpoint "
            f"{args.hf_checkpoint} has num_experts_per_tok={topk} (does the engine serve it, or override its top-k?)"
        )
    routes = decode_routed_experts(flat, num_layers=num_layers, topk=topk, what=what)
    sample.rollout_routed_experts = validate_routes(routes, len(sample.tokens), f"sample {sample.index}")
