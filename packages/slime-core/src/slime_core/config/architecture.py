"""Megatron architecture flags checked against the HF config of `--hf-checkpoint`.

The original's model scripts (`scripts/models/*.sh`) describe the architecture with Megatron flags
(`--num-layers 36 --swiglu --qk-layernorm ...`). Here both backends build the model from the checkpoint's
`config.json`, so those flags can only be descriptions: each is compared with what the config says, and a
mismatch is an error (the script was written for another checkpoint). A flag the config cannot confirm (a
family trait this table does not know for `model_type`) is reported as unchecked, never silently trusted.

`check_architecture(megatron_args, hf_config)` returns the mismatches and the unchecked flags; preflight
reads the file and raises on the first mismatch.

Legend: `cfg` is the parsed config.json; `_expect_*` return the value the flag must have for that config,
`_UNKNOWN` when the config does not tell, `_IGNORED` when the flag does not describe this model at all
(`--kv-channels` of a multi-latent-attention model).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from slime_core.config.megatron_checks import megatron_flag_values
from slime_core.config.megatron_flags import MEGATRON_FLAG_RULES

__all__ = ["ArchitectureReport", "check_architecture", "config_num_experts", "is_dense_config", "parse_moe_layer_freq"]

_UNKNOWN = object()
_IGNORED = object()

# Families whose traits config.json does not spell out (norm kind, qk-norm, post-norms, gating).
_QWEN3 = {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}
_DEEPSEEK = {"deepseek_v2", "deepseek_v3", "kimi_k2", "glm_moe_dsa"}
_RMSNORM = _QWEN3 | _DEEPSEEK | {"qwen2", "qwen2_moe", "llama", "mistral", "glm4", "glm4_moe", "mimo", "minimax_m2"}
_GATED_ATTENTION = {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}
_SHARED_EXPERT_GATE = {"qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"}
# MoE families whose HF block is a plain softmax top-k router over routed experts only: no shared expert, no
# routed-weight scaling, no expert groups (transformers' Qwen3MoeSparseMoeBlock), so config.json has none of those keys.
_PLAIN_TOPK_MOE = {"qwen3_moe"}


@dataclasses.dataclass(kw_only=True)
class ArchitectureReport:
    """Outcome of `check_architecture`.

    Attributes:
        mismatches: one line per flag whose value contradicts config.json (`--num-layers 36: config.json has
            num_hidden_layers=28`).
        unchecked: flags config.json cannot confirm for this `model_type`.
        checked: flags that agree with config.json.
    """

    mismatches: list[str]
    unchecked: list[str]
    checked: list[str]


def _get(cfg: dict[str, Any], *keys: str, default: Any = _UNKNOWN) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """RoPE settings: transformers ≥ 5 writes `rope_parameters`, older configs `rope_theta` / `rope_scaling`."""
    out = dict(cfg.get("rope_scaling") or {})
    out.update(cfg.get("rope_parameters") or {})
    if cfg.get("rope_theta") is not None:
        out.setdefault("rope_theta", cfg["rope_theta"])
    return out


def _is_mla(cfg: dict[str, Any]) -> bool:
    return cfg.get("kv_lora_rank") is not None


def _mla(cfg: dict[str, Any]) -> Any:
    """Whether the model uses multi-latent attention; unknown for an MLA family whose config lacks the keys."""
    if "kv_lora_rank" in cfg:
        return cfg["kv_lora_rank"] is not None
    return _UNKNOWN if cfg.get("model_type") in _DEEPSEEK or cfg.get("model_type") not in _RMSNORM else False


# The routed-expert count under the names HF model families use (Qwen-MoE, Mixtral, DeepSeek), first one set wins.
_NUM_EXPERTS_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def config_num_experts(hf_config: dict[str, Any]) -> int | None:
    """Routed experts per MoE layer that a config.json declares; None for a dense model (no such key set).

    Args:
        hf_config: a parsed config.json; a multimodal one's `text_config` is read when the top level names none.

    Returns:
        The first of `num_experts` (Qwen-MoE), `num_local_experts` (Mixtral), `n_routed_experts` (DeepSeek) that is
        set (not null), else the same from `text_config`, else None. Shared experts are not counted.
    """
    text = hf_config.get("text_config")
    for cfg in (hf_config, text if isinstance(text, dict) else {}):
        found = _get(cfg, *_NUM_EXPERTS_KEYS)
        if found is not _UNKNOWN:
            return found
    return None


def _num_experts(cfg: dict[str, Any]) -> Any:
    found = config_num_experts(cfg)
    return _UNKNOWN if found is None else found


def _is_dense(cfg: dict[str, Any]) -> bool:
    """A model of a family this module knows whose config.json names no experts (so MoE flags cannot apply)."""
    model_type = str(cfg.get("model_type"))
    return model_type in _RMSNORM and "moe" not in model_type and _num_experts(cfg) is _UNKNOWN


def is_dense_config(hf_config: dict[str, Any]) -> bool:
    """Whether `hf_config` (a config.json, its `text_config` for a multimodal one) is a dense model of a known family.

    False for a MoE model and for a family this module does not know (nothing can then be said).
    """
    text = hf_config.get("text_config")
    cfg = (
        {**text, "model_type": text.get("model_type", hf_config.get("model_type"))}
        if isinstance(text, dict)
        else hf_config
    )
    return _is_dense(cfg)


def _is_moe_flag(flag: str) -> bool:
    return flag == "--num-experts" or flag.startswith("--moe-")


def _known_family(fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
    """`fn(cfg)` for the families this module knows; unknown model types cannot confirm the trait."""
    return lambda cfg: fn(cfg) if cfg.get("model_type") in _RMSNORM else _UNKNOWN


def _disable_bias_linear(cfg: dict[str, Any]) -> Any:
    if cfg.get("mlp_bias"):
        return False
    # Llama's attention_bias also covers o_proj (a linear Megatron's --add-qkv-bias does not cover).
    return not (cfg.get("model_type") in ("llama", "mistral") and cfg.get("attention_bias"))


def _qkv_bias(cfg: dict[str, Any]) -> Any:
    if cfg.get("model_type") == "qwen2":
        return True
    return bool(cfg.get("attention_bias", False))


def _qk_layernorm(cfg: dict[str, Any]) -> Any:
    model_type = cfg.get("model_type")
    if model_type in _QWEN3:
        return True
    if _is_mla(cfg):
        return cfg.get("q_lora_rank") is not None  # Megatron's MLA q/kv latent norms (HF q_a/kv_a_layernorm)
    if "use_qk_norm" in cfg:
        return bool(cfg["use_qk_norm"])
    return False if model_type in _RMSNORM - _DEEPSEEK else _UNKNOWN


def _moe_layer_pattern(cfg: dict[str, Any]) -> Any:
    """One entry per layer: 1 = MoE, 0 = dense, from the config's sparse-layer keys."""
    layers = cfg.get("num_hidden_layers")
    if _num_experts(cfg) is _UNKNOWN or layers is None:
        return _UNKNOWN
    if cfg.get("first_k_dense_replace") is not None:
        k = int(cfg["first_k_dense_replace"])
        return [0] * k + [1] * (int(layers) - k)
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    return [0 if i in dense or (i + 1) % step else 1 for i in range(int(layers))]


