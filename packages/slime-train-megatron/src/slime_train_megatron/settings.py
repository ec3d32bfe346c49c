"""Megatron settings of the trainer: parallelism, precision, optimizer, checkpoints.

Parsed from `cfg.megatron_args` (the raw Megatron CLI tokens a user passes through, e.g.
`["--tensor-model-parallel-size", "2", "--sequence-parallel"]`) on top of the same-named fields of the
run config (`cfg.lr`, `cfg.load`, ...), on top of slime's defaults (distributed optimizer on, bf16 unless
`--fp16`, Transformer Engine spec when installed, else the local spec with slime's packed varlen attention).
Flag names are Megatron-LM's. Only the flags `slime_core.config.megatron_flags` marks as `read` for Megatron
reach this parser; validation has already judged every other Megatron flag of the run.
"""

from __future__ import annotations

import argparse
import logging
import types
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from slime_core.config import SlimeArgs
from slime_core.config.layer_split import layer_split_problems
from slime_core.config.megatron_flags import MEGATRON_FLAG_RULES

logger = logging.getLogger(__name__)

__all__ = ["AttentionKind", "HeadKind", "MegatronSettings", "attention_kind", "compiles_layers", "head_kind"]

#: The actor's log-prob head (`output_head.py`): megatron-core's logits, or the fused head on hidden states.
HeadKind = Literal["logits", "fused"]


