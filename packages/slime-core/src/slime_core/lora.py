"""The LoRA adapter as it travels between trainer, engines and disk: PEFT's on-disk format.

An adapter directory holds `adapter_config.json` and `adapter_model.safetensors` with tensors named
`base_model.model.<module>.lora_A.weight` (`[r, in_features]`) and `...lora_B.weight` (`[out_features, r]`),
`<module>` being the Hugging Face name of the adapted linear layer (`model.layers.0.self_attn.q_proj`). The
adapted layer computes `W x + (alpha / r) · B A x` (Hu et al. 2021, "LoRA", eq. 3). PEFT loads it
(`PeftModel.from_pretrained`), SGLang serves it (`/load_lora_adapter`, `--lora-paths`), and the reference engine
reads the same files. The trainer (`slime_train_fsdp.lora`) writes it; `slime_rollout.weight_sync.lora` ships it.
"""

from __future__ import annotations

from typing import Any

from slime_core.config import SlimeArgs

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "LORA_NAME",
    "PEFT_PREFIX",
    "TOKENIZER_FILE_PREFIXES",
    "adapter_config",
    "module_of",
    "peft_config",
    "scaling",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The adapter's name on the engines (`lora_name` of `/load_lora_adapter`, `lora_path` of `/generate`).
LORA_NAME = "slime-policy"
PEFT_PREFIX = "base_model.model."
#: Files of the base model an adapter folder carries along (its tokenizer), by name prefix.
TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")


def scaling(cfg: SlimeArgs) -> float:
    """`alpha / r`, the factor of the adapter's update (`--lora-alpha`, `--lora-rank`)."""
    return float(cfg.lora_alpha) / int(cfg.lora_rank)


def adapter_config(cfg: SlimeArgs, *, base_model: str | None = None) -> dict[str, Any]:
    """The `adapter_config.json` of the run's adapter (the fields PEFT and SGLang read).

    Args:
        cfg: reads `lora_rank`, `lora_alpha`, `lora_target_modules`.
        base_model: recorded as `base_model_name_or_path` (default `--hf-checkpoint`).
    """
    base = base_model if base_model is not None else cfg.hf_checkpoint
    return peft_config(cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules, base_model=base)


def peft_config(rank: int, alpha: float, target_modules: list[str], *, base_model: str | None) -> dict[str, Any]:
    """`adapter_config.json` of an adapter of rank `rank` scaled by `alpha / rank` on `target_modules`.

    Args:
        rank: `r` (`--lora-rank`).
        alpha: `lora_alpha` (`--lora-alpha`).
        target_modules: module names (`--lora-target-modules`).
        base_model: recorded as `base_model_name_or_path`.
    """
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": int(rank),
        "lora_alpha": float(alpha),
        "target_modules": sorted(target_modules),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def module_of(peft_name: str) -> tuple[str, str]:
    """Splits an adapter tensor name into the adapted module's HF name and `lora_A` / `lora_B`.

    Example:
        >>> module_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
        ('model.layers.0.self_attn.q_proj', 'lora_A')

    Raises:
        ValueError: not a LoRA A/B weight name.
    """
    name = peft_name.removeprefix(PEFT_PREFIX)
    for part in ("lora_A", "lora_B"):
        suffix = f".{part}.weight"
        if name.endswith(suffix):
            return name[: -len(suffix)], part
    raise ValueError(f"not a LoRA adapter weight: {peft_name!r}")
