"""Building a Hugging Face causal LM sharded with FSDP2.

Rank 0 reads the checkpoint on CPU; the other ranks build the same architecture on the meta device (no
memory). After `fully_shard` (one unit per decoder layer, then the root), the full state dict of rank 0 is
scattered with `set_model_state_dict(..., broadcast_from_rank0=True)`, so no rank ever holds a full copy of
the model on the accelerator. Non-persistent buffers (rotary `inv_freq`) are not in the state dict and are
broadcast from rank 0 by hand.

Vision-language checkpoints (a config with `vision_config`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL) are built as
`AutoModelForImageTextToText`, their vision blocks sharded like decoder layers, their vision attention on sdpa
(the packed-row implementations serve the language model); checkpoint tensor names are mapped to module names
(`slime_core.hf_names`) when they are loaded.

Context parallelism (`--context-parallel-size C`): the parameters are still sharded over the whole world (so
the `C` ranks of a group sum their token slices' gradients in FSDP's reduce-scatter, as torchtitan's
`dp_shard_cp` does), and a `("dp", "cp")` mesh provides the CP groups of `C` consecutive ranks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, PretrainedConfig

from slime_core.compile_setup import prepare_layer_compile
from slime_core.config import SlimeArgs
from slime_core.config.base import warn_once
from slime_core.hf_names import is_vision_tower_param, to_module_name
from slime_core.moe_experts import fuse_experts
from slime_train_fsdp.attention import DEFAULT_CUDA_ATTENTION, SLIME_FLEX, SLIME_VARLEN, register_attention
from slime_train_fsdp.logprob_head import HEADS, default_head
from slime_train_fsdp.lora import hf_name, initial_adapter_state, inject_lora
from slime_train_fsdp.packing import ForwardOptions, install_response_forward
from slime_train_fsdp.vision import is_vision_language

logger = logging.getLogger(__name__)

__all__ = [
    "LORA_EAGER_REASON",
    "FillMissing",
    "build_fsdp_model",
    "compiles_layers",
    "compute_dtype",
    "default_device",
    "gathered_through_backward",
    "load_hf_weights_into",
    "loaded_message",
    "read_hf_state_dict",
]


def default_device() -> torch.device:
    """`cuda:LOCAL_RANK` (made the current device) when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _attn_implementation(cfg: SlimeArgs, device: torch.device) -> str:
    """`--attn-implementation`; unset or `auto`: `DEFAULT_CUDA_ATTENTION` on CUDA, `sdpa` on CPU (without CP).

    Every value handles packed rows. `slime_varlen` / `slime_flex` (`attention.py`) get the row's boundaries
    once per micro-batch and build no mask; with `attention_mask=None` and `position_ids` restarting at 0,
    transformers (>= 5) derives cu_seqlens for `flash_attention_2` and a dense block-diagonal causal mask for
    sdpa/eager (`masking_utils.find_packed_sequence_indices`).
    """
    register_attention()
    explicit = cfg.attn_implementation
    if explicit and explicit != "auto":
        return explicit
    if device.type == "cuda":
        return DEFAULT_CUDA_ATTENTION
    # Context parallelism runs on our implementations only; on CPU they fall back to exact per-sequence SDPA.
    return SLIME_VARLEN if cfg.context_parallel_size > 1 else "sdpa"


