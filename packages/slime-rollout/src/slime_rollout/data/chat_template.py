r"""A row's prompt rendered with the tokenizer's chat template (`--apply-chat-template`), checked.

Two failures were silent or nameless: a template renders only the roles it knows (Qwen3's drops a ShareGPT-style
`"human"` turn without a word, so the prompt was the bare `<|im_start|>assistant\n` and the model answered no
question), and a template that raises on a row (`'list object' has no attribute 'startswith'` for content parts)
failed the data load naming no file or row. Both are one error naming the row here, as are a row's tools that a
template without tool support leaves out (the model never saw them). So is a message whose content
is a list of parts (`[{"type": "text", "text": ...}]`, OpenAI's format) that a text template does not render as text:
one that reads content as a string printed the list (`[{'type': 'text', 'text': 'What is 2+2?'}]` was the prompt),
one that tests `content is string` dropped it. A message's null `content`
(OpenAI's tool-call turns) is read as "" (`text_content`), which every template renders.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jinja2.meta

from slime_rollout.data.rows import message_texts

__all__ = ["render_chat", "text_content", "unread_template_kwargs"]


def text_content(prompt: Any) -> Any:
    """`prompt` with every message's null `content` as "" (a copy; a string prompt or none null: `prompt` itself).

    OpenAI's format writes an assistant turn of tool calls only as `"content": null`; chat templates read content
    as text (Qwen3's tests `'<think>' in message.content`), so such a row failed to render with "argument of type
    'NoneType' is not iterable". Both mean "no text".
    """
    if not isinstance(prompt, list) or not any(isinstance(m, dict) and m.get("content", "") is None for m in prompt):
        return prompt
    return [{**m, "content": ""} if isinstance(m, dict) and m.get("content", "") is None else m for m in prompt]


def render_chat(
    renderer: Any,
    prompt: str | list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
    where: str,
    why: str = "--apply-chat-template",
    generation_prompt: bool = True,
) -> str:
    """`renderer.apply_chat_template(...)` of a row's prompt (with the generation prompt by default), checked.

    Args:
        renderer: the tokenizer (or a vision-language processor) whose chat template renders the prompt.
        prompt: the row's prompt: a string (one user turn) or chat messages.
        tools: tool schemas passed to the template, or None.
        template_kwargs: `--apply-chat-template-kwargs`.
        where: names the file and row in errors.
        why: what renders the prompt, as errors name it: the flag, or message prompts without it (which the
            default generate function renders, or an SFT conversation, which the SFT rollout renders).
        generation_prompt: add the template's generation prompt (`add_generation_prompt`): on for a prompt the
            engine continues, off for a whole conversation that is trained on as it is.

    Returns:
        The rendered prompt text.

    Raises:
        ValueError: the renderer has no chat template (names `why` and `--hf-checkpoint`), the template raised on
            the row, left out a tool of `tools` (a template without tool support), or the text of a message that
            is not an assistant
            turn (a role it does not know; assistant turns are left alone, since templates rewrite them, e.g.
            dropping earlier reasoning), left out the text of a content part, or wrote a message's content parts as
            Python text (a template that reads content as a string). The message names `where`, the message and
            its role.
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if getattr(renderer, "chat_template", "") is None:  # transformers' own error named neither the flag nor a fix
        raise ValueError(
            f"{where}: {why} needs the chat template of the --hf-checkpoint tokenizer, which has none (no "
            "'chat_template' in tokenizer_config.json, no chat_template.jinja); add one, or give plain-text prompts"
        )
    try:
        text = renderer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt, **(template_kwargs or {})
        )
        # transformers hands `tools` to the template, and one without tool support ignores them.
        bare = renderer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **(template_kwargs or {})
        ) if tools else None  # fmt: skip
    except Exception as e:  # noqa: BLE001 - jinja's errors (UndefinedError, TemplateError, TypeError) name no row
        raise ValueError(f"{where}: the chat template ({why}) failed on this row: {type(e).__name__}: {e}") from None
    if bare == text:
        raise ValueError(
            f"{where}: the chat template ({why}) left out the row's tools (the prompt is the same without them): it "
            "renders no tool schemas; use a checkpoint whose template does, or give the rows no tools"
        )
    template = getattr(renderer, "chat_template", None)
    markers = _template_markers(renderer, template if isinstance(template, str) else None)  # (a dict is unhashable)
    for i, message in enumerate(messages):
        marker = next((m for m in markers for part in message_texts(message.get("content")) if m in part), None)
        if marker is not None:
            raise ValueError(
                f"{where}: message {i} (role {message.get('role')!r}) holds {marker!r}, a marker the chat template "
                f"writes itself: the text is rendered already, and {why} renders it again (the model saw them "
                "twice: two BOS with a template that writes one); give the plain text, or a rendered prompt as a "
                "string without --apply-chat-template"
            )
        if message.get("role") == "assistant":
            continue
        content = message.get("content")
        if isinstance(content, list) and _as_python_text(content, text):
            raise ValueError(
                f"{where}: the chat template ({why}) wrote message {i}'s content parts "
                f"({{'type': 'text', ...}}) as Python text, not as the message's text: it reads content as a "
                "string; give the message's content as a string"
            )
        for part in message_texts(content):
            if part.strip() and not _rendered(part, text):
                raise ValueError(
                    f"{where}: the chat template left out message {i} (role {message.get('role')!r})"
                    + (_LEFT_OUT_PART if isinstance(content, list) else _LEFT_OUT_ROLE)
                )
    return text


