"""How long a prompt is, and the limit prompts are held to (`--rollout-max-prompt-len` and its default).

`default_max_prompt_len` gives the limit (the flag, else the context less one token, the context being
`--rollout-max-context-len`, else the engines' (`engine_context_len`: `--sglang-context-length` or the model's
`max_position_embeddings`)); `prompt_too_long` measures a prompt as the
engine will get it (`encode_prompt`), but decides by character count alone when that already tells: a huge line is
refused without tokenizing it (`certainly_too_long`), a short one kept without tokenizing it.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

from slime_core.config.sglang_flags import sglang_fields
from slime_core.jsonl import describe_json_error

__all__ = [
    "certainly_too_long",
    "default_max_prompt_len",
    "encode_prompt",
    "engine_context_len",
    "model_context_len",
    "sglang_context_arg",
    "prompt_too_long",
]


@functools.cache
def model_context_len(hf_checkpoint: str | None) -> int | None:
    """`max_position_embeddings` of a local checkpoint's `config.json` (its `text_config`'s for multimodal models).

    Returns:
        The context length in tokens, or None when `hf_checkpoint` is unset, not a local directory with a
        `config.json`, or the config names no length.

    Raises:
        ValueError: `config.json` is not valid JSON (names the file).
    """
    if not hf_checkpoint:
        return None
    path = pathlib.Path(hf_checkpoint) / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({describe_json_error(e, line=True)})") from None
    for part in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        value = part.get("max_position_embeddings")
        if isinstance(value, int) and value > 1:
            return value
    return None


def sglang_context_arg(sglang_args: dict[str, Any] | None) -> Any:
    """The raw `--sglang-context-length` value (or a config file's `context-length`/`context_length`), or None."""
    return sglang_fields(sglang_args).get("context_length")


def engine_context_len(hf_checkpoint: str | None, sglang_args: dict[str, Any] | None = None) -> int | None:
    """The context the engines serve, in tokens: `--sglang-context-length` when given, else the model's.

    SGLang serves `--context-length` when it is set (a model extended by RoPE scaling, or a shorter serving limit),
    else `max_position_embeddings` (`model_context_len`).

    Raises:
        ValueError: `--sglang-context-length` is not a whole number of tokens, or `config.json` is not JSON.
    """
    given = sglang_context_arg(sglang_args)
    if given is None:
        return model_context_len(hf_checkpoint)
    try:
        return int(given)
    except (TypeError, ValueError):
        raise ValueError(f"--sglang-context-length {given!r}: not a number of tokens") from None


def default_max_prompt_len(args: Any, *, evaluation: bool = False) -> int | None:
    """The prompt-length limit in force: the flag, else the context less one token.

    As in the original, a prompt may fill the context but for one token, so every sample has at least one
    response token to train on (`--rollout-max-context-len - 1`). Without `--rollout-max-context-len` the context is
    the engines' (`engine_context_len`: `--sglang-context-length`, else `max_position_embeddings` of
    `--hf-checkpoint`): a longer prompt leaves no room to generate (it would train on 1-token responses, or keep an
    engine busy for minutes on a 20 MB line). `--rollout-max-response-len` is deliberately not subtracted, as in the
    original: a prompt that leaves less room than that gets a shorter response rather than being dropped.

    Args:
        args: the run config or plugin view; reads `rollout_max_prompt_len` and `rollout_max_context_len` (the
            `eval_*` ones when `evaluation`; the prompt flag wins when set), `hf_checkpoint` and `sglang_args`.
        evaluation: the eval datasets' limit.

    Returns:
        The limit in tokens, or None when nothing gives one (no flag, no context flag, no local config.json).

    Raises:
        ValueError: `--sglang-context-length` is not a number, or `config.json` is not JSON (`engine_context_len`).
    """
    prefix = "eval" if evaluation else "rollout"
    max_prompt_len = getattr(args, f"{prefix}_max_prompt_len")
    if max_prompt_len is not None:
        return max_prompt_len
    max_context_len = getattr(args, f"{prefix}_max_context_len")
    if max_context_len is None:
        max_context_len = engine_context_len(args.hf_checkpoint, args.sglang_args)
    return None if max_context_len is None else max_context_len - 1


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, Any]], tools: Any = None) -> list[int]:
    """The ids the engine gets for a prompt: text as is, chat messages through the template (generation prompt on).

    The `--rollout-max-prompt-len` filter and the default generate function both use this, so a prompt is
    measured exactly as it will be sent.
    """
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(prompt, tools=tools, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(prompt, add_special_tokens=False)


@functools.cache
def _max_token_chars(tokenizer: Any) -> int:
    # No token covers more characters than its vocabulary string has (byte-level BPE: one char per byte).
    return max((len(t) for t in tokenizer.get_vocab()), default=1)


def _prompt_chars(prompt: str | list[dict[str, Any]]) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(str(m.get("content", ""))) for m in prompt if isinstance(m, dict))


def certainly_too_long(tokenizer: Any, prompt: str | list[dict[str, Any]], max_prompt_len: int) -> bool:
    """Whether a prompt's characters alone prove it has more than `max_prompt_len` tokens (no tokenizing).

    A text of more than `max_prompt_len × (longest vocabulary entry)` characters cannot fit, and tokenizing it
    would cost memory for nothing (a 50 MB line costs gigabytes in a fast tokenizer). A chat template only adds
    text, so this holds before the template is applied too.
    """
    return _prompt_chars(prompt) > max_prompt_len * _max_token_chars(tokenizer)


def _certainly_fits(prompt: str | list[dict[str, Any]], max_prompt_len: int) -> bool:
    # Byte-level BPE (and SentencePiece with byte fallback) emits at most one token per UTF-8 byte; the factor 2 and
    # the slack cover normalizers that expand text and a prefix token. Only rendered text: a template adds tokens.
    return isinstance(prompt, str) and 2 * len(prompt.encode("utf-8")) + 16 <= max_prompt_len


def prompt_too_long(tokenizer: Any, prompt: str | list[dict[str, Any]], tools: Any, max_prompt_len: int) -> bool:
    """Whether a prompt has more than `max_prompt_len` tokens, tokenizing it only when its length cannot tell.

    Refused by length when `certainly_too_long`; a text short enough that no tokenizer can exceed the limit on it
    (`2 × UTF-8 bytes + 16` tokens at most) is kept without tokenizing, so the default limit costs little on large
    datasets; the rest are measured as the engine will get them (`encode_prompt`).
    """
    if certainly_too_long(tokenizer, prompt, max_prompt_len):
        return True
    if _certainly_fits(prompt, max_prompt_len):
        return False
    return len(encode_prompt(tokenizer, prompt, tools)) > max_prompt_len
