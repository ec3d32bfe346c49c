"""Parameter names of vision-language models: on-disk checkpoint names ↔ transformers module names.

transformers (>= 5) builds Qwen2-VL / Qwen2.5-VL as `model.language_model.*` + `model.visual.*` + `lm_head`, but
their published checkpoints (and what `save_pretrained` writes back) say `model.*` + `visual.*` + `lm_head`;
transformers renames on load and back on save. SGLang loads the checkpoint names. So the trainer reads and
exports checkpoint names, pushes checkpoint names to the engines, and maps to module names only where it touches
its own `nn.Module`; the reference engine does the same on its side. Qwen3-VL checkpoints already use the
module names. Text-only models map to themselves.

Every function here is a pure string rewrite, so both sides (trainer and engines) share one table.

Example:
    >>> to_module_name("visual.blocks.0.attn.qkv.weight", "qwen2_5_vl")
    'model.visual.blocks.0.attn.qkv.weight'
    >>> to_checkpoint_name("model.language_model.layers.0.mlp.up_proj.weight", "qwen2_5_vl")
    'model.layers.0.mlp.up_proj.weight'
"""

from __future__ import annotations

import re

__all__ = ["is_vision_tower_param", "to_checkpoint_name", "to_module_name"]

# model_type -> ordered (pattern, replacement) rewrites; the first matching rule applies.
_QWEN2_VL_TO_MODULE = (
    (re.compile(r"^visual\."), "model.visual."),
    (re.compile(r"^model\.(?!language_model\.|visual\.)"), "model.language_model."),
)
_QWEN2_VL_TO_CHECKPOINT = (
    (re.compile(r"^model\.visual\."), "visual."),
    (re.compile(r"^model\.language_model\."), "model."),
)
_TO_MODULE = {"qwen2_vl": _QWEN2_VL_TO_MODULE, "qwen2_5_vl": _QWEN2_VL_TO_MODULE}
_TO_CHECKPOINT = {"qwen2_vl": _QWEN2_VL_TO_CHECKPOINT, "qwen2_5_vl": _QWEN2_VL_TO_CHECKPOINT}

#: Module-name prefix of the vision tower (patch embedding, blocks, merger) in the Qwen-VL families.
_VISION_TOWER_PREFIX = "model.visual."


def _rewrite(name: str, rules: tuple[tuple[re.Pattern[str], str], ...]) -> str:
    for pattern, replacement in rules:
        renamed, hits = pattern.subn(replacement, name, count=1)
        if hits:
            return renamed
    return name


def to_module_name(name: str, model_type: str | None) -> str:
    """The transformers module name of checkpoint tensor `name` (unchanged for models without a rename).

    Args:
        name: a tensor name as stored in the safetensors files (e.g. `visual.merger.mlp.0.weight`).
        model_type: `config.model_type` of the checkpoint (`qwen2_5_vl`, `qwen3_vl`, `qwen3`, ...).
    """
    return _rewrite(name, _TO_MODULE.get(model_type or "", ()))


def to_checkpoint_name(name: str, model_type: str | None) -> str:
    """The checkpoint (and SGLang) name of module parameter `name`; inverse of `to_module_name`."""
    return _rewrite(name, _TO_CHECKPOINT.get(model_type or "", ()))


def is_vision_tower_param(module_name: str) -> bool:
    """Whether a module parameter belongs to the vision tower (`model.visual.*`: patch embed, blocks, merger)."""
    return module_name.startswith(_VISION_TOWER_PREFIX)
