"""Model architecture derived from a Hugging Face `config.json`, and its Megatron equivalents.

`ModelArgs.from_hf_config` reads the fields Megatron needs (no hand-written model shell scripts);
`megatron_flags()` prints the equivalent Megatron-LM command-line flags and
`transformer_config_kwargs()` / `gpt_model_kwargs()` give the keyword arguments of
megatron-core's `TransformerConfig` and `GPTModel`. This module imports neither torch nor megatron.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["SUPPORTED_MODEL_TYPES", "ModelArgs", "padded_vocab_size"]

#: HF `model_type` values whose weights the mapping tables understand.
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen3_moe", "glm4")


def padded_vocab_size(vocab_size: int, tensor_model_parallel_size: int = 1, divisible_by: int = 128) -> int:
    """Megatron's padded vocabulary size.

    Megatron pads the embedding and output rows to a multiple of
    `make_vocab_size_divisible_by × tensor_model_parallel_size` so every TP rank holds an equal,
    aligned slice (`megatron/training/tokenizer`, `_vocab_size_with_padding`).

    Args:
        vocab_size: the tokenizer/HF `vocab_size`.
        tensor_model_parallel_size: TP degree.
        divisible_by: `--make-vocab-size-divisible-by` (Megatron default 128).

    Returns:
        The smallest multiple of `divisible_by × tp` that is ≥ `vocab_size`.

    Raises:
        ValueError: a non-positive argument.
    """
    if vocab_size <= 0 or tensor_model_parallel_size <= 0 or divisible_by <= 0:
        raise ValueError(
            f"vocab_size={vocab_size}, tensor_model_parallel_size={tensor_model_parallel_size} and "
            f"make_vocab_size_divisible_by={divisible_by} must all be positive"
        )
    multiple = divisible_by * tensor_model_parallel_size
    return int(math.ceil(vocab_size / multiple) * multiple)


# megatron-core's Llama 3.x RoPE scaling (`RotaryEmbedding._apply_scaling`) fixes these three of HF's `llama3`
# parameters; only the factor reaches it (`GPTModel(rope_scaling_factor=...)`).
_MCORE_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _llama3_rope_factor(config: dict[str, Any]) -> float | None:
    """The Llama 3.x RoPE scaling factor of a config, None for plain RoPE; other scalings raise `ValueError`.

    transformers < 5 writes the scaling as `rope_scaling`, ≥ 5 as `rope_parameters` (with `rope_theta` in it);
    both are read, so a checkpoint re-saved by transformers 5 is not taken for plain RoPE.
    """
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type"))
    if kind in (None, "default"):
        return None
    field = "/".join(k for k in ("rope_scaling", "rope_parameters") if config.get(k))
    shown = f"{field}={ {k: v for k, v in rope.items() if k != 'rope_theta'} }"
    if kind != "llama3":
        raise ValueError(f"{shown} is not supported (only plain RoPE and Llama 3's 'llama3' scaling)")
    fixed = {k: rope.get(k) for k in _MCORE_LLAMA3_ROPE}
    if any(v is None or float(v) != _MCORE_LLAMA3_ROPE[k] for k, v in fixed.items()) or rope.get("factor") is None:
        raise ValueError(
            f"{shown} is not supported: megatron-core's 'llama3' scaling takes a factor and fixes "
            + ", ".join(f"{k}={v:g}" for k, v in _MCORE_LLAMA3_ROPE.items())
        )
    return float(rope["factor"])


# What transformers' config class of each family assumes for a field config.json leaves out (`Qwen3MoeConfig`,
# `Glm4Config`, ...): a trimmed config.json then describes the same model to HF and to Megatron.
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6},
    "qwen3": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6},
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    "qwen3_moe": {
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "norm_topk_prob": False, "router_aux_loss_coef": 0.001
    },
    "glm4": {"max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07},
}  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelArgs:
    """Architecture of a decoder-only model, in Megatron terms.

    Attributes:
        model_type: HF `model_type` (one of `SUPPORTED_MODEL_TYPES`).
        num_layers: transformer layers (`--num-layers`).
        hidden_size: model width (`--hidden-size`).
        ffn_hidden_size: dense MLP width (`--ffn-hidden-size`).
        num_attention_heads: query heads H (`--num-attention-heads`).
        num_query_groups: key/value heads G (`--num-query-groups`); H % G == 0.
        kv_channels: per-head dim (`--kv-channels`).
        vocab_size: HF vocabulary size (rows kept when converting back to HF).
        max_position_embeddings: `--max-position-embeddings`.
        norm_epsilon: RMSNorm epsilon (`--norm-epsilon`).
        rotary_base: RoPE theta (`--rotary-base`).
        tie_word_embeddings: embedding and LM head share weights (no `--untie-embeddings-and-output-weights`).
        add_qkv_bias: q/k/v projections have biases (Qwen2; `--add-qkv-bias`).
        qk_layernorm: per-head RMSNorm on q and k (Qwen3; `--qk-layernorm`).
        rotary_percent: fraction of each head's dims that RoPE rotates (GLM4: 0.5; `--rotary-percent`).
        rotary_interleaved: RoPE rotates pairs of adjacent dims `(2i, 2i+1)` instead of the two halves
            (GLM4; `--rotary-interleaved`).
        sandwich_norm: an RMSNorm on the attention output and on the MLP output before each residual add
            (GLM4's `post_self_attn_layernorm` / `post_mlp_layernorm`; `--post-self-attn-layernorm
            --post-mlp-layernorm`).
        fused_gate_up: the HF checkpoint stores the MLP's gate and up projections as one `gate_up_proj`
            tensor (`[2·ffn, hidden]`, gate rows first; GLM4).
        num_experts: routed experts (MoE only, else None; `--num-experts`).
        moe_ffn_hidden_size: expert MLP width (`--moe-ffn-hidden-size`).
        moe_router_topk: experts per token (`--moe-router-topk`).
        moe_router_pre_softmax: softmax over all experts before top-k without renormalizing
            (HF `norm_topk_prob=False`).
        moe_aux_loss_coeff: load-balancing loss coefficient (`--moe-aux-loss-coeff`).
        torch_dtype: HF `torch_dtype`/`dtype` string (e.g. "bfloat16"), or None.
        attention_dropout: dropout on the attention probabilities in training (HF `attention_dropout`, which the
            HF attention applies in train mode; `--attention-dropout`). The HF families here have no hidden
            (residual) dropout, so Megatron's `hidden_dropout` stays 0.
        rope_scaling_factor: Llama 3.x RoPE frequency scaling factor (HF `rope_type: llama3`; 8 for Llama 3.1,
            32 for Llama 3.2), or None for plain RoPE (`--use-rope-scaling --rotary-scaling-factor`).
        make_vocab_size_divisible_by: Megatron pads the embedding and output-layer rows to a multiple of this × TP
            (`--make-vocab-size-divisible-by`, Megatron's default 128); not in config.json: the run's Megatron flags
            give it, and a torch_dist checkpoint's row count depends on it.

    Raises:
        ValueError: `make_vocab_size_divisible_by` < 1.
    """

    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    max_position_embeddings: int
    norm_epsilon: float
    rotary_base: float
    tie_word_embeddings: bool
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False
    sandwich_norm: bool = False
    fused_gate_up: bool = False
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int | None = None
    moe_router_pre_softmax: bool = False
    moe_aux_loss_coeff: float = 0.0
    torch_dtype: str | None = None
    attention_dropout: float = 0.0
    rope_scaling_factor: float | None = None
    make_vocab_size_divisible_by: int = 128

    def __post_init__(self) -> None:
        if not isinstance(self.make_vocab_size_divisible_by, int) or self.make_vocab_size_divisible_by < 1:
            raise ValueError(
                f"--make-vocab-size-divisible-by must be a positive integer, got {self.make_vocab_size_divisible_by!r}"
            )

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs are mixtures of experts."""
        return self.num_experts is not None

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head (H / G)."""
        return self.num_attention_heads // self.num_query_groups

    def padded_vocab_size(self, tensor_model_parallel_size: int = 1) -> int:
        """Megatron embedding rows for this TP degree (see `padded_vocab_size`)."""
        return padded_vocab_size(self.vocab_size, tensor_model_parallel_size, self.make_vocab_size_divisible_by)

    @classmethod
    def from_hf_dir(cls, hf_dir: str | pathlib.Path, *, make_vocab_size_divisible_by: int = 128) -> ModelArgs:
        """Reads `<hf_dir>/config.json`.

        Args:
            hf_dir: HF model directory.
            make_vocab_size_divisible_by: the run's `--make-vocab-size-divisible-by` (not in config.json).

        Raises:
            FileNotFoundError: no config.json in `hf_dir`.
            ValueError: unsupported model type or inconsistent fields (message names the file).
        """
        path = pathlib.Path(hf_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (--hf-checkpoint/--origin-hf-dir must be a HF model directory)")
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from e
        try:
            return cls.from_hf_config(config, make_vocab_size_divisible_by=make_vocab_size_divisible_by)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], *, make_vocab_size_divisible_by: int = 128) -> ModelArgs:
        """Derives the architecture from a parsed HF `config.json`.

        Args:
            config: the JSON object (e.g. `json.load(open("config.json"))` or `PretrainedConfig.to_dict()`); a field
                it leaves out takes the default of the family's transformers config class (`_HF_DEFAULTS`).
            make_vocab_size_divisible_by: the run's `--make-vocab-size-divisible-by` (Megatron's vocabulary padding).

        Returns:
            The model arguments.

        Raises:
            ValueError: unsupported `model_type`, a missing field, or features the mapping cannot express
                (sliding window, partial MoE layers, non-SiLU activation, unsupported rope scaling).
        """
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )

        defaults = _HF_DEFAULTS[model_type]
        config = {**defaults, **{k: v for k, v in config.items() if v is not None or k not in defaults}}

        def need(key: str) -> Any:
            if config.get(key) is None:
                raise ValueError(f"config field {key!r} is missing")
            return config[key]

        hidden_size = int(need("hidden_size"))
        num_heads = int(need("num_attention_heads"))
        num_groups = int(config.get("num_key_value_heads") or num_heads)
        if num_heads % num_groups:
            raise ValueError(f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_groups}")
        head_dim = int(config.get("head_dim") or hidden_size // num_heads)
        if config.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={config.get('hidden_act')!r}: only 'silu' (SwiGLU) is supported")
        if config.get("use_sliding_window"):
            raise ValueError("use_sliding_window=true is not supported")
        rope_scaling_factor = _llama3_rope_factor(config)
        if model_type == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
            raise ValueError("llama with attention_bias/mlp_bias is not supported")
        rope_parameters = config.get("rope_parameters") or {}
        rotary_base = float(config.get("rope_theta") or rope_parameters.get("rope_theta") or 10000.0)
        glm4 = model_type == "glm4"
        # transformers ≥ 5 moves partial_rotary_factor into rope_parameters; GLM4's default is 0.5.
        rotary_percent = float(
            config.get("partial_rotary_factor") or rope_parameters.get("partial_rotary_factor") or (0.5 if glm4 else 1)
        )

        moe: dict[str, Any] = {}
        if model_type == "qwen3_moe":
            if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1)) != 1:
                raise ValueError("qwen3_moe with mlp_only_layers or decoder_sparse_step != 1 is not supported")
            moe = {
                # transformers ≥ 5 writes `num_local_experts`; older configs `num_experts`.
                "num_experts": int(config.get("num_experts") or need("num_local_experts")),
                "moe_ffn_hidden_size": int(need("moe_intermediate_size")),
                "moe_router_topk": int(need("num_experts_per_tok")),
                "moe_router_pre_softmax": not bool(config["norm_topk_prob"]),
                "moe_aux_loss_coeff": float(config["router_aux_loss_coef"]),
            }
        return cls(
            model_type=model_type,
            num_layers=int(need("num_hidden_layers")),
            hidden_size=hidden_size,
            # Dense: required (the HF classes' defaults are fixed numbers like 11008, not a multiple of the width);
            # MoE: the dense width is unused (every layer is sparse).
            ffn_hidden_size=int(config.get("intermediate_size") or 4 * hidden_size)
            if moe
            else int(need("intermediate_size")),
            num_attention_heads=num_heads,
            num_query_groups=num_groups,
            kv_channels=head_dim,
            vocab_size=int(need("vocab_size")),
            max_position_embeddings=int(config["max_position_embeddings"]),
            norm_epsilon=float(config["rms_norm_eps"]),
            rotary_base=rotary_base,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            add_qkv_bias=model_type == "qwen2" or (glm4 and bool(config.get("attention_bias", True))),
            qk_layernorm=model_type in ("qwen3", "qwen3_moe"),
            rotary_percent=rotary_percent,
            rotary_interleaved=glm4,
            sandwich_norm=glm4,
            fused_gate_up=glm4,
            torch_dtype=config.get("torch_dtype") or config.get("dtype"),
            attention_dropout=float(config.get("attention_dropout") or 0.0),
            rope_scaling_factor=rope_scaling_factor,
            make_vocab_size_divisible_by=make_vocab_size_divisible_by,
            **moe,
        )

    def megatron_flags(self, tensor_model_parallel_size: int = 1) -> list[str]:
        """The Megatron-LM command-line flags describing this model (what `scripts/models/*.sh` held).

        Args:
            tensor_model_parallel_size: TP degree; unused because Megatron pads the vocabulary itself from
                `--vocab-size` and `--make-vocab-size-divisible-by` (kept for a stable signature).

        Returns:
            Flat list of CLI tokens, e.g. `["--num-layers", "28", "--hidden-size", "1024", ...]`.
        """
        del tensor_model_parallel_size  # Megatron derives the padding itself from --vocab-size.
        flags = [
            "--num-layers", str(self.num_layers),
            "--hidden-size", str(self.hidden_size),
            "--ffn-hidden-size", str(self.ffn_hidden_size),
            "--num-attention-heads", str(self.num_attention_heads),
            "--group-query-attention",
            "--num-query-groups", str(self.num_query_groups),
            "--kv-channels", str(self.kv_channels),
            "--max-position-embeddings", str(self.max_position_embeddings),
            "--position-embedding-type", "rope",
            "--rotary-base", str(int(self.rotary_base)),  # Megatron-LM parses an int
            "--normalization", "RMSNorm",
            "--norm-epsilon", f"{self.norm_epsilon:g}",
            "--swiglu",
            "--disable-bias-linear",
            "--vocab-size", str(self.vocab_size),
            "--make-vocab-size-divisible-by", str(self.make_vocab_size_divisible_by),
            "--attention-dropout", f"{self.attention_dropout:g}" if self.attention_dropout else "0.0",
            "--hidden-dropout", "0.0",
        ]  # fmt: skip
        if self.add_qkv_bias:
            flags.append("--add-qkv-bias")
        if self.qk_layernorm:
            flags.append("--qk-layernorm")
        if not self.tie_word_embeddings:
            flags.append("--untie-embeddings-and-output-weights")
        if self.rotary_percent != 1.0:
            flags += ["--rotary-percent", f"{self.rotary_percent:g}"]
        if self.rope_scaling_factor is not None:
            flags += ["--use-rope-scaling", "--rotary-scaling-factor", f"{self.rope_scaling_factor:g}"]
        if self.rotary_interleaved:
            flags.append("--rotary-interleaved")
        if self.sandwich_norm:
            flags += ["--post-self-attn-layernorm", "--post-mlp-layernorm"]
        if self.is_moe:
            flags += [
                "--num-experts", str(self.num_experts),
                "--moe-ffn-hidden-size", str(self.moe_ffn_hidden_size),
                "--moe-router-topk", str(self.moe_router_topk),
                "--moe-aux-loss-coeff", f"{self.moe_aux_loss_coeff:g}",
                "--moe-token-dispatcher-type", "alltoall",
            ]  # fmt: skip
            if self.moe_router_pre_softmax:
                flags.append("--moe-router-pre-softmax")
        return flags

    def transformer_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of megatron-core's `TransformerConfig` for this architecture.

        Parallelism, dtype and fusion settings are left to the caller. `activation_func` is given by
        name ("silu"); callers map it to `torch.nn.functional.silu` (this module does not import torch).
        """
        kwargs: dict[str, Any] = {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "ffn_hidden_size": self.ffn_hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_query_groups": self.num_query_groups,
            "kv_channels": self.kv_channels,
            "normalization": "RMSNorm",
            "layernorm_epsilon": self.norm_epsilon,
            "gated_linear_unit": True,
            "activation_func": "silu",
            "add_bias_linear": False,
            "add_qkv_bias": self.add_qkv_bias,
            "qk_layernorm": self.qk_layernorm,
            "rotary_interleaved": self.rotary_interleaved,
            "hidden_dropout": 0.0,
            # As the FSDP backend's HF model trains (its attention reads config.json's attention_dropout).
            "attention_dropout": self.attention_dropout,
        }
        if self.is_moe:
            kwargs.update(
                num_moe_experts=self.num_experts,
                moe_ffn_hidden_size=self.moe_ffn_hidden_size,
                moe_router_topk=self.moe_router_topk,
                moe_router_pre_softmax=self.moe_router_pre_softmax,
                moe_aux_loss_coeff=self.moe_aux_loss_coeff,
            )
        return kwargs

    def gpt_model_kwargs(self, tensor_model_parallel_size: int = 1) -> dict[str, Any]:
        """Keyword arguments of megatron-core's `GPTModel` besides `config` and `transformer_layer_spec`.

        `vocab_size` is the padded row count (`padded_vocab_size`: `make_vocab_size_divisible_by` × TP).
        """
        kwargs: dict[str, Any] = {
            "vocab_size": self.padded_vocab_size(tensor_model_parallel_size),
            "max_sequence_length": self.max_position_embeddings,
            "position_embedding_type": "rope",
            "rotary_base": int(self.rotary_base),
            "rotary_percent": self.rotary_percent,
            "share_embeddings_and_output_weights": self.tie_word_embeddings,
        }
        if self.rope_scaling_factor is not None:
            kwargs.update(rope_scaling=True, rope_scaling_factor=self.rope_scaling_factor)
        return kwargs
