"""LoRA on the FSDP backend: peft adapters injected before sharding, exported in PEFT's format.

`inject_lora` puts peft's `lora.Linear` around every `--lora-target-modules` linear layer of the meta-device model
(before `fully_shard`, so FSDP2 shards, gathers and reduces the adapters like any other parameter) and freezes
the base weights: the optimizer then holds only the adapters. The adapted layer's base weight is renamed
`<module>.base_layer.weight`; `hf_name` maps it back for loading the HF checkpoint. The adapters start as
peft's default does: `A` Kaiming-uniform (a = √5), `B` zero, so the first forward is exactly the base model's
(`initial_adapter_state`). The frozen embeddings' output is made to require grad in grad mode, so that the
compiled decoder layers see the same `requires_grad` at every depth (`_embeddings_require_grad`).

Weight sync and export move only the adapter (`iter_adapter`, PEFT names, `slime_core.lora`): a few MB instead of
the model. `iter_merged` gives the merged weights `W + (alpha/r)·B A` under plain HF names.

Legend: `r` LoRA rank, `in` / `out` the adapted layer's input/output features.
"""

from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import shutil
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from slime_core.config import SlimeArgs
from slime_core.config.training import LORA_TARGET_MODULES
from slime_core.dir_swap import prepare_staging, staging_dir, swap_in
from slime_core.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    PEFT_PREFIX,
    TOKENIZER_FILE_PREFIXES,
    adapter_config,
    scaling,
)
from slime_core.safetensors_io import save_safetensors

__all__ = [
    "check_targets",
    "hf_name",
    "initial_adapter_state",
    "inject_lora",
    "is_adapter",
    "iter_adapter",
    "iter_merged",
    "save_adapter",
]

logger = logging.getLogger(__name__)

_ADAPTER = "default"  # peft's adapter name inside the model


def inject_lora(model: nn.Module, cfg: SlimeArgs) -> nn.Module:
    """Injects peft LoRA layers into `model` in place (call on the meta-device model, before `fully_shard`).

    Args:
        model: HF causal LM.
        cfg: reads `lora_rank`, `lora_alpha`, `lora_target_modules`.

    Returns:
        The same model; only adapter parameters require grad, and with grad enabled the input embeddings' output
        does (`_embeddings_require_grad`).

    Raises:
        ValueError: a `--lora-target-modules` name matches no linear layer of the model (peft adapted the others and
            dropped it without a word, or stopped on none with its own error).
    """
    from peft import LoraConfig, inject_adapter_in_model

    check_targets(model, cfg.lora_target_modules)
    config = LoraConfig(
        r=int(cfg.lora_rank),
        lora_alpha=float(cfg.lora_alpha),
        target_modules=list(cfg.lora_target_modules),
        lora_dropout=0.0,  # dropout would make trainer log-probs differ from the engine's
        bias="none",
    )
    model = inject_adapter_in_model(config, model, adapter_name=_ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name))
    model.get_input_embeddings().register_forward_hook(_embeddings_require_grad)
    return model


def check_targets(model: nn.Module, targets: list[str]) -> None:
    """Every `--lora-target-modules` name must be the last name part of some `nn.Linear` of `model` (meta is fine).

    Raises:
        ValueError: naming the flag, the names that match nothing and those the model has (a MoE model's experts
            are one fused parameter in transformers, not linear layers: Qwen3-MoE has only the attention's).
    """
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = [t for t in targets if t not in linear]
    if missing:
        has = [n for n in LORA_TARGET_MODULES if n in linear]
        raise ValueError(
            f"--lora-target-modules {' '.join(missing)}: no linear layer of this {type(model).__name__} is named so "
            f"(it has {', '.join(has) or 'none of the names an adapter may target'}); adapt only those"
        )


