"""MoE routing replay (`--use-routing-replay`, `--use-rollout-routing-replay`): the routes and their alignment.

A route is the top-k expert choice of one token in one MoE layer. SGLang (`--enable-return-routed-experts`, request
flag `return_routed_experts`) returns them in `meta_info["routed_experts"]`: the base64 of a C-order int32 array
`[seqlen - 1 - routed_experts_start_len, num_hidden_layers, num_experts_per_tok]` (sglang 0.5.16:
`srt/managers/scheduler_components/batch_result_processor.py::_maybe_collect_routed_experts`,
`srt/state_capturer/base.py::get_topk`, `srt/managers/detokenizer_manager.py::_b64_encode_per_request`). `seqlen` is
prompt + output tokens, so the rows cover every token the engine ran the model on: all but the last one. Dense
layers of a mixed model have rows of zeros.

`Sample.rollout_routed_experts` keeps that array as a tensor (the original's field), `RolloutBatch` carries it to
the trainer, and a trainer forward appends one row for the last token (`routes_for_tokens`) so that the routes
follow the tokens one to one through packing.

Legend: `T` tokens of a sample, `L` decoder layers (`num_hidden_layers`), `K` experts per token.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "ROUTED_EXPERTS_KEY",
    "decode_int32_meta_array",
    "decode_routed_experts",
    "encode_routed_experts",
    "find_routers",
    "int32_values",
    "moe_shape",
    "routes_for_tokens",
    "validate_routes",
]


def find_routers(model: nn.Module) -> dict[int, nn.Module]:
    """The MoE routers of an HF causal LM by decoder-layer index (`model.model.layers[i].mlp.gate`).

    A router is recognised by its attributes `top_k` and `num_experts` (HF's `*TopKRouter` modules, which return
    `(logits, weights, ids)`); dense layers have none. The trainer's replay hooks and the reference engine's route
    capture both hook these modules.
    """
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    out = {}
    for i, layer in enumerate(layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        if isinstance(gate, nn.Module) and hasattr(gate, "top_k") and hasattr(gate, "num_experts"):
            out[i] = gate
    return out


#: The `meta_info` key of SGLang's reply (and the `/generate` flag is `return_routed_experts`).
ROUTED_EXPERTS_KEY = "routed_experts"


def moe_shape(hf_config: dict[str, Any]) -> tuple[int, int] | None:
    """`(num_hidden_layers, num_experts_per_tok)` of an MoE `config.json` (its text part), or None for a dense one.

    These are the two trailing dimensions of SGLang's routed-experts array (its `RoutedExpertsCapturer`).
    """
    from slime_core.config.architecture import config_num_experts  # here: the config package loads pydantic

    cfg = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    experts = config_num_experts(cfg)
    topk = cfg.get("num_experts_per_tok")
    if not experts or not topk:
        return None
    return int(cfg["num_hidden_layers"]), int(topk)


def encode_routed_experts(routes_TLK: torch.Tensor) -> str:
    """SGLang's wire form: base64 of the int32 bytes, C order (`routes_TLK` any int dtype)."""
    data = routes_TLK.detach().to(device="cpu", dtype=torch.int32).contiguous().numpy().tobytes()
    return base64.b64encode(data).decode("ascii")


def decode_int32_meta_array(
    meta_info: Mapping[str, Any], keys: str | Iterable[str], *, what: str = "reply"
) -> torch.Tensor | None:
    """The int32 array an SGLang reply's `meta_info` holds under the first of `keys` present, flattened.

    SGLang sends such arrays (routed experts, top-p token ids) as base64 of little-endian int32; raw bytes, a
    tensor, an ndarray or a list are read too, as the original's `slime.utils.misc.decode_int32_meta_array`.

    Args:
        meta_info: the reply's `meta_info`.
        keys: one key or several, tried in order.
        what: names the reply in errors (e.g. `"sample 3"`).

    Returns:
        `[n]` int32 CPU tensor, or None when no key is present or its value is None.

    Raises:
        ValueError: base64 text that is not valid, or bytes whose length is not a multiple of 4.
    """
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    key = next((k for k in keys if k in meta_info), None)
    if key is None or meta_info[key] is None:
        return None
    return int32_values(meta_info[key], what=f"{what}: meta_info.{key}")


