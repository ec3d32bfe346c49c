"""Model FLOPs of a decoder-only transformer, and the trainer's `perf/*_tflops` metrics built on them.

`transformer_flops` counts the model FLOPs of one pass over packed sequences from an HF config (a `config.json`
mapping or a `transformers` config object); the benchmarks' MFU and the trainer's per-rollout throughput metrics
use the same count. `throughput_metrics` turns a rollout's FLOPs and phase times into the original slime's
`perf/log_probs_tflops`, `perf/ref_log_probs_tflops`, `perf/actor_train_tflops` and `perf/actor_train_tok_per_s`
(its `log_perf_data_raw`: forward FLOPs per trainer GPU over the phase's seconds, ×3 for training).

Differences from the original's count (`slime/utils/flops_utils.py`), kept because they describe what the trainer
here computes: the lm_head runs only on the response positions whose next token is scored, not on every position;
MoE layers add the router's `2·H·E` per token. Both are model FLOPs: recomputation is not counted.
"""

from __future__ import annotations

import functools
import json
import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["model_config", "throughput_metrics", "transformer_flops"]

logger = logging.getLogger(__name__)


def _field(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return default


def transformer_flops(config: Any, seq_lens: Sequence[int], *, lm_head_tokens: int, backward: bool) -> dict[str, float]:
    """Model FLOPs of a decoder over packed sequences (Kaplan et al. 2020; Narayanan et al. 2021, eq. 3).

    Exact formula (T = Σ s tokens, R = `lm_head_tokens`, k = 3 with backward else 1):

    * matmul = k · (2·N_body·T + 2·V·H·R), with N_body = L·(H·d_q + 2·H·d_kv + d_q·H) + Σ_layers MLP the
      decoder-layer weights a token passes through: q, k, v, o projections and the SwiGLU MLP (3·H·F dense;
      MoE: 3·H·(F_e·top-k + F_shared) + H·E for the router); the embedding lookup does no FLOPs; the lm_head runs
      on the R positions whose next token is scored (slime's response-only forward).
    * attention = k · 2·L·d_q·Σ s²: scores QKᵀ and P·V are 2·2·s²·d_q each forward and layer, halved by the
      causal mask.
    * k = 3: the backward costs twice the forward. Recomputation is not counted (model FLOPs, not hardware FLOPs).

    Args:
        config: HF config, as a mapping (`config.json`) or an object: `hidden_size`, `num_hidden_layers`,
            `num_attention_heads`, `num_key_value_heads`, `head_dim` (optional), `intermediate_size`,
            `vocab_size`; MoE: `num_experts`/`n_routed_experts`/`num_local_experts`, `num_experts_per_tok`,
            `moe_intermediate_size`, `shared_expert_intermediate_size` or `n_shared_experts`,
            `first_k_dense_replace`. A VL config's `text_config` is used when present.
        seq_lens: packed sequence lengths in tokens.
        lm_head_tokens: positions passed through the lm_head (R).
        backward: count forward + backward instead of forward only.

    Returns:
        {"matmul", "attention", "total"} in FLOPs and "n_body" (decoder-layer parameters a token passes through).

    Raises:
        KeyError: the config lacks a field the count needs (the message names it).
    """
    per_token, per_square, per_head_token, n_body = _forward_coefficients(config)
    k = 3.0 if backward else 1.0
    matmul = k * (per_token * sum(seq_lens) + per_head_token * lm_head_tokens)
    attention = k * per_square * sum(s * s for s in seq_lens)
    return {"matmul": matmul, "attention": attention, "total": matmul + attention, "n_body": n_body}


def _forward_coefficients(config: Any) -> tuple[float, float, float, float]:
    """`(2·N_body, 2·L·d_q, 2·V·H, N_body)`: forward FLOPs per token, per s² of a sequence, per lm_head position.

    Raises:
        KeyError: the config lacks a field the count needs (the message names it).
    """
    text = _field(config, "text_config")
    if text is not None:
        config = text
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    for name in need:
        if _field(config, name) is None:
            raise KeyError(f"the model config has no {name!r}")
    h, layers = int(_field(config, "hidden_size")), int(_field(config, "num_hidden_layers"))
    heads = int(_field(config, "num_attention_heads"))
    d_head = int(_field(config, "head_dim", default=h // heads))
    d_q, d_kv = heads * d_head, int(_field(config, "num_key_value_heads", default=heads)) * d_head
    experts = _field(config, "num_experts", "n_routed_experts", "num_local_experts")
    dense_ffn = _field(config, "intermediate_size")
    if experts:
        expert_ffn = int(_field(config, "moe_intermediate_size", default=dense_ffn))
        shared = _field(config, "shared_expert_intermediate_size")
        if shared is None:
            shared = int(_field(config, "n_shared_experts", default=0)) * expert_ffn
        moe_mlp = 3 * h * (expert_ffn * int(_field(config, "num_experts_per_tok")) + int(shared)) + h * int(experts)
        dense_layers = int(_field(config, "first_k_dense_replace", default=0))
        mlp = dense_layers * 3 * h * int(dense_ffn or expert_ffn) + (layers - dense_layers) * moe_mlp
    else:
        if dense_ffn is None:
            raise KeyError("the model config has no 'intermediate_size'")
        mlp = layers * 3 * h * int(dense_ffn)
    n_body = float(layers * (h * d_q + 2 * h * d_kv + d_q * h) + mlp)
    return 2.0 * n_body, 2.0 * layers * d_q, 2.0 * int(_field(config, "vocab_size")) * h, n_body


@functools.cache
def model_config(hf_checkpoint: str | None) -> dict[str, Any] | None:
    """The `config.json` of `--hf-checkpoint`, read once per process; None without one (logged at debug)."""
    if not hf_checkpoint:
        return None
    path = pathlib.Path(hf_checkpoint) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        logger.debug("no perf/*_tflops: %s unreadable (%s)", path, exc)
        return None


def throughput_metrics(
    config: Any,
    seq_lens_sum: float,
    seq_lens_sq_sum: float,
    response_tokens: float,
    gpus: int,
    times: Mapping[str, float],
) -> dict[str, float]:
    """The original's trainer throughput metrics for one rollout, from its token counts and phase times.

    Args:
        config: the HF config (see `transformer_flops`).
        seq_lens_sum: Σ s over every sample of the rollout (all data-parallel ranks), tokens.
        seq_lens_sq_sum: Σ s² over the same samples (the attention term).
        response_tokens: Σ response lengths (the lm_head positions).
        gpus: trainer devices (ranks) that shared the work.
        times: wall seconds of the phases: `perf/log_probs_time`, `perf/ref_log_probs_time` (present only when
            that forward ran) and `perf/actor_train_time`.

    Returns:
        `perf/log_probs_tflops`, `perf/ref_log_probs_tflops` (forward TFLOP/s per GPU), `perf/actor_train_tflops`
        (3 × forward, per GPU) and `perf/actor_train_tok_per_s` (all ranks' tokens per second of training), each
        only where its time is positive; {} when the config lacks a needed field (logged at debug).
    """
    try:
        per_token, per_square, per_head_token, _ = _forward_coefficients(config)
    except KeyError as exc:
        logger.debug("no perf/*_tflops: %s", exc)
        return {}
    fwd = per_token * seq_lens_sum + per_square * seq_lens_sq_sum + per_head_token * response_tokens
    fwd_tflop = fwd / max(gpus, 1) / 1e12
    out: dict[str, float] = {}
    for name in ("log_probs", "ref_log_probs"):
        seconds = times.get(f"perf/{name}_time", 0.0)
        if seconds > 0:
            out[f"perf/{name}_tflops"] = fwd_tflop / seconds
    seconds = times.get("perf/actor_train_time", 0.0)
    if seconds > 0:
        out["perf/actor_train_tflops"] = 3 * fwd_tflop / seconds
        out["perf/actor_train_tok_per_s"] = seq_lens_sum / seconds
    return out
