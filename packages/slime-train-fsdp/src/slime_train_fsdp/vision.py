"""Vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) in the FSDP trainer: packed rows with images.

A packed micro-batch of a vision-language model carries, besides the token row:

- `pixel_values` / `image_grid_thw` of its samples' images, concatenated in packing order (the model scatters
  the image features into the image tokens of the row in that same order);
- 4-row position ids `[4, 1, S]`: row 0 restarts at 0 per sequence (what transformers derives the packed
  attention mask / `cu_seqlens` from), rows 1-3 are the 3-D rotary positions of each sequence from the model's
  own `get_rope_index`, which is what the inference engine computes for the same tokens.

Image tokens count only in prompts. A sampled response may contain the image placeholder token (a small or
young policy samples anything); the engine embedded it as text while decoding, so the trainer does too: only the
prompt's image tokens get rotary image positions and image features (`install_placeholder_guard`).

FSDP2 needs every rank to run the same sequence of units per micro-batch. A micro-batch without images (text-only
samples, or the empty dummy row of a rank with fewer samples) therefore runs the vision tower on a one-token dummy
image, and the zero-valued loss anchor reaches the vision tower's output in both cases, so backward (and the vision
blocks' reduce-scatters) runs on every rank or on none.

Legend: `S` packed row length, `P` image patches, `T_i` length of sequence i.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from slime_core.hf_names import is_vision_tower_param
from slime_core.host_to_device import to_device

logger = logging.getLogger(__name__)

__all__ = [
    "VISION_INPUT_KEYS",
    "dummy_vision_inputs",
    "frozen_vision_tower",
    "install_placeholder_guard",
    "is_vision_language",
    "mrope_position_ids",
    "pack_vision_inputs",
    "vision_tower_anchor",
    "vision_tower_names",
]

#: The processor outputs the FSDP forward passes to the model (other keys are rejected, not dropped).
VISION_INPUT_KEYS = ("pixel_values", "image_grid_thw")


def is_vision_language(config: Any) -> bool:
    """Whether an HF config describes a vision-language model (it has a `vision_config`)."""
    return getattr(config, "vision_config", None) is not None


def mrope_position_ids(
    inner_model: nn.Module, tokens: torch.Tensor, image_grid_thw: torch.Tensor | None, prompt_length: int
) -> torch.Tensor:
    """`[3, T]` int64 3-D rotary positions of one sequence (prompt + response), from the model's `get_rope_index`.

    Args:
        inner_model: the `*VLModel` (`model.model` of a `*ForConditionalGeneration`).
        tokens: `[T]` token ids, image placeholders expanded.
        image_grid_thw: `[num_images, 3]` grids of the sequence's images, or None (then `arange(T)` on all rows).
        prompt_length: tokens before the response; image tokens after it are text (as the engine decoded them).
    """
    ids = tokens.reshape(1, -1).long().cpu()
    if image_grid_thw is None:
        return torch.arange(ids.shape[1]).expand(3, -1).clone()
    token_type = (ids == inner_model.config.image_token_id).long()
    token_type[:, prompt_length:] = 0
    pos, _ = inner_model.get_rope_index(ids, mm_token_type_ids=token_type, image_grid_thw=image_grid_thw.cpu())
    return pos[:, 0, :]


def install_placeholder_guard(inner_model: nn.Module) -> None:
    """Makes the model scatter image features only into prompt positions (`inner_model.slime_vision_positions`).

    The model's own `get_placeholder_mask` marks every image/video token of the row; wrapped here, it sees the
    row with such tokens outside `slime_vision_positions` (a `[1, S]` bool set around each forward) replaced by
    token 0, so they stay text embeddings. The embeddings themselves are computed from the real ids before.
    """
    if hasattr(inner_model, "slime_vision_positions"):
        return
    inner_model.slime_vision_positions = None
    original = inner_model.get_placeholder_mask
    config = inner_model.config

    def get_placeholder_mask(input_ids, inputs_embeds, image_features=None, video_features=None):
        allowed = inner_model.slime_vision_positions
        if allowed is not None and input_ids is not None:
            vision = (input_ids == config.image_token_id) | (input_ids == config.video_token_id)
            input_ids = input_ids.masked_fill(vision & ~allowed, 0)
        return original(input_ids, inputs_embeds=inputs_embeds, image_features=image_features,
                        video_features=video_features)  # fmt: skip

    inner_model.get_placeholder_mask = get_placeholder_mask


def pack_vision_inputs(
    inputs: Sequence[dict[str, torch.Tensor] | None], device: torch.device
) -> dict[str, torch.Tensor] | None:
    """Concatenates the packed samples' vision tensors (in packing order) for one forward.

    Args:
        inputs: per packed sample, its `Sample.multimodal_train_inputs` or None.
        device: where the row lives.

    Returns:
        `{"pixel_values": [P, ...], "image_grid_thw": [num_images, 3]}`, or None when no sample has images.

    Raises:
        ValueError: a key other than `VISION_INPUT_KEYS` (e.g. video tensors, which this trainer does not pass).
    """
    present = [mm for mm in inputs if mm]
    if not present:
        return None
    for mm in present:
        unknown = set(mm) - set(VISION_INPUT_KEYS)
        if unknown:
            raise ValueError(f"vision inputs {sorted(unknown)} are not supported (only {list(VISION_INPUT_KEYS)})")
    return {key: to_device(torch.cat([mm[key] for mm in present]), device) for key in VISION_INPUT_KEYS}


def dummy_vision_inputs(vision_config: Any, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The smallest image the vision tower takes: one merged token (`merge × merge` patches of one frame).

    Returns:
        `{"pixel_values": [merge², C·T·p·p] zeros, "grid_thw": [[1, merge, merge]]}`.
    """
    merge = int(vision_config.spatial_merge_size)
    patch = int(vision_config.patch_size)
    channels = int(getattr(vision_config, "in_channels", getattr(vision_config, "in_chans", 3)))
    temporal = int(vision_config.temporal_patch_size)
    pixels = torch.zeros(merge * merge, channels * temporal * patch * patch, device=device, dtype=dtype)
    return {"pixel_values": pixels, "grid_thw": torch.tensor([[1, merge, merge]], device=device)}