def _forward_options(cfg: SlimeArgs, device: torch.device, attn: str, vision_language: bool) -> ForwardOptions:
    """The log-prob head and, with `--context-parallel-size C > 1`, this rank's CP group (collective).

    The `fused` head compiles its elementwise functions exactly when the decoder layers are compiled
    (`ForwardOptions.compile_head`).

    Raises:
        ValueError: unknown head; a CP size that does not divide the world; CP with an attention
            implementation other than `slime_varlen`/`slime_flex`, or with a vision-language model.
    """
    head = cfg.log_probs_head or default_head(device)
    if head not in HEADS:
        raise ValueError(f"--log-probs-head {head!r}: known heads are {sorted(HEADS)}")
    compile_head = compiles_layers(cfg, device)  # read by `fused` only, also when a call picks it (`head=`)
    cp = cfg.context_parallel_size
    if cp == 1:
        return ForwardOptions(head=head, compile_head=compile_head, vision_language=vision_language,
                              true_on_policy=cfg.true_on_policy_mode)  # fmt: skip
    world = dist.get_world_size()
    if world % cp:
        raise ValueError(f"--context-parallel-size {cp} must divide the number of trainer ranks ({world})")
    if attn not in (SLIME_VARLEN, SLIME_FLEX):
        raise ValueError(
            f"--context-parallel-size {cp} needs --attn-implementation {SLIME_VARLEN} or {SLIME_FLEX}, got {attn!r}"
        )
    if vision_language:
        raise ValueError(f"--context-parallel-size {cp}: vision-language models train without context parallelism")
    mesh = init_device_mesh(device.type, (world // cp, cp), mesh_dim_names=("dp", "cp"))
    return ForwardOptions(head=head, compile_head=compile_head, cp_group=mesh.get_group("cp"))


def read_hf_state_dict(path: str | pathlib.Path) -> dict[str, torch.Tensor]:
    """Reads all tensors of an HF checkpoint directory into CPU fp32 memory (called on rank 0 only).

    Args:
        path: directory with `model.safetensors` or sharded `model-*.safetensors` (+ index).

    Returns:
        Mapping from HF parameter name to CPU tensor.

    Raises:
        FileNotFoundError: when the directory has no safetensors files.
    """
    from safetensors.torch import load_file

    files = sorted(pathlib.Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path} (--hf-checkpoint/--ref-load)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        # Convert file by file so that the peak is one fp32 model plus one shard, not both full copies.
        state.update({k: v.float() for k, v in load_file(str(f), device="cpu").items()})
    return state


def _layer_classes(model: nn.Module) -> tuple[type, ...]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"{type(model).__name__} declares no `_no_split_modules`; cannot pick FSDP units")
    return tuple(classes)


#: Why `--fsdp-compile-layers` (unset) leaves peft-wrapped layers eager; logged when a LoRA model is built.
LORA_EAGER_REASON = (
    "--lora-rank: the decoder layers run eagerly (--fsdp-compile-layers is off by default with LoRA: the qwen3-0.6b "
    "GPU acceptance run spent 83 s compiling the peft-wrapped layers in its first compiled step, after eager steps "
    "of 3.7 s train time; compiled LoRA steps took 4.9-5.7 s at 8bc21c5); pass --fsdp-compile-layers to compile them"
)


def compiles_layers(cfg: SlimeArgs, device: torch.device) -> bool:
    """Whether the decoder layers are compiled: `--fsdp-compile-layers`; unset: on CUDA, except with `--lora-rank`.

    An explicit `--fsdp-compile-layers` wins (also with LoRA); `--true-on-policy-mode` never compiles. The LoRA
    default is measured (`LORA_EAGER_REASON`).
    """
    if cfg.true_on_policy_mode:  # the mode runs its own uncompiled layer forward (compilation changes rounding)
        return False
    if cfg.fsdp_compile_layers is not None:
        return cfg.fsdp_compile_layers
    return device.type == "cuda" and not cfg.lora_rank


def _log_lora_eager(cfg: SlimeArgs, device: torch.device) -> bool:
    """Logs `LORA_EAGER_REASON` when LoRA alone turned the layers' compilation off; returns whether it did."""
    lora_off = bool(cfg.lora_rank) and cfg.fsdp_compile_layers is None and device.type == "cuda"
    if lora_off and not cfg.true_on_policy_mode:
        logger.info(LORA_EAGER_REASON)
        return True
    return False


def compute_dtype(device: torch.device) -> torch.dtype:
    """The dtype the layers and the log-prob head compute in: bf16 on CUDA (`mixed_precision_policy`), else fp32."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def note_precision_flag(cfg: SlimeArgs, device: torch.device) -> None:
    """`--bf16` on a CPU trainer: the layers compute in fp32 there (`compute_dtype`), so say once that it is unused.

    On CUDA the flag is what FSDP always does (bf16 compute, fp32 master weights and reduction); `--fp16` is refused
    by validation (`slime_core.config.validation_trainer`).
    """
    if cfg.bf16 and compute_dtype(device) != torch.bfloat16:
        warn_once(
            "fsdp_cpu_bf16",
            f"--bf16 has no effect on the FSDP trainer's {device.type} device: it computes in float32 there "
            "(bf16 compute is its CUDA behaviour, with or without the flag)",
        )


def mixed_precision_policy(cfg: SlimeArgs) -> MixedPrecisionPolicy:
    """bf16 compute, fp32 master weights and fp32 gradient reduction (CUDA).

    With `--true-on-policy-mode` the units do not cast their floating-point inputs to bf16: the mirrored layers
    take SGLang's fp32 residual stream and fp32 rotary tables as inputs (`true_on_policy.qwen3`).
    """
    return MixedPrecisionPolicy(
        param_dtype=compute_dtype(torch.device("cuda")),
        reduce_dtype=torch.float32,
        cast_forward_inputs=not cfg.true_on_policy_mode,
    )


def _apply_fsdp(model: nn.Module, mesh: DeviceMesh, cfg: SlimeArgs, device: torch.device) -> None:
    """One FSDP unit per decoder layer, then the root (embeddings, final norm, lm_head stay in the root unit)."""
    kwargs: dict[str, Any] = {"mesh": mesh}
    if device.type == "cuda":
        kwargs["mp_policy"] = mixed_precision_policy(cfg)
        if cfg.fsdp_cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
    elif cfg.fsdp_cpu_offload:
        logger.warning("--fsdp-cpu-offload has no effect on CPU")
    layer_types = _layer_classes(model)
    compile_layers = compiles_layers(cfg, device)
    _log_lora_eager(cfg, device)
    vision_blocks = {id(m) for n, m in model.named_modules() if is_vision_tower_param(n + ".")}
    if compile_layers:
        prepare_layer_compile(device)
    for module in model.modules():
        if isinstance(module, layer_types):
            # Vision blocks are not compiled: their attention splits the patch sequence at data-dependent windows.
            if compile_layers and id(module) not in vision_blocks:
                # Regional compilation (as torchtitan): every layer runs the same code, so one dynamic-shape graph
                # serves all layers and all packed lengths; it fuses the norm/activation/rotary elementwise work.
                module.compile(dynamic=True)
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)


@contextlib.contextmanager
def gathered_through_backward(model: nn.Module) -> Iterator[None]:
    """Within the block, a one-rank model keeps its gathered (bf16) parameters from forward to backward.

    On one rank a shard is the whole tensor, so FSDP's re-gather in backward only repeats the fp32 -> bf16
    copy of every parameter (part of the ~93 ms of casts and copies per step that the qwen3-1.7b profile at
    8 x 1024 tokens shows, issue 26). Backward reshards each unit as usual; the block's exit reshards what is
    left and restores the default, so no-grad forwards, swaps, saves and offloads see shards as before. With
    more ranks the block changes nothing (there the re-gather is what keeps memory sharded).
    """
    units = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
    one_rank = dist.is_initialized() and dist.get_world_size() == 1
    if not one_rank or not units:
        yield
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.set_reshard_after_forward(True, recurse=False)
            unit.reshard()


def _broadcast_buffers(model: nn.Module) -> None:
    for _, buf in model.named_buffers():
        dist.broadcast(buf, src=0)


FillMissing = Callable[[nn.Module, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""`fill(model, state) -> tensors`: full CPU tensors for parameters the checkpoint `state` lacks (rank 0 only),
e.g. a freshly initialized value head."""


def load_hf_weights_into(
    model: nn.Module,
    path: str | pathlib.Path,
    *,
    extra: dict[str, torch.Tensor] | None = None,
    fill_missing: FillMissing | None = None,
    flag: str = "--hf-checkpoint",
) -> None:
    """Loads an HF checkpoint into an already-sharded model (collective: every rank calls it).

    Rank 0 reads the files; the tensors reach the other ranks shard by shard through
    `set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`. A LoRA-adapted layer's base weight
    (`<module>.base_layer.weight`) is read from `<module>.weight`.

    Args:
        model: FSDP2-sharded model with HF parameter names.
        path: HF checkpoint directory.
        extra: full tensors of parameters the checkpoint does not hold (the LoRA adapters' initial values), by
            parameter name; read on rank 0 only.
        fill_missing: supplies parameters the checkpoint does not have (run on rank 0 before the check).
        flag: the flag that named `path` (`--hf-checkpoint`, `--ref-load`, `--opd-teacher-load`), for errors.

    Raises:
        ValueError: the checkpoint lacks parameters of the model, or holds one of another shape (checked before
            any is loaded; names the flag, the path, the first keys and the config fields the model was built
            with). The app's preflight checks the same from file headers before start-up
            (`slime_convert.load_shapes`); this covers the backend used on its own.
    """
    state: dict[str, torch.Tensor] = {}
    if dist.get_rank() == 0:
        # Checkpoint names (e.g. `visual.*` of Qwen2.5-VL) become module names; text models' are the same.
        model_type = model.config.model_type
        checkpoint = {to_module_name(k, model_type): v for k, v in read_hf_state_dict(path).items()}
        checkpoint = fuse_experts(checkpoint, {hf_name(k) for k in model.state_dict()})  # MoE: transformers' layout
        if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in checkpoint:
            tied = next((v for k, v in checkpoint.items() if k.endswith("embed_tokens.weight")), None)
            if tied is not None:
                checkpoint["lm_head.weight"] = tied
        if fill_missing is not None:
            checkpoint.update(fill_missing(model, checkpoint))
        extra = extra or {}
        missing = []
        for key in model.state_dict():
            source = extra.get(key, checkpoint.get(hf_name(key)))
            if source is None:
                missing.append(key)
            else:
                state[key] = source
        if missing:
            raise ValueError(
                f"{flag} {path}: checkpoint lacks {len(missing)} parameters, e.g. {sorted(missing)[:3]}; "
                f"the model is built from config.json with {_config_fields(model.config)}"
            )
        _check_shapes(model, state, flag, path)
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def _causal_lm(config: PretrainedConfig, attn: str) -> nn.Module:
    """The checkpoint's policy model: `AutoModelForCausalLM`, or `AutoModelForImageTextToText` for a VL one."""
    if is_vision_language(config):
        # The vision tower attends within image windows (its own cu_seqlens): sdpa there, the packed-row
        # implementation for the language model.
        attn_arg = {"": attn, "text_config": attn, "vision_config": "sdpa"}
        return AutoModelForImageTextToText.from_config(config, attn_implementation=attn_arg, dtype=torch.float32)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)


