"""megatron-core `GPTModel` built from a HF config, loaded from HF weights, and exported as HF weights.

The architecture comes from `slime_convert.ModelArgs` (config.json), the names and tensor transforms
from `slime_convert.mapping` (the same tables the converter uses). Direct HF loading builds each full
Megatron tensor and keeps this rank's TP/EP slice; export gathers TP shards and EP experts, maps names
to HF and broadcasts every pipeline stage's tensors so all ranks see the whole model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnBackend

from slime_convert import ModelArgs
from slime_convert.hf_io import HFCheckpointReader
from slime_convert.mapping import mcore_tensor_from_hf, mcore_to_hf
from slime_core.compile_setup import prepare_layer_compile
from slime_train_megatron.attention import PackedCoreAttention, attention_kind
from slime_train_megatron.layers import sandwich_norm_spec
from slime_train_megatron.settings import MegatronSettings
from slime_train_megatron.sp_norm import sequence_parallel_norms
from slime_train_megatron.traceable import use_traceable_layer_pieces
from slime_train_megatron.value_head import ValueHead, value_head_from_hf
from slime_train_megatron.weights import merge_tp_shards, shard_for_tp

logger = logging.getLogger(__name__)

__all__ = [
    "use_transformer_engine",
    "build_gpt_model",
    "moe_grouped_gemm",
    "moe_token_dispatcher",
    "compile_decoder_layers",
    "build_transformer_config",
    "global_param_names",
    "iter_hf_weights",
    "load_hf_weights",
]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.")
_EXPERT_RE = re.compile(r"(local_experts\.)(\d+)(\.)|(linear_fc[12]\.weight)(\d+)$")


def use_transformer_engine(settings: MegatronSettings) -> bool:
    """Whether the Transformer Engine layer spec is used (`--transformer-impl`, else TE when importable)."""
    if settings.transformer_impl == "local":
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        if settings.transformer_impl == "transformer_engine":
            raise ValueError("--transformer-impl transformer_engine but Transformer Engine is not installed") from None
        return False
    return True


def build_transformer_config(
    model_args: ModelArgs, settings: MegatronSettings, *, cpu: bool = False
) -> TransformerConfig:
    """megatron-core `TransformerConfig` for the HF architecture and the parallel/precision settings.

    Args:
        model_args: architecture from config.json.
        settings: Megatron settings.
        cpu: initialize weights on CPU (tests).
    """
    kwargs = model_args.transformer_config_kwargs()
    kwargs["activation_func"] = torch.nn.functional.silu
    kwargs.update(_optional_kwargs(model_args, settings))
    dtype = _DTYPES[settings.params_dtype_name]
    if use_transformer_engine(settings):
        # TE picks its kernel from this (through NVTE_* variables). The local spec chooses its core attention in
        # the layer spec instead and keeps the default, so building models with different choices in one
        # process does not trip megatron-core's check that the NVTE_* variables never change.
        kwargs["attention_backend"] = AttnBackend[settings.attention_backend]
    return TransformerConfig(
        **kwargs,
        tensor_model_parallel_size=settings.tensor_model_parallel_size,
        pipeline_model_parallel_size=settings.pipeline_model_parallel_size,
        context_parallel_size=settings.context_parallel_size,
        expert_model_parallel_size=settings.expert_model_parallel_size,
        expert_tensor_parallel_size=settings.expert_tensor_parallel_size,
        sequence_parallel=settings.sequence_parallel,
        params_dtype=dtype,
        bf16=settings.bf16,
        fp16=settings.fp16,
        pipeline_dtype=dtype,
        # Packed micro-batches differ in length: pipeline p2p must exchange shapes.
        variable_seq_lengths=settings.pipeline_model_parallel_size > 1,
        use_cpu_initialization=cpu,
        # Weights are loaded right after, but megatron-core marks TP-split parameters (`tensor_model_parallel`,
        # `partition_dim`: read by the grad norm, the loaders and the exporters) only while initializing them.
        perform_initialization=True,
        # The local spec's fused softmax needs apex's `scaled_masked_softmax_cuda` (not shipped with
        # megatron-core), and the bias fusions torch.compile at first use (off unless asked); TE brings its own.
        bias_activation_fusion=settings.bias_swiglu_fusion,
        bias_dropout_fusion=settings.bias_dropout_fusion,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        recompute_granularity=settings.recompute_granularity,
        recompute_method=settings.recompute_method,
        recompute_num_layers=settings.recompute_num_layers,
        moe_token_dispatcher_type=moe_token_dispatcher(settings, model_args, cpu=cpu),
        moe_grouped_gemm=moe_grouped_gemm(settings, model_args),
        # As the original's default: megatron-core averages over micro-batches and DP×CP ranks, and so scales the MoE
        # router's aux/z losses (with True it sums them over micro-batches and ranks, times each one's token count).
        # `PipelineRunner.run` undoes the averaging of the main loss, which the backends normalize themselves.
        calculate_per_token_loss=False,
    )


def moe_token_dispatcher(settings: MegatronSettings, model_args: ModelArgs, *, cpu: bool) -> str:
    """The token dispatcher megatron-core runs: `--moe-token-dispatcher-type`, except where it cannot run here.

    On CPU `alltoall` (slime's and the original scripts' choice) becomes `allgather`, logged: megatron-core 0.16's
    `MoEAlltoAllTokenDispatcher` creates a CUDA stream when it is built, and both dispatchers route and combine the same
    tokens with the same weights (they differ in which collectives move them). `flex` is megatron-core's DeepEP
    dispatcher: without the `deep_ep` package megatron-core raises while building the first MoE layer.

    Args:
        settings: the Megatron flags.
        model_args: the architecture (dense models keep the flag: they build no dispatcher).
        cpu: whether the model is built for CPU (`build_transformer_config`'s `cpu`).

    Raises:
        ValueError: `flex` where `deep_ep` is not importable.
    """
    kind = settings.moe_token_dispatcher_type
    if not model_args.is_moe:
        return kind
    if kind == "flex":
        from megatron.core.transformer.moe import fused_a2a

        if fused_a2a.fused_dispatch is None:
            raise ValueError(
                "--moe-token-dispatcher-type flex needs DeepEP (the deep_ep package is not importable here); "
                "use alltoall"
            )
    if kind == "alltoall" and cpu:
        logger.info("--moe-token-dispatcher-type alltoall needs CUDA streams; the CPU model dispatches by allgather")
        return "allgather"
    return kind


def moe_grouped_gemm(settings: MegatronSettings, model_args: ModelArgs) -> bool:
    """`--moe-grouped-gemm` as the layer spec can run it: Transformer Engine's grouped experts, else off (logged).

    The local spec's grouped experts are megatron-core's legacy `GroupedMLP`, which needs the CUDA-only
    `grouped_gemm` package and keeps every expert in one `weight1`/`weight2` tensor that the HF name tables do not
    map; the per-expert `SequentialMLP` computes the same products one expert at a time (the original's Qwen3-MoE
    scripts pass the flag; without Transformer Engine megatron-core asserted while building the first MoE layer).
    """
    if not (settings.moe_grouped_gemm and model_args.is_moe):
        return False
    if use_transformer_engine(settings):
        return True
    logger.warning("--moe-grouped-gemm needs Transformer Engine (local layer spec here); experts run one by one")
    return False


def _optional_kwargs(model_args: ModelArgs, settings: MegatronSettings) -> dict[str, object]:
    """`TransformerConfig` kwargs of the optional Megatron flags (megatron-core's defaults when absent).

    Uneven pipeline stages, the attention softmax precision, and the MoE training knobs (the attention kernel is
    set by `build_transformer_config` / `build_gpt_model`).
    """
    out: dict[str, object] = {
        "num_layers_in_first_pipeline_stage": settings.decoder_first_pipeline_num_layers,
        "num_layers_in_last_pipeline_stage": settings.decoder_last_pipeline_num_layers,
        "attention_softmax_in_fp32": settings.attention_softmax_in_fp32,
        "deterministic_mode": settings.deterministic_mode,
    }
    if model_args.is_moe:
        out.update(
            moe_router_load_balancing_type=settings.moe_router_load_balancing_type,
            moe_router_bias_update_rate=settings.moe_router_bias_update_rate,
            moe_router_dtype=settings.moe_router_dtype,
            moe_token_drop_policy=settings.moe_token_drop_policy,
            moe_expert_capacity_factor=settings.moe_expert_capacity_factor,
            moe_pad_expert_input_to_capacity=settings.moe_pad_expert_input_to_capacity,
            moe_enable_deepep=settings.moe_enable_deepep,
        )
        if settings.moe_permute_fusion:
            # Transformer Engine's fused permute kernels; without TE megatron-core refuses the option.
            out["moe_permute_fusion"] = use_transformer_engine(settings)
            if not out["moe_permute_fusion"]:
                logger.warning("--moe-permute-fusion needs Transformer Engine (local layer spec here); not fused")
        if settings.moe_aux_loss_coeff is not None:  # the flag wins over config.json's router_aux_loss_coef
            out["moe_aux_loss_coeff"] = settings.moe_aux_loss_coeff
        if settings.moe_z_loss_coeff is not None:
            out["moe_z_loss_coeff"] = settings.moe_z_loss_coeff
    return out


def build_gpt_model(
    model_args: ModelArgs, settings: MegatronSettings, config: TransformerConfig, *, value_head: bool = False
) -> GPTModel:
    """The `GPTModel` of this pipeline stage (Transformer Engine spec when available, else local).

    With the local spec the core attention follows `--attention-backend` (`attention.attention_kind`): slime's
    `PackedCoreAttention` (THD rows, no mask) or megatron-core's `DotProductAttention` (dense mask). GLM4's
    post-sublayer norms (`ModelArgs.sandwich_norm`) come from `slime_train_megatron.layers`.

    Args:
        model_args: the architecture.
        settings: Megatron settings.
        config: the transformer config.
        value_head: the PPO critic: untied embeddings and a scalar `ValueHead` as `output_layer`.

    Raises:
        ValueError: an `--attention-backend` the spec cannot run (see `attention.attention_kind`).
    """
    kind = attention_kind(settings, use_transformer_engine(settings))
    if model_args.num_experts:
        _router_gemm_without_te()
    if kind == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=model_args.num_experts,
            moe_grouped_gemm=config.moe_grouped_gemm,
            qk_layernorm=model_args.qk_layernorm,
        )
    else:
        spec = get_gpt_layer_local_spec(
            num_experts=model_args.num_experts,
            moe_grouped_gemm=config.moe_grouped_gemm,
            qk_layernorm=model_args.qk_layernorm,
            normalization="RMSNorm",
        )
        if kind == "packed":
            spec.submodules.self_attention.submodules.core_attention = PackedCoreAttention
    if model_args.sandwich_norm:
        spec = sandwich_norm_spec(spec, use_te=kind == "transformer_engine")
    if kind != "transformer_engine" and config.sequence_parallel:
        spec = sequence_parallel_norms(spec, config)  # torch's norms refuse it unmarked (sp_norm.py)
    kwargs = model_args.gpt_model_kwargs(settings.tensor_model_parallel_size)
    if value_head:
        kwargs["share_embeddings_and_output_weights"] = False
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        **kwargs,
    )
    if value_head and model.post_process:
        model.output_layer = ValueHead(config)
    if config.bf16 or config.fp16:
        # What megatron's Float16Module does to the weights: the local spec's torch norms are built in fp32.
        model.to(config.params_dtype)
    return model


def _router_gemm_without_te() -> None:
    """Lets megatron-core's MoE router GEMM run without Transformer Engine.

    megatron-core 0.16's `RouterGatingLinearFunction` picks TE's GEMM when `moe_utils.te_general_gemm` is not None
    and torch's `mm` otherwise, but the module defines that name only when TE imports: without TE (our local spec)
    every MoE forward raised `NameError: name 'te_general_gemm' is not defined` (Qwen3-MoE GRPO on one H100,
    2026-12-07). Setting it to None selects megatron-core's own torch path, forward and backward.
    """
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def compile_decoder_layers(model: GPTModel, backend: str = "inductor") -> int:
    """`--megatron-compile-layers`: `torch.compile(dynamic=True)` on each decoder layer of this stage, in place.

    Regional compilation, as the FSDP backend's `--fsdp-compile-layers`: every layer has the same code, so the
    graphs are built once and reused (checked on CPU: 2 and 6 layers give the same 25 graphs); packed rows change
    length, hence dynamic shapes. Two megatron-core pieces that broke every layer's graph are replaced by traceable
    ones with the same numbers (`traceable.use_traceable_layer_pieces`: the row-parallel linear's per-call warning,
    THD RoPE's host read of the sequence lengths); the norms, RoPE, SwiGLU and residual adds fuse in what is
    compiled, and `make_viewless_tensor` at the layer's end still breaks. Parameters, names and hooks are unchanged
    (`nn.Module.compile` wraps the call only). Float inputs are compiled as constants and inductor's workers start now
    (`slime_core.compile_setup.prepare_layer_compile`).

    Args:
        model: this stage's `GPTModel`.
        backend: the `torch.compile` backend (tests use `aot_eager`: the same graphs without code generation).

    Returns:
        The number of layers compiled.
    """
    prepare_layer_compile(next(model.parameters()).device)
    use_traceable_layer_pieces()
    for layer in model.decoder.layers:
        layer.compile(dynamic=True, backend=backend)
    return len(model.decoder.layers)


def _layer_offsets(model: GPTModel) -> dict[int, int]:
    return {i: layer.layer_number - 1 for i, layer in enumerate(model.decoder.layers)}


def global_param_names(model: GPTModel, model_args: ModelArgs) -> dict[str, str]:
    """Local parameter name → name with global layer and expert indices (what the mapping tables use)."""
    offsets = _layer_offsets(model)
    num_local_experts = (model_args.num_experts or 0) // max(parallel_state.get_expert_model_parallel_world_size(), 1)
    expert_offset = parallel_state.get_expert_model_parallel_rank() * num_local_experts
    out = {}
    for name, _ in model.named_parameters():
        g = _LAYER_RE.sub(lambda m: f"decoder.layers.{offsets[int(m.group(1))]}.", name)
        if model_args.is_moe and ".experts." in g:
            g = _EXPERT_RE.sub(
                lambda m: (
                    f"{m.group(1)}{int(m.group(2)) + expert_offset}{m.group(3)}"
                    if m.group(1)
                    else f"{m.group(4)}{int(m.group(5)) + expert_offset}"
                ),
                g,
            )
        out[name] = g
    return out


def _tp_info(param: torch.nn.Parameter, name: str, gated: bool) -> tuple[bool, int, bool, bool]:
    """(is TP-partitioned, partition dim, gated fc1, is expert)."""
    is_expert = not getattr(param, "allreduce", True)
    partitioned = bool(getattr(param, "tensor_model_parallel", False))
    is_fc1 = re.search(r"linear_fc1\.weight\d*$", name) is not None
    return partitioned, int(getattr(param, "partition_dim", 0)), gated and is_fc1, is_expert


@torch.no_grad()
def load_hf_weights(
    model: GPTModel, hf_dir: str, model_args: ModelArgs, settings: MegatronSettings, *, value_head: bool = False
) -> None:
    """Loads HF safetensors into this rank's (TP/PP/EP-local) parameters through the mapping tables.

    With `value_head` (the critic) the `output_layer` is the `ValueHead`: it takes the checkpoint's `[1, H]` head
    (`value_head.*` / `score.*`) when there is one and otherwise keeps its fresh initialization.

    Raises:
        KeyError: a parameter without mapping, or a missing HF tensor.
        ValueError: a shape mismatch (names the parameter).
    """
    reader = HFCheckpointReader(hf_dir)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = settings.tensor_model_parallel_size

    def read(name: str) -> torch.Tensor:
        if name == "lm_head.weight" and name not in reader:
            name = "model.embed_tokens.weight"
        return reader.get(name)

    names = global_param_names(model, model_args)
    head = value_head_from_hf(reader.get, reader.__contains__) if value_head else None
    for local, param in model.named_parameters():
        name = names[local]
        if value_head and local.startswith("output_layer."):
            if head is not None:
                param.copy_(head[local.rsplit(".", 1)[1]].reshape(param.shape).to(param.dtype))
            continue
        if model_args.tie_word_embeddings and name.endswith("output_layer.weight"):
            name = "embedding.word_embeddings.weight"  # the last pipeline stage's copy of the shared embedding
        full = mcore_tensor_from_hf(name, read, model_args, tp=tp_size)
        partitioned, dim, gated, is_expert = _tp_info(param, local, model.config.gated_linear_unit)
        if partitioned and not is_expert and tp_size > 1:
            full = shard_for_tp(full, tp_rank, tp_size, partition_dim=dim, gated=gated)
        if tuple(full.shape) != tuple(param.shape):
            raise ValueError(f"{local} ({names[local]}): HF gives {tuple(full.shape)}, model has {tuple(param.shape)}")
        param.copy_(full.to(param.dtype))
    reader.close()
    logger.info("loaded HF weights from %s", hf_dir)


def _all_gather(t: torch.Tensor, group: dist.ProcessGroup, size: int) -> list[torch.Tensor]:
    if size == 1:
        return [t]
    out = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


@torch.no_grad()
def _iter_stage_full_params(model: GPTModel, model_args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    """This stage's parameters as full tensors under global Megatron names (collective over TP and EP)."""
    names = global_param_names(model, model_args)
    tp_group = parallel_state.get_tensor_model_parallel_group()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    ep_group = parallel_state.get_expert_model_parallel_group()
    ep_size = parallel_state.get_expert_model_parallel_world_size()
    num_local_experts = (model_args.num_experts or 0) // max(ep_size, 1)
    for local, param in model.named_parameters():
        if model_args.tie_word_embeddings and local.endswith("output_layer.weight"):
            continue  # the last stage's copy of the shared embedding
        partitioned, dim, gated, is_expert = _tp_info(param, local, model.config.gated_linear_unit)
        tensor = param.detach()
        if partitioned and not is_expert and tp_size > 1:
            tensor = merge_tp_shards(_all_gather(tensor, tp_group, tp_size), partition_dim=dim, gated=gated)
        if not is_expert or ep_size == 1:
            yield names[local], tensor
            continue
        ep_rank = parallel_state.get_expert_model_parallel_rank()
        for src, shard in enumerate(_all_gather(tensor, ep_group, ep_size)):
            # Re-index the expert from this rank's numbering to rank `src`'s.
            delta = (src - ep_rank) * num_local_experts
            name = re.sub(
                r"(local_experts\.|\.weight)(\d+)",
                lambda m, d=delta: f"{m.group(1)}{int(m.group(2)) + d}",
                names[local],
            )
            yield name, shard


@torch.no_grad()
def iter_hf_weights(model: GPTModel, model_args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    """All HF `(name, tensor)` pairs of the model, on every rank (collective over TP, EP and PP).

    Each pipeline stage's tensors are broadcast over the PP group in stage order, so every rank yields
    the same sequence; embedding/head padding is stripped and fused tensors are split.
    """
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    if pp_size == 1:
        for name, tensor in _iter_stage_full_params(model, model_args):
            yield from mcore_to_hf(name, tensor, model_args)
        return
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    ranks = dist.get_process_group_ranks(pp_group)
    device = next(model.parameters()).device
    for stage in range(pp_size):
        local = list(_iter_stage_full_params(model, model_args)) if stage == pp_rank else []
        meta = [[(n, tuple(t.shape), t.dtype) for n, t in local]]
        dist.broadcast_object_list(meta, src=ranks[stage], group=pp_group)
        for i, (name, shape, dtype) in enumerate(meta[0]):
            tensor = local[i][1].contiguous() if stage == pp_rank else torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(tensor, src=ranks[stage], group=pp_group)
            yield from mcore_to_hf(name, tensor, model_args)