_LEFT_OUT_ROLE = ": it renders only the roles it knows (system, user, assistant, tool); rename the role"
_LEFT_OUT_PART = (
    ": its content is a list of parts, which this template does not render as text; give the content as a string"
)


@functools.lru_cache(maxsize=8)
def _template_markers(renderer: Any, template: Any) -> tuple[str, ...]:
    """The special tokens the chat template writes around a plain user turn and its generation prompt.

    ChatML's `<|im_start|>`, `<|im_end|>`; Llama 3's `<|begin_of_text|>`, `<|start_header_id|>`, ... A message
    holding one was rendered before (a prompt file of templated text). Empty when the probe does not render.
    Cached per renderer and `template` (its `chat_template`, so a template set on the same tokenizer is probed anew).
    """
    del template  # the cache key only
    tokenizer = getattr(renderer, "tokenizer", renderer)  # a vision-language processor renders with its tokenizer
    special = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special]
    try:
        probe = renderer.apply_chat_template(
            [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - a template that wants other content (parts) or roles: no markers known
        return ()
    return tuple(t for t in special if t and t in probe)


def _as_python_text(parts: list[Any], text: str) -> bool:
    """Whether the rendering holds a content part as `str()` or JSON writes it.

    A template that reads content as a string prints the list: `[{'type': 'text', 'text': 'What is 2+2?'}]`.
    """
    for part in parts:
        if isinstance(part, dict) and (repr(part) in text or json.dumps(part, ensure_ascii=False) in text):
            return True
    return False


def _rendered(content: str, text: str) -> bool:
    """Whether a message's text is in the template's rendering: as is, or JSON-encoded (the `tojson` filter).

    Llama 3.1's template writes a tool message as `message.content | tojson` (a string is iterable in Jinja): a tool
    output holding a quote or a newline is rendered escaped, and was refused as "left out".
    """
    stripped = content.strip()
    if stripped in text:
        return True
    return any(json.dumps(stripped, ensure_ascii=ascii)[1:-1] in text for ascii in (False, True))


def unread_template_kwargs(renderer: Any, kwargs: dict[str, Any]) -> list[str] | None:
    """The keys of `--apply-chat-template-kwargs` that the renderer's chat template never reads.

    `apply_chat_template` passes every kwarg to the template as a variable, and one it does not name is ignored:
    `{"enable_thinking": false}` on a template without that switch (or a misspelt key) left the prompts as they were,
    without a word.

    Args:
        renderer: the tokenizer (or processor) whose `chat_template` renders the prompts.
        kwargs: the template kwargs.

    Returns:
        The keys no variable of the template is named after, in order; None when it cannot tell (no template, a
        template per name, or one transformers' Jinja environment does not parse).
    """
    template = getattr(renderer, "chat_template", None)
    if not kwargs or not isinstance(template, str):
        return None
    try:
        # transformers' own environment (its `generation` tag, loop controls): a plain one refuses such templates.
        from transformers.utils.chat_template_utils import _compile_jinja_template

        variables = jinja2.meta.find_undeclared_variables(_compile_jinja_template(template).environment.parse(template))
    except (ImportError, AttributeError, jinja2.TemplateError):
        return None
    return [key for key in kwargs if key not in variables]