def _config_fields(config: PretrainedConfig) -> str:
    text = getattr(config, "text_config", None) or config
    names = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
             "intermediate_size", "vocab_size", "num_experts", "moe_intermediate_size")  # fmt: skip
    return ", ".join(f"{n}={getattr(text, n)}" for n in names if getattr(text, n, None) is not None)


def _check_shapes(model: nn.Module, state: dict[str, torch.Tensor], flag: str, path: str | pathlib.Path) -> None:
    """Every checkpoint tensor must have its parameter's global shape (a DTensor's `.shape` is the global one).

    Without it `set_model_state_dict` failed inside torch with a size error naming neither the flag nor the
    config (a 2-layer-wide `--ref-load` loaded into a model built from a larger `--hf-checkpoint`).
    """
    params = model.state_dict()
    wrong = [
        f"{hf_name(k)} has shape {list(v.shape)}, expected {list(params[k].shape)}"
        for k, v in state.items()
        if tuple(v.shape) != tuple(params[k].shape)
    ]
    transposed = [
        hf_name(k)
        for k, v in state.items()
        if k.endswith(("experts.gate_up_proj", "experts.down_proj"))
        and v.ndim == 3
        and tuple(v.shape) != tuple(params[k].shape)
        and tuple(v.transpose(1, 2).shape) == tuple(params[k].shape)
    ]
    if transposed:
        # Qwen3-VL-MoE's published checkpoints: transformers transposes these on load (its conversion mapping),
        # SGLang reads them as stored; loading, exporting and pushing them in both layouts is not implemented.
        raise ValueError(
            f"{flag} {path}: {transposed[0]} is stored as fused experts transposed against transformers' layout "
            f"([E, H, 2I] / [E, I, H]; model_type {getattr(model.config, 'model_type', None)!r}); the FSDP trainer "
            "does not implement this checkpoint layout (Qwen3-VL-MoE): train a dense Qwen-VL model"
        )
    if wrong:
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise ValueError(
            f"{flag} {path}: {'; '.join(wrong[:3])}{more}; the model is built from config.json with "
            f"{_config_fields(model.config)}"
        )