def _plain_topk(cfg: dict[str, Any], value: Any) -> Any:
    """`value` (Megatron's setting that changes nothing) for a plain top-k MoE family, else unknown.

    Without it a Qwen3-MoE run took `--moe-router-topk-scaling-factor 2.5`, `--moe-router-num-groups 2` or
    `--moe-shared-expert-intermediate-size 64` as "not checked" and built the model from config.json without them.
    """
    return value if cfg.get("model_type") in _PLAIN_TOPK_MOE else _UNKNOWN


def _shared_expert_size(cfg: dict[str, Any]) -> Any:
    if cfg.get("shared_expert_intermediate_size") is not None:
        return cfg["shared_expert_intermediate_size"]
    if cfg.get("n_shared_experts") is not None and cfg.get("moe_intermediate_size") is not None:
        return int(cfg["n_shared_experts"]) * int(cfg["moe_intermediate_size"])
    return _plain_topk(cfg, 0)


def _pre_softmax(cfg: dict[str, Any]) -> Any:
    if _get(cfg, "scoring_func", default="softmax") != "softmax" or "norm_topk_prob" not in cfg:
        return _UNKNOWN  # sigmoid routers: Megatron's pre-softmax has no single HF counterpart
    return not cfg["norm_topk_prob"]


def _head_dim(cfg: dict[str, Any]) -> Any:
    if _is_mla(cfg):
        return _IGNORED  # multi-latent attention sizes heads with --qk-head-dim / --v-head-dim
    if cfg.get("head_dim") is not None:
        return cfg["head_dim"]
    if cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        return int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return _UNKNOWN


