"""Rules of vision-language runs (`--multimodal-keys`, `--freeze-vision-tower`), part of `derive_and_validate`.

Kept apart from `validation.py` so the multimodal rules read in one place. Images are the only media this
version implements; they reach the model through the processor's chat template, and only the FSDP backend
builds a vision-language model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slime_core.config.base import ConfigError, parse_json_dict
from slime_core.extensions import train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["SUPPORTED_MEDIA", "check_multimodal", "check_multimodal_keys"]

#: Media types `--multimodal-keys` may name (the original also knows "video" and "audio").
SUPPORTED_MEDIA = ("image",)


def check_multimodal(args: SlimeArgs, *, keys: Any = None, flag: str = "--multimodal-keys") -> None:
    """Checks the multimodal flags against each other and the backend.

    Args:
        args: the run config.
        keys: the `multimodal_keys` to check, when not the flag's (an `--eval-config` dataset's own, on a run whose
            training prompts may have none: its images meet the same model and backend).
        flag: what set `keys`, for the messages.

    Raises:
        ConfigError: an unsupported media type or empty column name, `--multimodal-keys` without
            `--apply-chat-template`, with `--train-backend megatron`, with `--lora-rank`, or with FSDP context
            parallelism; `--freeze-vision-tower` on the Megatron backend.
    """
    if keys is None:
        keys = args.multimodal_keys
        if args.freeze_vision_tower and not train_backend_spec(args).supports_multimodal:
            raise ConfigError(
                "--freeze-vision-tower is an FSDP option (vision-language models train on --train-backend fsdp)"
            )
    if not keys:
        return
    check_multimodal_keys(keys, flag=flag, apply_chat_template=args.apply_chat_template)
    if not train_backend_spec(args).supports_multimodal:
        raise ConfigError(
            f"{flag}: the Megatron backend builds text-only GPT models; train vision-language models with "
            "--train-backend fsdp"
        )
    if args.lora_rank:
        raise ConfigError(
            f"{flag} with --lora-rank {args.lora_rank}: LoRA on vision-language models is not implemented; "
            "train the full model (--freeze-vision-tower keeps the tower fixed)"
        )
    if args.context_parallel_size > 1:
        raise ConfigError(
            f"{flag} with --context-parallel-size {args.context_parallel_size}: vision inputs are not "
            "split over context-parallel ranks; use --context-parallel-size 1"
        )


def check_multimodal_keys(keys: Any, *, flag: str, apply_chat_template: bool) -> dict[str, str] | None:
    """Parses and checks one `multimodal_keys` value (the flag's, or an `--eval-config` dataset's own).

    Args:
        keys: a mapping `{"image": "<column>"}`, its JSON text, or None.
        flag: what set it, for the messages (`--multimodal-keys`, `--eval-config f.yaml dataset 'geo3k'`).
        apply_chat_template: whether the prompts using these keys are rendered with the chat template.

    Returns:
        The mapping, or None when `keys` is empty.

    Raises:
        ConfigError: not a JSON object, an unsupported media type, an empty column name, or images without the
            chat template (their placeholders are rendered by the processor's template).
    """
    keys = parse_json_dict(keys, flag=flag)
    if not keys:
        return None
    if not isinstance(keys, dict):
        raise ConfigError(f"{flag}: multimodal_keys must map a media type to a column, got {keys!r}")
    for media, column in keys.items():
        if media not in SUPPORTED_MEDIA:
            raise ConfigError(
                f"{flag}: media type {media!r} is not implemented (supported: {', '.join(SUPPORTED_MEDIA)})"
            )
        if not isinstance(column, str) or not column:
            raise ConfigError(f"{flag}: {media!r} must name a dataset column, got {column!r}")
    if not apply_chat_template:
        # The SFT rollout refuses the chat template flag (it renders the conversations itself) and takes no images.
        sft = " (the SFT rollout, slime.rollout.sft_rollout, takes no images: drop the flag there)"
        raise ConfigError(
            f"{flag} needs --apply-chat-template: images enter the prompt where the processor's chat "
            f"template renders their <image> placeholders{sft if flag == '--multimodal-keys' else ''}"
        )
    return keys