def build_fsdp_model(
    cfg: SlimeArgs,
    path: str | pathlib.Path,
    device: torch.device,
    mesh: DeviceMesh | None = None,
    *,
    construct: Callable[[PretrainedConfig, str], nn.Module] = _causal_lm,
    fill_missing: FillMissing | None = None,
    install: Callable[[nn.Module, ForwardOptions], None] = install_response_forward,
    flag: str = "--hf-checkpoint",
) -> tuple[nn.Module, PretrainedConfig]:
    """Builds the FSDP2-sharded model of an HF checkpoint (collective over the default group).

    Args:
        cfg: run config; reads `attn_implementation`, `gradient_checkpointing`, `fsdp_cpu_offload`,
            `log_probs_head`, `context_parallel_size`, `fsdp_compile_layers` and, with `--lora-rank`, the
            `lora_*` fields and `seed` (`slime_train_fsdp.lora`).
        path: HF checkpoint directory (`--hf-checkpoint`).
        device: this rank's compute device.
        mesh: 1-D mesh the parameters are sharded over; the whole world when None.
        construct: `(config, attn_implementation) -> module` built on the meta device: the causal LM, or the
            critic's value model (`value_model.py`); it must expose `config` and `_no_split_modules`.
        fill_missing: parameters the checkpoint lacks (see `load_hf_weights_into`).
        install: attaches the model's forward method with its `ForwardOptions` (the response log-prob forward).
        flag: the flag that named `path`, for errors (`load_hf_weights_into`).

    Returns:
        (model, config): the sharded `AutoModelForCausalLM` (`AutoModelForImageTextToText` for a vision-language
        checkpoint) in train mode with fp32 master weights, its response forward installed with the head and CP
        group (`packing.ForwardOptions`).

    Raises:
        ValueError: on an invalid head or context-parallel setting.
    """
    config = AutoConfig.from_pretrained(path)
    attn = _attn_implementation(cfg, device)
    vision_language = is_vision_language(config)
    options = _forward_options(cfg, device, attn, vision_language)
    if mesh is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    # Meta-device construction everywhere; the weights come from rank 0 below.
    with torch.device("meta"):
        model = construct(config, attn)
    adapters = None
    if cfg.lora_rank:
        model = inject_lora(model, cfg)  # before sharding: FSDP2 shards and reduces the adapters too
        adapters = initial_adapter_state(model, cfg.seed) if dist.get_rank() == 0 else None
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    _apply_fsdp(model, mesh, cfg, device)
    offload = device.type == "cuda" and cfg.fsdp_cpu_offload
    model.to_empty(device="cpu" if offload else device)
    _init_buffers(model, config, device)
    load_hf_weights_into(model, path, extra=adapters, fill_missing=fill_missing, flag=flag)
    model.train()
    install(model, options)
    cp = 1 if options.cp_group is None else dist.get_world_size(options.cp_group)
    logger.info("%s", loaded_message(path, type(model).__name__, attn, options, cp, mesh.size()))
    return model, config


def loaded_message(
    path: str | pathlib.Path, model: str, attn: str, options: ForwardOptions, cp: int, ranks: int
) -> str:
    """The load log line: what the forwards will run (the head is `ForwardOptions.head_in_use`).

    Under `--true-on-policy-mode` it named `--log-probs-head` (`head=fused`), a head that never ran.
    """
    return f"loaded {path} ({model}, attn={attn}, head={options.head_in_use}, cp={cp}) sharded over {ranks} ranks"


def _init_buffers(model: nn.Module, config: PretrainedConfig, device: torch.device) -> None:
    """Recomputes non-persistent buffers (rotary inv_freq) lost by meta init, then syncs them from rank 0."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            # Rebuild on the real device: inv_freq is computed in __init__ from the config only (vision towers'
            # rotary embeddings from their `dim` and `theta`).
            if hasattr(module, "theta") and not hasattr(module, "config"):
                fresh = type(module)(module.dim, module.theta).to(device)
            else:
                fresh = type(module)(config=getattr(module, "config", config), device=device)
            for name, buf in fresh.named_buffers(recurse=False):
                setattr(module, name, buf)
            if hasattr(fresh, "attention_scaling"):
                module.attention_scaling = fresh.attention_scaling
    _broadcast_buffers(model)