def vision_tower_anchor(outputs: Sequence[Any]) -> torch.Tensor:
    """A zero scalar connected to every floating tensor of the vision tower's outputs (first element of each).

    Args:
        outputs: what the vision tower's forward returned in this micro-batch (model outputs, tuples, tensors).
    """
    terms: list[torch.Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point() and value.numel() and value.requires_grad:
                terms.append(value.reshape(-1)[:1].float().sum())
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, list | tuple):
            for v in value:
                collect(v)
        elif hasattr(value, "to_tuple"):
            collect(value.to_tuple())

    for out in outputs:
        collect(out)
    return torch.stack(terms).sum() * 0.0 if terms else torch.zeros(())


def vision_tower_names(model: nn.Module) -> set[str]:
    """Module names of the vision tower's parameters (patch embedding, blocks, merger)."""
    return {name for name, _ in model.named_parameters() if is_vision_tower_param(name)}


def frozen_vision_tower(model: nn.Module, cfg: Any) -> set[str]:
    """The vision tower's parameter names to freeze under `--freeze-vision-tower` (empty without the flag).

    Args:
        model: the model (actor or value model).
        cfg: the run config (`freeze_vision_tower`, `hf_checkpoint`).

    Raises:
        ValueError: `--freeze-vision-tower` on a model without a vision tower.
    """
    if not cfg.freeze_vision_tower:
        return set()
    names = vision_tower_names(model)
    if not names:
        raise ValueError(f"--freeze-vision-tower: --hf-checkpoint {cfg.hf_checkpoint} has no vision tower")
    logger.info("--freeze-vision-tower: %d vision tensors frozen", len(names))
    return names