# The original's `--spec <module> <function>` per model_type the Megatron backend builds itself
# (`slime_train_megatron.layers`); the model types of megatron-core's plain GPT layer take no --spec.
_SPECS = {"glm4": ["slime_plugins.models.glm4", "get_glm_spec"]}
_GPT_LAYER = {"qwen2", "qwen3", "llama", "qwen3_moe"}


def _spec(cfg: dict[str, Any]) -> Any:
    """The `--spec` the Megatron backend's layer for this model equals; unknown for models it cannot build."""
    model_type = cfg.get("model_type")
    if model_type in _SPECS:
        return _SPECS[model_type]
    return "megatron-core's GPT layer (no --spec)" if model_type in _GPT_LAYER else _UNKNOWN


def _activation(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda cfg: _get(cfg, "hidden_act", "hidden_activation", default="silu") == name


# flag -> what config.json says it must be (value for flags with a value, bool for switches).
_EXPECT: dict[str, Callable[[dict[str, Any]], Any]] = {
    "--num-layers": lambda c: _get(c, "num_hidden_layers"),
    "--hidden-size": lambda c: _get(c, "hidden_size"),
    "--ffn-hidden-size": lambda c: _get(c, "intermediate_size"),
    "--num-attention-heads": lambda c: _get(c, "num_attention_heads"),
    "--group-query-attention": lambda c: _IGNORED if _is_mla(c) else (
        _get(c, "num_key_value_heads", default=c.get("num_attention_heads")) != c.get("num_attention_heads")),
    "--num-query-groups": lambda c: _IGNORED if _is_mla(c) else _get(c, "num_key_value_heads"),
    "--kv-channels": _head_dim,
    "--max-position-embeddings": lambda c: _get(c, "max_position_embeddings"),
    "--position-embedding-type": lambda c: "rope" if _rope(c) or c.get("model_type") in _RMSNORM else _UNKNOWN,
    "--use-rotary-position-embeddings": lambda c: True if _rope(c) or c.get("model_type") in _RMSNORM else _UNKNOWN,
    "--no-position-embedding": lambda c: True if _rope(c) or c.get("model_type") in _RMSNORM else _UNKNOWN,
    "--rotary-base": lambda c: _rope(c).get("rope_theta", _UNKNOWN),
    "--rotary-percent": lambda c: _get(c, "partial_rotary_factor", default=_rope(c).get("partial_rotary_factor", 1.0)),
    "--rotary-interleaved": lambda c: bool(c["rope_interleave"]) if "rope_interleave" in c else _known_family(
        lambda cc: cc.get("model_type") == "glm4")(c),
    "--rotary-scaling-factor": lambda c: _rope(c).get("factor", _UNKNOWN),
    "--rope-scaling-factor": lambda c: _rope(c).get("factor", _UNKNOWN),
    "--use-rope-scaling": lambda c: bool(_rope(c).get("rope_type", _rope(c).get("type", "default")) != "default"),
    "--mscale": lambda c: _rope(c).get("mscale", _UNKNOWN),
    "--mscale-all-dim": lambda c: _rope(c).get("mscale_all_dim", _UNKNOWN),
    "--normalization": lambda c: "RMSNorm" if c.get("model_type") in _RMSNORM else _UNKNOWN,
    "--norm-epsilon": lambda c: _get(c, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
    "--apply-layernorm-1p": _known_family(lambda c: c.get("model_type") in {"qwen3_next"} | _GATED_ATTENTION),
    "--swiglu": _activation("silu"),
    "--squared-relu": _activation("relu2"),
    "--disable-bias-linear": _disable_bias_linear,
    "--add-bias-linear": lambda c: not _disable_bias_linear(c),
    "--add-qkv-bias": _qkv_bias,
    "--qk-layernorm": _qk_layernorm,
    "--untie-embeddings-and-output-weights": lambda c: not c.get("tie_word_embeddings", False),
    "--vocab-size": lambda c: _get(c, "vocab_size"),
    "--attention-dropout": lambda c: _get(c, "attention_dropout", default=0.0),
    "--hidden-dropout": lambda c: _get(c, "hidden_dropout", default=0.0),
    "--multi-latent-attention": _mla,
    "--q-lora-rank": lambda c: _get(c, "q_lora_rank"),
    "--kv-lora-rank": lambda c: _get(c, "kv_lora_rank"),
    "--qk-head-dim": lambda c: _get(c, "qk_nope_head_dim"),
    "--qk-pos-emb-head-dim": lambda c: _get(c, "qk_rope_head_dim"),
    "--v-head-dim": lambda c: _get(c, "v_head_dim"),
    "--post-self-attn-layernorm": _known_family(lambda c: c.get("model_type") == "glm4"),
    "--post-mlp-layernorm": _known_family(lambda c: c.get("model_type") == "glm4"),
    "--attention-output-gate": _known_family(lambda c: c.get("model_type") in _GATED_ATTENTION),
    "--use-gated-attention": _known_family(lambda c: c.get("model_type") in _GATED_ATTENTION),
    "--num-experts": _num_experts,
    "--moe-ffn-hidden-size": lambda c: _get(c, "moe_intermediate_size"),
    "--moe-shared-expert-intermediate-size": _shared_expert_size,
    "--moe-shared-expert-gate": _known_family(lambda c: c.get("model_type") in _SHARED_EXPERT_GATE),
    "--moe-router-topk": lambda c: _get(c, "num_experts_per_tok"),
    "--moe-router-score-function": lambda c: _get(c, "scoring_func", default="softmax" if _num_experts(c) is not
                                                  _UNKNOWN else _UNKNOWN),
    "--moe-router-pre-softmax": _pre_softmax,
    "--moe-router-enable-expert-bias": lambda c: (c.get("topk_method") == "noaux_tc"
                                                  or c.get("model_type") in ("glm4_moe", "glm_moe_dsa"))
    if _num_experts(c) is not _UNKNOWN else _UNKNOWN,
    "--moe-router-topk-scaling-factor": lambda c: _get(c, "routed_scaling_factor", default=_plain_topk(c, 1.0)),
    "--moe-router-num-groups": lambda c: _get(c, "n_group", default=_plain_topk(c, 1)),
    "--moe-router-group-topk": lambda c: _get(c, "topk_group", default=_plain_topk(c, 1)),
    "--moe-layer-freq": _moe_layer_pattern,
    "--spec": _spec,
    "--mtp-num-layers": lambda c: _get(c, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0),
}  # fmt: skip

_LAYER_FREQ_TERM = re.compile(r"^\[([01](?:\s*,\s*[01])*)\](?:\*(\d+))?$")


def parse_moe_layer_freq(value: str, num_layers: int) -> list[int]:
    """Megatron's `--moe-layer-freq`: an int k (every k-th layer is MoE) or a list expression like `[0]*3+[1]*58`.

    Args:
        value: the flag's value as written.
        num_layers: `--num-layers` (or config.json's), for the int form.

    Returns:
        One entry per layer, 1 = MoE.

    Raises:
        ValueError: a form other than an int or `+`-joined `[0/1, ...]*n` terms.
    """
    text = value.replace(" ", "")
    if text.isdigit():
        k = int(text)
        return [1 if i % k == 0 else 0 for i in range(num_layers)]
    pattern: list[int] = []
    for term in text.split("+"):
        match = _LAYER_FREQ_TERM.match(term)
        if not match:
            raise ValueError(f"--moe-layer-freq {value!r}: expected an int or terms like [0]*3+[1]*58")
        items = [int(x) for x in match.group(1).split(",")]
        pattern += items * int(match.group(2) or 1)
    return pattern


def _matches(given: Any, expected: Any) -> bool:
    if isinstance(expected, bool):
        return given is True if expected else given is False
    if isinstance(expected, list):
        return given == expected
    if isinstance(expected, int | float):
        try:
            return math.isclose(float(given), float(expected), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return str(given).lower() == str(expected).lower()


def check_architecture(
    megatron_args: list[str], hf_config: dict[str, Any], megatron_native: bool = True
) -> ArchitectureReport:
    """Compares the architecture flags among `megatron_args` with `hf_config`.

    Args:
        megatron_args: the raw Megatron tokens of the config (`SlimeArgs.megatron_args`).
        hf_config: the parsed config.json of `--hf-checkpoint` (for multimodal configs, the text part
            `text_config` is used when present).
        megatron_native: the backend's capability (`TrainBackendSpec.megatron_native`): only the flags whose
            rule in its column (`megatron`, else `fsdp`) is `check` are compared (`--spec` is checked for
            Megatron only: FSDP runs the HF model whatever the spec).

    Returns:
        The mismatches, the flags that could not be checked and the ones that agree.
    """
    cfg = dict(hf_config)
    if isinstance(cfg.get("text_config"), dict):  # VLM wrappers keep the language model in text_config
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    values = megatron_flag_values(megatron_args)
    report = ArchitectureReport(mismatches=[], unchecked=[], checked=[])
    for flag, given in values.items():
        rule = MEGATRON_FLAG_RULES.get(flag)
        if rule is None or (rule.megatron if megatron_native else rule.fsdp) != "check":
            continue
        if _is_moe_flag(flag) and _is_dense(cfg):
            shown = "" if given is True else f" {' '.join(given) if isinstance(given, list) else given}"
            report.mismatches.append(
                f"{flag}{shown}: config.json says a dense model (model_type {cfg.get('model_type')!r}, no experts)"
            )
            continue
        expected = _EXPECT[flag](cfg)
        if flag == "--moe-layer-freq" and expected not in (_UNKNOWN, _IGNORED):
            try:
                given = parse_moe_layer_freq(str(given), int(values.get("--num-layers", len(expected))))
            except ValueError as e:
                report.mismatches.append(str(e))
                continue
        if expected is _IGNORED:
            report.checked.append(flag)
        elif expected is _UNKNOWN:
            report.unchecked.append(flag)
        elif _matches(given, expected):
            report.checked.append(flag)
        else:
            if isinstance(given, list):
                shown = f" {' '.join(given)}" if flag == "--spec" else " <pattern>"
            else:
                shown = "" if given is True else f" {given}"
            report.mismatches.append(f"{flag}{shown}: config.json says {_describe(flag, expected)}")
    return report


def _describe(flag: str, expected: Any) -> str:
    if isinstance(expected, bool):
        return "the model has no such feature" if not expected else "the model has it"
    if flag == "--spec":
        return f"a model whose Megatron layer is {' '.join(expected) if isinstance(expected, list) else expected}"
    if isinstance(expected, list):
        return f"MoE layers {''.join(map(str, expected))} (1 = MoE)"
    return f"{expected}"