def int32_values(value: Any, *, what: str) -> torch.Tensor:
    """`value` as a flat int32 CPU tensor: base64 text or bytes of little-endian int32, a tensor, array or list.

    Raises:
        ValueError: base64 text that is not valid, bytes whose length is not a multiple of 4, or a value torch cannot
            read as int32 (a ragged list, an object; names `what`).
    """
    if isinstance(value, str):
        try:
            value = base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as e:
            raise ValueError(f"{what} is not base64 ({e})") from None
    if isinstance(value, bytes | bytearray | memoryview):
        if len(value) % 4:
            raise ValueError(f"{what} has {len(value)} bytes, not int32 values")
        # frombuffer refuses an empty buffer; the copy keeps the tensor off the caller's (maybe read-only) bytes
        return (
            torch.frombuffer(bytearray(value), dtype=torch.int32) if len(value) else torch.zeros(0, dtype=torch.int32)
        )
    if torch.is_tensor(value):
        return value.detach().to(device="cpu", dtype=torch.int32).reshape(-1)
    try:
        return torch.as_tensor(value, dtype=torch.int32).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as e:
        # A ragged list, text or an object: torch's "Could not infer dtype of dict" named neither field nor sample.
        raise ValueError(f"{what} is {type(value).__name__}, not base64 int32 or a list of ints ({e})") from None


def decode_routed_experts(value: Any, *, num_layers: int, topk: int, what: str = "reply") -> torch.Tensor:
    """Decodes `meta_info["routed_experts"]` into `[rows, L, K]` int32.

    Args:
        value: the base64 string SGLang sends; nested int lists or a tensor are accepted too (the original's
            plugins may store either).
        num_layers: `num_hidden_layers` of the served model.
        topk: `num_experts_per_tok`.
        what: names the reply in errors (e.g. `"sample 3"`).

    Returns:
        `[rows, num_layers, topk]` int32 on CPU.

    Raises:
        ValueError: not base64, or an element count that is not a multiple of `num_layers * topk`.
    """
    flat = int32_values(value, what=f"{what}: meta_info.routed_experts")
    per_row = num_layers * topk
    if flat.numel() % per_row:
        raise ValueError(
            f"{what}: meta_info.routed_experts has {flat.numel()} values, not a multiple of num_hidden_layers × "
            f"num_experts_per_tok = {num_layers} × {topk} (is the engine serving --hf-checkpoint?)"
        )
    return flat.reshape(-1, num_layers, topk).clone()


def validate_routes(routes: Any, num_tokens: int, what: str) -> torch.Tensor:
    """Checks a sample's routes against its tokens; returns them as `[T - 1, L, K]` int32.

    Raises:
        ValueError: not 3-D, or not one row per token the engine ran (`T - 1`). A multi-turn sample whose last
            span (a tool observation) was appended after the last engine call has no routes for that span.
    """
    t = torch.as_tensor(routes, dtype=torch.int32)
    if t.ndim != 3:
        raise ValueError(f"{what}: rollout_routed_experts must be [T - 1, layers, top-k], got shape {tuple(t.shape)}")
    if t.shape[0] != num_tokens - 1:
        raise ValueError(
            f"{what}: rollout_routed_experts has {t.shape[0]} rows, its {num_tokens} tokens need {num_tokens - 1} "
            "(one per token the engine ran); tokens appended after the last engine call (e.g. a final tool "
            "observation) have no routes: end the sample with a model turn or leave --use-rollout-routing-replay off"
        )
    return t


def routes_for_tokens(routes_RLK: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """One route row per token: the engine's `T - 1` rows plus a filler for the last token.

    The last token's hidden state predicts nothing that is scored, and MoE layers act per token, so its route
    changes no log-prob; it gets experts `0..K-1` (distinct, like any real route). The FSDP replay gives that row
    the router's own choice instead (the filler would move a token between experts, and so change other tokens'
    last bits through the experts' matmul shapes).

    Returns:
        `[num_tokens, L, K]` int64.

    Raises:
        ValueError: `routes_RLK` does not have `num_tokens - 1` rows.
    """
    rows, num_layers, topk = routes_RLK.shape
    if rows != num_tokens - 1:
        raise ValueError(f"routes have {rows} rows for {num_tokens} tokens (need {num_tokens - 1})")
    filler = torch.arange(topk, dtype=torch.int64).expand(1, num_layers, topk)
    return torch.cat([routes_RLK.to(torch.int64), filler])