def _embeddings_require_grad(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook on the frozen input embeddings: with grad enabled, their output `[..., H]` requires grad.

    Every decoder layer then receives `hidden_states` with `requires_grad=True`, as under full fine-tuning: the
    regionally compiled layers (`model_loading._apply_fsdp`) share one graph per grad mode. Without it layer 0
    gets a tensor that does not require grad (frozen embeddings) and the others one that does; dynamo guards on
    `requires_grad`, so every grad-mode variant of the layer graph was compiled twice (the e2e_lora GPU run hit
    `recompile_limit` on this guard and ran its layers eagerly from there). Under `no_grad` nothing is set, so all
    layers agree there too. This is transformers' `enable_input_require_grads` restricted to grad mode: values
    are untouched; the backward also computes layer 0's input gradient (discarded at the embeddings).
    """
    if torch.is_grad_enabled() and not output.requires_grad:
        output.requires_grad_(True)
    return output


def is_adapter(name: str) -> bool:
    """Whether a parameter name is a LoRA A/B weight."""
    return ".lora_A." in name or ".lora_B." in name


def hf_name(name: str) -> str:
    """The HF checkpoint name of a base parameter of the adapted model (drops peft's `.base_layer`)."""
    return name.replace(".base_layer.", ".")


def initial_adapter_state(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Initial adapter weights as full CPU tensors (built on rank 0, scattered with the checkpoint).

    `A` is drawn as `nn.Linear` initializes weights (Kaiming-uniform, a = √5: U(-1/√in, 1/√in)), `B` is zero,
    as peft's default `init_lora_weights=True`, so that `B A = 0` and the model starts as the base model.

    Args:
        model: the model after `inject_lora` (meta device is fine: only shapes are read).
        seed: seeds the draw of `A`.

    Returns:
        `{parameter name: tensor}`, `lora_A` `[r, in]`, `lora_B` `[out, r]`, float32.
    """
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        if ".lora_A." in name:
            bound = 1.0 / math.sqrt(param.shape[1])
            state[name] = (torch.rand(tuple(param.shape), generator=generator) * 2 - 1) * bound
        elif ".lora_B." in name:
            state[name] = torch.zeros(tuple(param.shape))
    return state


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach()


def _lora_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and _ADAPTER in module.lora_A:
            yield name, module


def iter_adapter(model: nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's tensors under PEFT names (collective: gathers shards; every rank iterates together).

    Args:
        model: the sharded model with injected adapters.
        dtype: cast to this dtype (None: the master dtype).

    Yields:
        `("base_model.model.<module>.lora_A.weight", [r, in])` and `(... .lora_B.weight, [out, r])` per module.
    """
    for name, module in _lora_modules(model):
        for part in ("lora_A", "lora_B"):
            full = _full(getattr(module, part)[_ADAPTER].weight)
            yield f"{PEFT_PREFIX}{name}.{part}.weight", full if dtype is None else full.to(dtype)


def iter_merged(
    model: nn.Module, cfg: SlimeArgs, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's weights with the adapter merged in, under plain HF names (collective).

    Args:
        model: the sharded model with injected adapters.
        cfg: `lora_alpha / lora_rank` is the adapter's scale.
        dtype: cast to this dtype after merging in float32 (None: the master dtype).

    Yields:
        `(hf_name, tensor)`; an adapted `W [out, in]` becomes `W + (alpha/r)·B A`; a tied `lm_head.weight` is
        skipped as HF does.
    """
    factors = {}
    for name, module in _lora_modules(model):
        factors[f"{name}.base_layer.weight"] = module
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    for name, tensor in model.state_dict().items():
        if is_adapter(name) or (tied and name == "lm_head.weight"):
            continue
        full = _full(tensor)
        module = factors.get(name)
        if module is not None:
            a = _full(module.lora_A[_ADAPTER].weight).float()
            b = _full(module.lora_B[_ADAPTER].weight).float()
            full = full.float() + scaling(cfg) * (b @ a)
        yield hf_name(name), full if dtype is None else full.to(dtype)


def save_adapter(model: nn.Module, cfg: SlimeArgs, path: str | pathlib.Path) -> None:
    """Writes the adapter as a PEFT directory (collective; rank 0 writes, via `path.tmp` then a rename).

    `adapter_model.safetensors` (PEFT names, float32), `adapter_config.json` (`slime_core.lora.adapter_config`,
    base model = the absolute `--hf-checkpoint`) and the base checkpoint's tokenizer files, so that
    `PeftModel.from_pretrained(base, path)` and SGLang's `--lora-paths` / `/load_lora_adapter` read it.

    Args:
        model: the sharded model with injected adapters.
        cfg: the run config (`hf_checkpoint`, `lora_*`).
        path: the output directory (replaced if it exists and slime wrote it: `slime_core.dir_swap`).
    """
    out = pathlib.Path(path)
    tmp = staging_dir(out)
    rank = dist.get_rank()
    tensors = {name: t.float().cpu().contiguous() for name, t in iter_adapter(model)}  # gathered on every rank
    if rank == 0:
        prepare_staging(out, flag="--save-hf")  # refuses a folder slime did not write
        save_safetensors(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        config = adapter_config(cfg, base_model=os.path.abspath(cfg.hf_checkpoint))
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
        for f in pathlib.Path(cfg.hf_checkpoint).iterdir():
            if f.is_file() and f.name.startswith(TOKENIZER_FILE_PREFIXES):
                shutil.copy2(f, tmp / f.name)
        swap_in(tmp, out, flag="--save-hf")  # rename swap: a crash leaves the old or the new export, never none
        logger.info("exported LoRA adapter (%d tensors) to %s", len(tensors), out)
    dist.barrier()
