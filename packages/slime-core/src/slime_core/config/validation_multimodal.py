"""Rules of vision-language runs (`--multimodal-keys`, `--freeze-vision-tower`), part of `derive_and_validate`.

Kept apart from `validation.py` so the multimodal rules read in one place. Images are the only media this
version implements; they reach the model through the processor's chat template, and only the FSDP backend
builds a vision-language model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError
from slime_core.extensions import train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["SUPPORTED_MEDIA", "check_multimodal"]

#: Media types `--multimodal-keys` may name (the original also knows "video" and "audio").
SUPPORTED_MEDIA = ("image",)


def check_multimodal(args: SlimeArgs) -> None:
    """Checks the multimodal flags against each other and the backend.

    Raises:
        ConfigError: an unsupported media type or empty column name, `--multimodal-keys` without
            `--apply-chat-template`, with `--train-backend megatron`, with `--lora-rank`, or with FSDP context
            parallelism; `--freeze-vision-tower` on the Megatron backend.
    """
    keys = args.multimodal_keys
    if args.freeze_vision_tower and not train_backend_spec(args).supports_multimodal:
        raise ConfigError(
            "--freeze-vision-tower is an FSDP option (vision-language models train on --train-backend fsdp)"
        )
    if not keys:
        return
    for media, column in keys.items():
        if media not in SUPPORTED_MEDIA:
            raise ConfigError(
                f"--multimodal-keys: media type {media!r} is not implemented (supported: {', '.join(SUPPORTED_MEDIA)})"
            )
        if not isinstance(column, str) or not column:
            raise ConfigError(f"--multimodal-keys: {media!r} must name a dataset column, got {column!r}")
    if not args.apply_chat_template:
        raise ConfigError(
            "--multimodal-keys needs --apply-chat-template: images enter the prompt where the processor's chat "
            "template renders their <image> placeholders"
        )
    if not train_backend_spec(args).supports_multimodal:
        raise ConfigError(
            "--multimodal-keys: the Megatron backend builds text-only GPT models; train vision-language models with "
            "--train-backend fsdp"
        )
    if args.lora_rank:
        raise ConfigError(
            f"--multimodal-keys with --lora-rank {args.lora_rank}: LoRA on vision-language models is not implemented; "
            "train the full model (--freeze-vision-tower keeps the tower fixed)"
        )
    if args.context_parallel_size > 1:
        raise ConfigError(
            f"--multimodal-keys with --context-parallel-size {args.context_parallel_size}: vision inputs are not "
            "split over context-parallel ranks; use --context-parallel-size 1"
        )