class MegatronSettings(BaseModel):
    """Megatron options used by `MegatronTrainBackend` (Megatron-LM flag names, dashes → underscores)."""

    model_config = ConfigDict(extra="forbid")

    tensor_model_parallel_size: int = Field(1, ge=1, description="TP degree.")
    pipeline_model_parallel_size: int = Field(1, ge=1, description="PP degree.")
    context_parallel_size: int = Field(1, ge=1, description="CP degree (ring attention over THD chunks).")
    expert_model_parallel_size: int = Field(1, ge=1, description="EP degree (MoE).")
    expert_tensor_parallel_size: int = Field(1, ge=1, description="TP degree inside experts (only 1 supported).")
    sequence_parallel: bool = Field(False, description="Shard activations along the sequence over TP ranks.")
    use_distributed_optimizer: bool = Field(True, description="ZeRO-1 optimizer state sharding over DP.")
    transformer_impl: Literal["transformer_engine", "local"] | None = Field(
        None, description="Layer spec; None → transformer_engine when importable, else local."
    )
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] = Field(
        "auto",
        description="Core attention. Local spec: auto/flash → slime's packed varlen attention (flash kernel on CUDA, "
        "exact per-sequence SDPA on CPU), local → megatron-core's DotProductAttention with a dense [T, T] mask; "
        "fused/unfused need Transformer Engine, which picks its kernel from this flag.",
    )
    bf16: bool = Field(False, description="bf16 params/compute (slime's default unless --fp16 or --fp32).")
    fp16: bool = Field(False, description="fp16 params/compute.")
    fp32: bool = Field(False, description="fp32 params/compute (slime extension; tests and CPU debugging).")
    lr: float = Field(1e-6, gt=0, description="Peak learning rate.")
    min_lr: float = Field(0.0, ge=0, description="Final learning rate of the decay.")
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "constant"
    lr_warmup_iters: int = Field(0, ge=0, description="Warm-up optimizer steps.")
    lr_warmup_fraction: float | None = Field(None, ge=0, le=1, description="Warm-up as a fraction of the decay steps.")
    lr_warmup_init: float = Field(0.0, ge=0, description="Learning rate the warm-up starts from.")
    lr_decay_iters: int | None = Field(None, description="Decay steps (None → the whole run's optimizer steps).")
    lr_wsd_decay_iters: int | None = Field(None, ge=1, description="WSD: optimizer steps of the anneal.")
    lr_wsd_decay_style: Literal["exponential", "linear", "cosine", "minus_sqrt"] = Field(
        "exponential", description="WSD: the anneal's shape (megatron-core's `lr_wsd_decay_style`)."
    )
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = Field(1.0, ge=0, description="Global grad-norm clip (0 = off).")
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = None
    load: str | None = Field(None, description="torch_dist save dir to resume from (model, optimizer, RNG).")
    ref_load: str | None = Field(None, description="torch_dist dir of the reference / initial weights.")
    save: str | None = Field(None, description="Where `save()` writes iter_XXXXXXX checkpoints.")
    no_load_optim: bool = False
    no_save_optim: bool = Field(False, description="Leave optimizer and scheduler state out of checkpoints.")
    no_load_rng: bool = False
    finetune: bool = Field(False, description="Load weights only and start at rollout 0.")
    ckpt_step: int | None = Field(None, description="Iteration to load instead of the tracker's latest.")
    seed: int = 1234
    moe_token_dispatcher_type: Literal["alltoall", "allgather", "flex"] = "alltoall"
    moe_grouped_gemm: bool = False
    decoder_first_pipeline_num_layers: int | None = Field(None, ge=1, description="Layers of the first PP stage.")
    decoder_last_pipeline_num_layers: int | None = Field(None, ge=1, description="Layers of the last PP stage.")
    optimizer_cpu_offload: bool = Field(False, description="Keep optimizer states on CPU and step there (HybridAdam).")
    overlap_cpu_optimizer_d2h_h2d: bool = Field(False, description="Overlap the CPU optimizer's copies with compute.")
    optimizer_offload_fraction: float = Field(1.0, ge=0, le=1, description="Share of states on CPU when offloading.")
    use_precision_aware_optimizer: bool = Field(
        False, description="Megatron's precision-aware optimizer (needs Transformer Engine's FusedAdam)."
    )
    use_torch_fused_adam: bool = Field(
        True,
        description="slime: torch's fused AdamW kernel where megatron-core falls back to torch's AdamW (no TE/Apex); "
        "torch_optimizer.py. On by default; --no-use-torch-fused-adam keeps torch's foreach AdamW.",
    )
    bias_swiglu_fusion: bool = Field(
        False,
        description="megatron-core's fused SwiGLU (torch.compile'd forward and hand-written backward; Megatron-LM's "
        "default, turned off by its --no-bias-swiglu-fusion). slime's default is off: it compiles at first use.",
    )
    bias_dropout_fusion: bool = Field(
        False,
        description="megatron-core's fused bias-dropout-add of the residual (torch.compile'd; Megatron-LM's default, "
        "turned off by its --no-bias-dropout-fusion). slime's default is off: it compiles at first use.",
    )
    check_for_nan_in_loss_and_grad: bool = Field(
        True,
        description="Megatron-LM's default: a NaN/inf gradient norm stops the run (slime_core.step_metrics."
        "check_grad_norms); --no-check-for-nan-in-loss-and-grad skips an optimizer step whose gradient norm is not "
        "finite instead (the original's train_step).",
    )
    megatron_compile_layers: bool | None = Field(
        None,
        description="slime: torch.compile every decoder layer (regional compilation, dynamic shapes; the Megatron "
        "twin of --fsdp-compile-layers): fuses the local spec's norms, RoPE, SwiGLU and residual adds. Unset: on "
        "with CUDA for dense models on the local spec at TP = CP = 1 (`compiles_layers`; qwen3-1.7b at 8 × 1024 "
        "tokens on one H100: 40.2 -> 49.9 % MFU, 27 s of compilation in the first step), else off; "
        "--no-megatron-compile-layers keeps the layers eager.",
    )
    use_foreach_grad_norm: bool = Field(
        True,
        description="slime: multi-tensor grad norm and clipping without a host copy per parameter where megatron-core "
        "falls back to its local implementations (no TE/Apex); torch_optimizer.py. On by default; "
        "--no-use-foreach-grad-norm keeps megatron-core's per-parameter norm.",
    )
    attention_softmax_in_fp32: bool = Field(False, description="Unfused attention softmax in fp32.")
    moe_aux_loss_coeff: float | None = Field(None, ge=0, description="Router loss weight (None: config.json's).")
    moe_z_loss_coeff: float | None = Field(None, ge=0, description="Router z-loss weight (None: off).")
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"] = "aux_loss"
    moe_router_bias_update_rate: float = Field(1e-3, ge=0, description="Expert-bias update rate (aux-loss-free).")
    moe_router_dtype: Literal["fp32", "fp64"] | None = Field(None, description="Router computation dtype.")
    moe_token_drop_policy: Literal["probs", "position"] = "probs"
    moe_expert_capacity_factor: float | None = Field(None, gt=0, description="Token capacity per expert (drops).")
    moe_pad_expert_input_to_capacity: bool = False
    moe_permute_fusion: bool = False
    moe_enable_deepep: bool = Field(False, description="DeepEP dispatch (with --moe-token-dispatcher-type flex).")
    deterministic_mode: bool = Field(False, description="megatron-core's deterministic mode (--deterministic-mode).")
    make_vocab_size_divisible_by: int = Field(
        128, ge=1, description="Embedding/output-layer rows padded to a multiple of this × TP (Megatron's default)."
    )

    @model_validator(mode="after")
    def _check(self) -> MegatronSettings:
        if sum((self.bf16, self.fp16, self.fp32)) > 1:
            raise ValueError("--bf16, --fp16 and --fp32 are mutually exclusive")
        if not (self.fp16 or self.fp32):
            self.bf16 = True
        if self.expert_tensor_parallel_size != 1:
            raise ValueError("--expert-tensor-parallel-size > 1 is not supported by slime's Megatron backend")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            logger.warning("--sequence-parallel has no effect with --tensor-model-parallel-size 1; disabled")
            self.sequence_parallel = False
        self._check_moe()
        return self

    def _check_moe(self) -> None:
        """MoE flags megatron-core would refuse only while it builds or runs the model, or that part trainer and engine.

        Raises:
            ValueError: naming the flag, for what megatron-core 0.16 asserts in its router, dispatcher or config
                (Sinkhorn with a router loss, the flex dispatcher over one expert rank, DeepEP without flex, padding
                to a capacity that is not set), and for Sinkhorn routing, which trains on other experts than the
                engine samples from.
        """
        if self.moe_router_load_balancing_type == "sinkhorn":
            # megatron-core's router (`TopKRouter.sinkhorn_load_balancing`): in training it picks the top-k of the
            # Sinkhorn-balanced scores, and it weights the experts by the un-renormalized softmax in both modes,
            # whatever config.json's norm_topk_prob says; the engine routes by HF's softmax top-k. It also asserts
            # a zero aux-loss coefficient in the first forward (config.json's router_aux_loss_coef is not zero).
            raise ValueError(
                "--moe-router-load-balancing-type sinkhorn is not supported: megatron-core's Sinkhorn routing trains "
                "on other experts than the rollout engine's softmax top-k routes to; use aux_loss, seq_aux_loss or none"
            )
        if (
            self.moe_token_dispatcher_type == "flex"
            and self.expert_model_parallel_size * self.expert_tensor_parallel_size == 1
        ):
            raise ValueError(
                "--moe-token-dispatcher-type flex needs --expert-model-parallel-size > 1 (megatron-core's flex "
                "dispatcher exchanges tokens between expert ranks); use alltoall"
            )
        if self.moe_enable_deepep and self.moe_token_dispatcher_type != "flex":
            raise ValueError(
                f"--moe-enable-deepep needs --moe-token-dispatcher-type flex (got {self.moe_token_dispatcher_type})"
            )
        if self.moe_pad_expert_input_to_capacity and self.moe_expert_capacity_factor is None:
            raise ValueError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor")
        if self.moe_token_drop_policy != "probs" and self.moe_expert_capacity_factor is None:
            logger.warning(
                "--moe-token-drop-policy %s has no effect without --moe-expert-capacity-factor (no token is dropped)",
                self.moe_token_drop_policy,
            )
        if self.moe_expert_capacity_factor is not None:
            logger.warning(
                "--moe-expert-capacity-factor %g: the trainer drops the tokens over an expert's capacity, the rollout "
                "engine drops none; their log-probs differ on those tokens",
                self.moe_expert_capacity_factor,
            )

    @classmethod
    def from_config(cls, cfg: SlimeArgs) -> MegatronSettings:
        """Defaults ← same-named `cfg` fields (those not None) ← `cfg.megatron_args` tokens.

        Args:
            cfg: run config; reads `megatron_args` (list of CLI tokens) and every field this model shares with
                it (`lr`, `min_lr`, `adam_*`, `clip_grad`, `seed`, `bf16`, `fp16`, `load`, `ref_load`, `save`,
                ...). The parallel sizes come from the tokens.

        Raises:
            ValueError: a token with a bad value (message names the flag), or inconsistent settings.
        """
        shared = set(cls.model_fields) & set(type(cfg).model_fields)
        values: dict[str, Any] = {k: v for k, v in cfg.model_dump(include=shared).items() if v is not None}
        # Only the flags this backend implements; the rest were judged by validation (MEGATRON_FLAG_RULES):
        # architecture descriptions checked against config.json, no-ops logged, unsupported ones rejected.
        tokens = _tokens_read_here(list(cfg.megatron_args))
        try:
            parsed, unknown = _parser().parse_known_args(tokens)
        except argparse.ArgumentError as e:
            raise ValueError(f"--megatron-args: {e}") from e
        values.update({k: v for k, v in vars(parsed).items() if v is not None})
        if unknown:  # a `read` flag of MEGATRON_FLAG_RULES without a field here (tests guard against it)
            raise ValueError(f"Megatron flags not parsed by MegatronSettings: {' '.join(unknown)}")
        try:
            return cls(**values)
        except ValidationError as e:
            first = e.errors()[0]
            if first["type"] == "value_error" and not first["loc"]:  # `_check`'s own message names the flags
                raise ValueError(f"invalid Megatron settings: {first['ctx']['error']}") from e
            where = f"--{str(first['loc'][0]).replace('_', '-')} {first['input']}: " if first["loc"] else ""
            raise ValueError(f"invalid Megatron settings: {where}{first['msg']}") from e

    @property
    def params_dtype_name(self) -> str:
        """Name of the params dtype: bfloat16, float16 or float32."""
        return "bfloat16" if self.bf16 else "float16" if self.fp16 else "float32"

    def world_layout(self, world_size: int) -> types.SimpleNamespace:
        """Data-parallel size for `world_size` ranks, under megatron-core's rules (`parallel_state`).

        Dense layers: TP×PP×CP×DP ranks. Experts fold over a pipeline stage's ranks (MoE parallel folding):
        EP×ETP×PP must divide the world, so EP may exceed DP (the original's TP 4, EP 8 on 8 GPUs).

        Raises:
            ValueError: `world_size` not divisible by TP×PP×CP, or by EP×ETP×PP.
        """
        model_parallel = self.tensor_model_parallel_size * self.pipeline_model_parallel_size
        if world_size % (model_parallel * self.context_parallel_size):
            raise ValueError(
                f"world size {world_size} is not divisible by TP×PP×CP = "
                f"{self.tensor_model_parallel_size}×{self.pipeline_model_parallel_size}×{self.context_parallel_size}"
            )
        expert = self.expert_model_parallel_size * self.expert_tensor_parallel_size * self.pipeline_model_parallel_size
        if world_size % expert:
            raise ValueError(
                f"world size {world_size} is not divisible by EP×ETP×PP = {self.expert_model_parallel_size}×"
                f"{self.expert_tensor_parallel_size}×{self.pipeline_model_parallel_size}"
            )
        return types.SimpleNamespace(data_parallel_size=world_size // (model_parallel * self.context_parallel_size))

    def parallel_state_kwargs(self) -> dict[str, int]:
        """The sizes for `megatron.core.parallel_state.initialize_model_parallel`.

        The expert tensor-parallel size is named: left out, megatron-core makes it the TP size, which shards every
        expert over TP (against `--expert-tensor-parallel-size 1` and the model config) and needs EP×TP×PP ranks.
        """
        return {
            "tensor_model_parallel_size": self.tensor_model_parallel_size,
            "pipeline_model_parallel_size": self.pipeline_model_parallel_size,
            "context_parallel_size": self.context_parallel_size,
            "expert_model_parallel_size": self.expert_model_parallel_size,
            "expert_tensor_parallel_size": self.expert_tensor_parallel_size,
        }

    def check_model_split(self, num_layers: int, num_experts: int | None) -> None:
        """Refuses pipeline stages or expert ranks the model's layers/experts do not split over.

        Args:
            num_layers: decoder layers (`ModelArgs.num_layers`).
            num_experts: routed experts (`ModelArgs.num_experts`), None for a dense model.

        Raises:
            ValueError: naming the flags and counts (`slime_core.config.layer_split`), instead of megatron-core's
                assert while it builds the model.
        """
        problems = layer_split_problems(
            num_layers,
            num_experts,
            pipeline=self.pipeline_model_parallel_size,
            first=self.decoder_first_pipeline_num_layers,
            last=self.decoder_last_pipeline_num_layers,
            expert=self.expert_model_parallel_size,
        )
        if problems:
            raise ValueError(f"the Megatron layout does not fit the model: {'; '.join(problems)}")


def _tokens_read_here(tokens: list[str]) -> list[str]:
    """The tokens (flag and values) of the flags this backend reads: rule `read`, or not a table flag at all.

    `parse_args` only collects table flags; tokens outside the table come from code that builds a config by hand
    (tests), and reach the parser as before.
    """
    kept: list[str] = []
    keep = False
    for token in tokens:
        if token.startswith("--"):
            rule = MEGATRON_FLAG_RULES.get(token.partition("=")[0])
            keep = rule is None or rule.megatron == "read"
        if keep:
            kept.append(token)
    return kept


def _parser() -> argparse.ArgumentParser:
    # Values stay strings; pydantic coerces and validates them (its errors name the field).
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for name, field in MegatronSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if field.annotation in (bool, bool | None):
            parser.add_argument(flag, dest=name, action="store_const", const=True, default=None)
        else:
            parser.add_argument(flag, dest=name, default=None)
    # Negative spellings of defaults slime turns on (Megatron-LM's for the distributed optimizer).
    negatives = ("use_distributed_optimizer", "use_torch_fused_adam", "use_foreach_grad_norm")
    negatives += ("megatron_compile_layers", "check_for_nan_in_loss_and_grad")
    for name in negatives:
        parser.add_argument("--no-" + name.replace("_", "-"), dest=name, action="store_const", const=False)
    return parser


def compiles_layers(
    settings: MegatronSettings, *, cuda: bool, transformer_engine: bool, moe: bool, dense_attention: bool = False
) -> bool:
    """Whether the decoder layers are compiled: `--megatron-compile-layers`, or when unset the measured default.

    Unset, they compile where it was measured to pay and to keep megatron-core's numbers: CUDA, the local spec
    (Transformer Engine's layers are fused already), the packed attention (`--attention-backend auto`/`flash`; not
    megatron-core's `DotProductAttention` over a `[T, T]` mask, `local`: its compiled first step ran past 120 s in a
    tiny model's GPU test), a dense model, TP = CP = 1 (no collective inside a layer).
    Measured (benchmarks/RESULTS.md, `train_megatron_1.7b_ab`): qwen3-1.7b at 8 × 1024 tokens on one H100, 0.670 ->
    0.540 s per train() (40.2 -> 49.9 % MFU) after a 27 s first step; on CPU compilation costs minutes.

    Args:
        settings: the parsed Megatron flags.
        cuda: whether the layers run on a GPU.
        transformer_engine: whether the TE layer spec is used (`model.use_transformer_engine`).
        moe: whether the model has experts.
        dense_attention: whether the core attention is the dense-mask one (`attention_kind` "dense").
    """
    if settings.megatron_compile_layers is not None:
        return settings.megatron_compile_layers
    return (
        cuda
        and not transformer_engine
        and not moe
        and not dense_attention
        and settings.tensor_model_parallel_size == 1
        and settings.context_parallel_size == 1
    )


def head_kind(log_probs_head: str | None, tensor_model_parallel_size: int, *, cuda: bool = False) -> HeadKind:
    """The head `--log-probs-head` selects for the Megatron actor.

    Unset, it is `fused` on CUDA at TP 1 (as the FSDP backend's GPU default: fp32 logits of the response rows
    only; qwen3-1.7b at 8 × 1024 tokens on one H100: 35.3 -> 40.2 % MFU with the layers eager, 66 -> 53 GiB peak),
    else megatron-core's `logits` (bf16 logits of every position, vocabulary-parallel).

    Args:
        log_probs_head: the run's `--log-probs-head`.
        tensor_model_parallel_size: `--tensor-model-parallel-size`.
        cuda: whether the model runs on a GPU (preflight passes False: it only judges the flag).

    Raises:
        ValueError: a head other than `fused` (the others are the FSDP backend's), or `fused` with TP > 1.
    """
    if log_probs_head is None:
        return "fused" if cuda and tensor_model_parallel_size == 1 else "logits"
    if log_probs_head != "fused":
        raise ValueError(
            f"--log-probs-head {log_probs_head} is an FSDP head; the Megatron backend has its default head "
            "(leave the flag out) and fused"
        )
    if tensor_model_parallel_size != 1:
        raise ValueError(
            f"--log-probs-head fused needs --tensor-model-parallel-size 1 (got {tensor_model_parallel_size}): "
            "it is not vocabulary-parallel; leave --log-probs-head out"
        )
    return "fused"


AttentionKind = Literal["packed", "dense", "transformer_engine"]


def attention_kind(settings: MegatronSettings, transformer_engine: bool) -> AttentionKind:
    """Which core attention `--attention-backend` (Megatron-LM's flag) selects for this layer spec.

    - Transformer Engine spec: "transformer_engine" (TE picks flash/fused/unfused from the flag).
    - Local spec: "packed" for auto/flash (`PackedCoreAttention`, THD rows), "dense" for local (megatron-core's
      `DotProductAttention` with a `[T, T]` block mask).

    Args:
        settings: the Megatron settings (`attention_backend`, `context_parallel_size`).
        transformer_engine: whether the TE layer spec is used (`model.use_transformer_engine`).

    Raises:
        ValueError: `local` with the TE spec, `fused`/`unfused` without it, or context parallelism without it.
    """
    backend = settings.attention_backend
    if transformer_engine:
        if backend == "local":
            raise ValueError(
                "--attention-backend local selects megatron-core's DotProductAttention, which needs "
                "--transformer-impl local (Transformer Engine is in use)"
            )
        return "transformer_engine"
    if backend in ("fused", "unfused"):
        raise ValueError(
            f"--attention-backend {backend} is a Transformer Engine backend, but the local layer spec is in use "
            "(Transformer Engine not installed or --transformer-impl local): use auto, flash or local"
        )
    if settings.context_parallel_size > 1:
        raise ValueError(
            "--context-parallel-size > 1 needs Transformer Engine (--transformer-impl transformer_engine): the "
            f"local spec's attention (--attention-backend {backend}) has no context-parallel exchange"
        )
    return "dense" if backend == "local" else "packed"
