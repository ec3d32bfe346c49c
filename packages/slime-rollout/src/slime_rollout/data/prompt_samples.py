"""Dataset rows to prompt `Sample`s: the prompt checks, the chat template, images and the prompt-length filter.

`rows_to_samples` reads the rows of `--prompt-data` for the data source (`slime_rollout.data.source`, which
re-exports it) and of each eval dataset (`generation.eval`): one `Sample` per row with its prompt (rendered with
`--apply-chat-template`), label, metadata and tools, images kept with `--multimodal-keys`; prompts longer than the
limit are dropped and counted in one warning that names where they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from slime_core.sample import Sample
from slime_rollout.data import multimodal
from slime_rollout.data.chat_template import render_chat, text_content
from slime_rollout.data.prompt_length import certainly_too_long, prompt_too_long
from slime_rollout.data.prompt_rows import PromptRows, data_dir
from slime_rollout.data.rows import (
    TRAINING_KEY_FLAGS,
    KeyFlags,
    messages_from_json,
    prompt_problem,
    row_metadata,
    row_tools,
)

logger = logging.getLogger(__name__)

__all__ = ["rows_to_samples"]


def rows_to_samples(
    rows: Sequence[dict[str, Any]],
    *,
    source: str,
    input_key: str,
    label_key: str | None = None,
    metadata_key: str | None = "metadata",
    tool_key: str | None = "tools",
    tokenizer: Any = None,
    apply_chat_template: bool = False,
    apply_chat_template_kwargs: dict[str, Any] | None = None,
    max_prompt_len: int | None = None,
    multimodal_keys: dict[str, str] | None = None,
    processor_path: str | None = None,
    max_prompt_len_flag: str = "--rollout-max-prompt-len",
    key_flags: KeyFlags = TRAINING_KEY_FLAGS,
    conversations: bool = False,
    number_prompts: bool = False,
) -> list[Sample]:
    """Turns dataset rows into prompt samples (no group/index yet).

    Args:
        rows: dataset rows; a `PromptRows` (from `load_prompt_rows`) names each row in messages by its line (JSONL)
            or row index (Parquet) in the file, plain rows by their 1-based position in `rows` ("row N").
        source: file name for error messages.
        input_key: column with the prompt text or chat messages (`--input-key`).
        label_key: column with the ground truth (`--label-key`).
        metadata_key: column with a dict (or JSON string) copied into `sample.metadata`.
        tool_key: column with tool schemas (list or JSON string) → `metadata["tools"]`, passed to the template.
        tokenizer: needed for `apply_chat_template` and `max_prompt_len`.
        apply_chat_template: render messages with the tokenizer's template, `add_generation_prompt=True`.
        apply_chat_template_kwargs: extra template kwargs (e.g. `{"enable_thinking": false}`).
        max_prompt_len: drop prompts with more tokens than this, as the engine will get them (`encode_prompt`;
            prompts with images count their expanded image tokens); order preserved; one warning gives the number
            dropped and where they are (lines, row indices or rows, as `rows` names them). A prompt whose
            characters alone exceed it is dropped before the chat template and the tokenizer see it
            (`certainly_too_long`).
        multimodal_keys: `--multimodal-keys`; its `image` column holds one image per `<image>` placeholder of
            the prompt (see `slime_rollout.data.multimodal`). The prompt is then rendered by the processor's chat
            template and the images are kept in `Sample.multimodal_inputs["images"]`.
        processor_path: the vision-language checkpoint (`--hf-checkpoint`) whose processor renders and counts
            prompts with images; required with `multimodal_keys`.
        max_prompt_len_flag: how the warning names the limit (the flag, or its default's origin).
        key_flags: the flags that set the keys, as errors name them (an eval dataset's: `--eval-input-key`, ...).
        number_prompts: a custom generate function reads the prompts: a number (int or float) is taken as its text,
            as the original's tau-bench example needs (`--input-key index`, then `int(sample.prompt)`); without
            one, a number is refused (the default generate function would tokenize it).
        conversations: the rows are whole conversations the SFT rollout trains on (`data.sft`): message prompts
            are measured as it tokenizes them, without the template's generation prompt (which it never adds), and
            template errors name it as what renders them.

    Raises:
        ValueError: a row lacks `input_key`, has an empty prompt, malformed metadata/tools, or a missing,
            unreadable or surplus image (names `source` and row).
    """
    if (apply_chat_template or max_prompt_len) and tokenizer is None:
        raise ValueError("--apply-chat-template / --rollout-max-prompt-len need a tokenizer (--hf-checkpoint)")
    image_key = multimodal.image_column(multimodal_keys)
    if image_key and processor_path is None:
        raise ValueError("--multimodal-keys needs the vision-language checkpoint's processor (--hf-checkpoint)")
    base_dir = data_dir(source)
    located = PromptRows.of(rows)
    positions, unit = located.positions, located.unit
    samples, dropped, json_messages = [], [], []
    for position, row in zip(positions, rows, strict=True):
        where = f"{source} {unit} {position}"
        if input_key not in row:
            raise ValueError(f"{where}: no {key_flags.input_key} {input_key!r} (keys: {sorted(row)})")
        prompt = row[input_key]
        if (messages := messages_from_json(prompt)) is not None:
            prompt = messages  # JSON text of chat messages, as some data tools write a list column
            json_messages.append(position)
        is_number = isinstance(prompt, int | float) and not isinstance(prompt, bool)
        if number_prompts and is_number:
            prompt = str(prompt)
        problem = prompt_problem(prompt, input_key, key_flags.input_key)
        if problem is not None:
            hint = "; a number is read (as its text) only by a --custom-generate-function-path" if is_number else ""
            raise ValueError(f"{where}: {problem}{hint}")
        prompt = text_content(prompt)
        if max_prompt_len is not None and certainly_too_long(tokenizer, prompt, max_prompt_len):
            dropped.append(position)  # before the template, the images and the tokenizer: a huge line costs nothing
            continue
        metadata = row_metadata(row, metadata_key, where, key_flags.metadata_key)
        tools = row_tools(row, tool_key, where, key_flags.tool_key)
        if tools is not None:
            metadata["tools"] = tools
        images = multimodal.normalize_images(row.get(image_key), base_dir=base_dir, where=where) if image_key else []
        renderer = tokenizer
        if image_key:
            prompt = multimodal.build_messages(prompt, images, where=where)
            renderer = multimodal.get_processor(processor_path)
        measured, measured_tools = prompt, tools
        if apply_chat_template:
            prompt = render_chat(renderer, prompt, tools=tools, template_kwargs=apply_chat_template_kwargs, where=where)
            measured, measured_tools = prompt, None
            if image_key and not images:
                _refuse_image_token_without_image(processor_path, prompt, where=where, image_key=image_key)
        elif isinstance(prompt, list) and tokenizer is not None and not image_key:
            # Messages without the flag: the default generate renders them with the template (`encode_prompt`), so
            # a role it drops is checked here too; the rendering is what the length filter measures.
            # An SFT conversation is trained as rendered, with no generation prompt: measured with one, a conversation
            # within a few tokens of the limit was dropped.
            measured = render_chat(
                tokenizer, prompt, tools=tools, template_kwargs=None, where=where,
                why=_CONVERSATION if conversations else _MESSAGES, generation_prompt=not conversations,
            )  # fmt: skip
            measured_tools = None
        if max_prompt_len is not None and (
            _prompt_len(tokenizer, prompt, images, processor_path, where) > max_prompt_len
            if images
            else prompt_too_long(tokenizer, measured, measured_tools, max_prompt_len)
        ):
            dropped.append(position)
            continue
        label = row.get(label_key) if label_key else None
        mm_inputs = {"images": images} if images else None
        samples.append(Sample(prompt=prompt, label=label, metadata=metadata, multimodal_inputs=mm_inputs))
    _warn_missing_columns(rows, source, {metadata_key: key_flags.metadata_key, tool_key: key_flags.tool_key})
    if json_messages:
        logger.info(
            "%s: %d of %d %s prompts were JSON text of chat messages, read as the messages (first at %s %s)",
            source, len(json_messages), len(rows), key_flags.input_key, unit, json_messages[0],
        )  # fmt: skip
    if dropped:
        shown = ", ".join(map(str, dropped[:_ROWS_SHOWN])) + (", ..." if len(dropped) > _ROWS_SHOWN else "")
        logger.warning(
            "%s: dropped %d of %d prompts longer than %s=%d tokens (%s %s)",
            source,
            len(dropped),
            len(rows),
            max_prompt_len_flag,
            max_prompt_len,
            {"line": "lines", "row index": "row indices"}.get(unit, "rows"),
            shown,
        )
    return samples


def _refuse_image_token_without_image(processor_path: str, prompt: str, *, where: str, image_key: str) -> None:
    """A row without images whose rendered prompt holds the model's image token (`<|image_pad|>`) as text.

    The tokenizer reads that text as the image token, so the engine and the trainer would get an image placeholder
    with no pixels: packed next to a sample with images, the trainer's forward failed ("Image features and image
    tokens do not match") naming no row. A row with images is checked against its images already
    (`multimodal.prepare_vision_prompt`).

    Raises:
        ValueError: naming the row, the token and the column.
    """
    image_token_id, _ = multimodal.vision_token_ids(processor_path)
    token = multimodal.get_processor(processor_path).tokenizer.convert_ids_to_tokens(image_token_id)
    if token in prompt:
        raise ValueError(
            f"{where}: the prompt holds the image token {token} as text ({prompt.count(token)}x) but the row has no "
            f"image in the --multimodal-keys column {image_key!r}: give the image there with an <image> placeholder "
            "in the prompt, or remove the token"
        )


_ROWS_SHOWN = 20  # dropped rows named in the warning (the count covers them all)
_MESSAGES = "a prompt of chat messages without --apply-chat-template (the default generate function renders it)"
_CONVERSATION = "an SFT conversation (the SFT rollout renders it)"
_DEFAULT_COLUMNS = frozenset({"metadata", "tools"})  # optional columns by default: many datasets have neither


def _warn_missing_columns(rows: Sequence[dict[str, Any]], source: str, columns: dict[str | None, str]) -> None:
    """One warning per optional column set away from its default (`--metadata-key extra`) that rows lack.

    Such a row is read without it ({} metadata, no tools), as in the original; a misspelt key made every row so,
    without a word.
    """
    for key, flag in columns.items():
        if not key or key in _DEFAULT_COLUMNS or not rows:
            continue
        num_missing = sum(key not in row for row in rows)
        if num_missing:
            logger.warning(
                "%s: %d of %d rows have no %s %r (read without it; keys of the first row: %s)",
                source, num_missing, len(rows), flag, key, sorted(rows[0]),
            )  # fmt: skip


def _prompt_len(tokenizer: Any, prompt: Any, images: list[str], processor_path: str | None, where: str) -> int:
    """Prompt tokens as the engine sees them: image placeholders expanded when the prompt has images.

    Raises:
        ValueError: an image the processor cannot take (names `where`, the file and row).
    """
    text = prompt if isinstance(prompt, str) else tokenizer.apply_chat_template(prompt, tokenize=False)
    if images:
        try:
            return len(multimodal.prepare_vision_prompt(processor_path, text, images).input_ids)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return len(tokenizer.encode(text, add_special_tokens=False))
