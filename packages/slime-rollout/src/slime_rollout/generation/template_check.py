"""Chat-template conformance of multi-turn samples, checked in the loop on the first samples of a run.

A multi-turn sample is built token by token (token-in, token-out): prompt ids, the engine's ids of each model
turn, the tokenized observation text. Anything that later re-renders the conversation with the chat template
(an SFT or reward model, an agent framework, the next run's data pipeline) sees the template's tokens instead;
when the two differ, the policy was trained on a stream nobody will ever feed it. The classic causes: the
template rewrites earlier turns (drops `<think>` blocks, inserts an empty one), merges whitespace, or
re-tokenizing the model's text gives other ids than it sampled.

`slime_rollout.generation.multi_turn.generate` records each sample's conversation under `metadata[CONVERSATION_KEY]`:
the tools the prompt was rendered with and one segment per appended piece of text (`assistant`: the model turn
decoded with special tokens kept; `observation`: the exact observation text, with the tool messages it
renders when it came from the chat template). `check_sample` then compares `sample.tokens` with

* the chat template's tokenization of prompt + assistant/tool messages (`check_chat_template_consistency`),
  when the prompt is a message list and every observation came from tool messages; otherwise
* the tokenization of the concatenated text (prompt text + segments): re-tokenization drift only.

`check_samples` runs it on the first `--check-chat-template-samples` recorded samples and reports mismatches
with the token position and decoded context around it. The chat-template helpers the multi-turn generate
function renders observations with (`render_messages`, `end_of_turn`) live here too, so that this module
depends on nothing of `slime_rollout.generation.multi_turn`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from slime_core.sample import Sample, Status

logger = logging.getLogger(__name__)

__all__ = [
    "CONVERSATION_KEY",
    "TEMPLATE_SENTINEL",
    "ConsistencyReport",
    "check_chat_template_consistency",
    "check_sample",
    "check_samples",
    "checkable",
    "end_of_turn",
    "record_segment",
    "render_continuation",
    "render_messages",
]

#: `Sample.metadata` key of the recorded conversation: `{"tools": ..., "segments": [{"role", "content", ...}]}`, plus
#: `"prompt"` (chat messages) when the sample's rendered prompt did not come from `sample.prompt`.
CONVERSATION_KEY = "chat_conversation"


#: Placeholder assistant content used to cut the template's wrapper text out of a rendering.
TEMPLATE_SENTINEL = "<<slime-multi-turn-sentinel>>"


def render_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Any = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The chat template's text of `messages` (`tokenizer.apply_chat_template(..., tokenize=False)`).

    `template_kwargs` are the template's own variables (`--apply-chat-template-kwargs`, e.g. `enable_thinking`).
    """
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **(template_kwargs or {})
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Head:
    """What a template renders for the fixed head `[user, assistant(<sentinel>)]`: the same for every call."""

    echoes: int  # how often the rendering holds the sentinel (a template may echo assistant content twice)
    end_of_turn: str  # the text after the assistant content, trailing newlines and spaces off
    # The assistant header's text past the generation prompt, which the model writes itself: GLM-4 prompts with
    # `<|assistant|>` and renders a turn as `<|assistant|>\n{content}`, so its model turns open with "\n".
    header_rest: str
    # The whole rendering: the special tokens a plain user/assistant exchange holds (`_ends_with_own_marker`).
    text: str


_HEAD = ({"role": "user", "content": "u"}, {"role": "assistant", "content": TEMPLATE_SENTINEL})
_MAX_HEADS = 32  # tokenizers whose head is kept (a run has one or two)
_heads: collections.OrderedDict[tuple[str, str, str], _Head] = collections.OrderedDict()
_heads_lock = threading.Lock()


def _head(tokenizer: Any) -> _Head:
    """The template's rendering of the fixed head, rendered once per tokenizer and template (bounded LRU).

    Keyed by the tokenizer's class, `name_or_path` and `chat_template` text: an observation of every tool turn
    re-rendered it twice. A tokenizer without a template string (a stand-in that renders in Python) is rendered
    every time: nothing names what it renders.
    """
    template = getattr(tokenizer, "chat_template", None)
    key = (type(tokenizer).__qualname__, str(getattr(tokenizer, "name_or_path", "")), template)
    if isinstance(template, str):
        with _heads_lock:
            if key in _heads:
                _heads.move_to_end(key)
                return _heads[key]
    rendered = render_messages(tokenizer, [*map(dict, _HEAD)], add_generation_prompt=False)
    if TEMPLATE_SENTINEL in rendered:
        tail = rendered[rendered.rindex(TEMPLATE_SENTINEL) + len(TEMPLATE_SENTINEL) :].rstrip("\n ")
    else:
        tail = ""  # `render_continuation` refuses such a template; `end_of_turn` says it has no marker
    prompt = render_messages(tokenizer, [dict(_HEAD[0])], add_generation_prompt=True)
    first = rendered.find(TEMPLATE_SENTINEL)
    rest = rendered[len(prompt) : first] if first >= 0 and rendered[:first].startswith(prompt) else ""
    head = _Head(echoes=rendered.count(TEMPLATE_SENTINEL), end_of_turn=tail, header_rest=rest, text=rendered)
    if isinstance(template, str):
        with _heads_lock:
            _heads[key] = head
            while len(_heads) > _MAX_HEADS:
                _heads.popitem(last=False)
    return head


def end_of_turn(tokenizer: Any) -> str:
    """The text the chat template puts right after an assistant message's content (e.g. `<|im_end|>`).

    Raises:
        ValueError: the chat template does not echo assistant content verbatim (cannot locate the sentinel).
    """
    head = _head(tokenizer)
    if head.echoes == 0:
        raise ValueError("chat template does not render assistant content verbatim; cannot derive the turn wrapper")
    return head.end_of_turn


def render_continuation(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    model_turn: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    r"""The chat template's text between an assistant turn and the next one, for the messages that come between.

    Renders `[user, assistant(<sentinel>), *messages]` with the generation prompt and keeps what follows the
    sentinel, so the wrapper (end of turn, role headers, grouping of consecutive tool messages, the next
    assistant header) is exactly the template's, e.g. for Qwen3 and one tool message
    `<|im_end|>\n<|im_start|>user\n<tool_response>\n...\n</tool_response><|im_end|>\n<|im_start|>assistant\n`.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: the chat messages after the assistant turn (tool results, user turns, ...), in order.
        model_turn: decoded text of the model turn (special tokens kept); when it already ends with the
            end-of-turn marker (the model emitted `<|im_end|>`), the marker is not repeated, nor a special token the
            continuation opens with (GLM-4's model stops on `<|observation|>`, the tool turn's header); when it ends
            with a marker the template writes in place of the end-of-turn one (Llama 3.1 ends a built-in tool call
            with `<|eom_id|>`, then opens the `ipython` turn), no `<|eot_id|>` is added.
        template_kwargs: the template variables the prompt was rendered with (`--apply-chat-template-kwargs`):
            the next assistant header is the template's for them (Qwen3's `enable_thinking: false` adds an empty
            `<think>\n\n</think>\n\n`; without them, turns after the first were prompted in thinking mode).

    Returns:
        The text to tokenize and append as non-trainable tokens.

    Raises:
        ValueError: the chat template does not echo assistant content verbatim (cannot locate the sentinel).
    """
    # The cut is after the sentinel's last echo by the assistant turn, counted from the left: `messages` come after
    # it and may hold the sentinel's text themselves (tool output is the model's to choose). Cut at the last
    # occurrence, a tool printing the sentinel dropped the tool wrapper before it from the observation, and what
    # followed (a forged `<|im_start|>assistant`) stood right after the model's turn.
    head = _head(tokenizer)
    echoes = head.echoes
    rendered = render_messages(
        tokenizer, [*map(dict, _HEAD), *messages], add_generation_prompt=True, template_kwargs=template_kwargs
    )
    cut = -1
    for _ in range(echoes):
        cut = rendered.find(TEMPLATE_SENTINEL, cut + 1)
    if echoes == 0 or cut < 0:
        raise ValueError("chat template does not render assistant content verbatim; cannot derive the turn wrapper")
    text = rendered[cut + len(TEMPLATE_SENTINEL) :]
    eot = head.end_of_turn
    if eot and text.startswith(eot):
        # The model closed its turn itself: with the end-of-turn marker, or with another end-of-message marker the
        # template writes in its place (Llama 3.1's `<|eom_id|>` after a built-in tool call).
        if model_turn.rstrip().endswith(eot) or _ends_with_own_marker(tokenizer, model_turn):
            return text[len(eot) :]
    # A template without an end-of-turn marker (GLM-4's) opens the next turn with a role token that the model stops
    # on (`<|observation|>`, `<|user|>`: stop ids of its generation config): the model wrote it, so it is not repeated.
    closing = [t for t in _special_tokens(tokenizer) if model_turn.endswith(t) and text.startswith(t)]
    return text[len(max(closing, key=len)) :] if closing else text


def _ends_with_own_marker(tokenizer: Any, model_turn: str) -> bool:
    """Whether the model turn ends with another end-of-message marker of the template (Llama 3.1's `<|eom_id|>`).

    Such a marker is a special token the template's source writes itself, never right before its end-of-turn
    marker, and that a plain user/assistant exchange (the head) never holds: Llama 3.1 writes `<|eom_id|>` after a
    built-in tool call (`<|python_tag|>brave_search.call(query="x")<|eom_id|>`) and the tool's
    `<|start_header_id|>ipython` header follows it with no `<|eot_id|>` between. Not one: a token of every turn
    (ChatML's `<|im_start|>`, in the head); one the template never writes (Qwen's `<|endoftext|>`, Llama 3.0's
    `<|eom_id|>`), which it closes with its end-of-turn marker as any other content; one the template writes
    followed by that marker (a tool-calls block's closing token written as `<|tool_calls_end|><|eot|>`).
    """
    template = getattr(tokenizer, "chat_template", None)
    turn = model_turn.rstrip()
    head = _head(tokenizer)
    if not isinstance(template, str) or not head.end_of_turn:
        return False
    return any(
        t in template and t + head.end_of_turn not in template and t not in head.text
        for t in _special_tokens(tokenizer)
        if turn.endswith(t)
    )


def _special_tokens(tokenizer: Any) -> list[str]:
    """The text of the tokenizer's special added tokens (`<|im_end|>`, `<|observation|>`, ...); [] for a stand-in."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return [t.content for t in decoder.values() if getattr(t, "special", False) and t.content]


@dataclasses.dataclass(kw_only=True, slots=True)
class ConsistencyReport:
    """Result of `check_chat_template_consistency`.

    Attributes:
        consistent: the token streams agree (up to trailing whitespace the template adds after the
            last end-of-turn marker).
        first_mismatch: index into `sample.tokens` of the first differing token, or None.
        num_stream_tokens: `len(sample.tokens)`.
        num_template_tokens: length of the chat template's tokenization.
        message: a human-readable description with decoded context around the mismatch.
    """

    consistent: bool
    first_mismatch: int | None
    num_stream_tokens: int
    num_template_tokens: int
    message: str


def _template_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: Any) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=False)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def check_chat_template_consistency(
    tokenizer: Any, sample: Sample, messages: list[dict[str, Any]], *, tools: Any = None
) -> ConsistencyReport:
    """Compares a sample's incremental token stream with the chat template's rendering of `messages`.

    A trainer that later re-renders the conversation (SFT, a reward model, a re-tokenizing agent
    framework) sees the template's tokens; the policy was sampled on the incremental stream. Any
    difference (the template inserting an empty `<think></think>`, stripping reasoning of earlier turns,
    merging whitespace, re-tokenizing model text into different ids) means those consumers train on
    something the model never saw.

    Args:
        tokenizer: the run's tokenizer.
        sample: a generated sample (`tokens` = prompt + response).
        messages: the same conversation as chat messages (user, assistant turns with their raw text,
            tool messages).
        tools: tool specs passed to the template (as for the prompt).

    Returns:
        A report; never raises on a mismatch (the caller decides whether it is fatal).
    """
    stream = list(sample.tokens)
    expected = _template_ids(tokenizer, messages, tools)
    n = min(len(stream), len(expected))
    first = next((i for i in range(n) if stream[i] != expected[i]), None)
    if first is None:
        extra = stream[n:] if len(stream) > n else expected[n:]
        if not extra or not tokenizer.decode(extra).strip():
            return ConsistencyReport(
                consistent=True,
                first_mismatch=None,
                num_stream_tokens=len(stream),
                num_template_tokens=len(expected),
                message="token stream matches the chat template",
            )
        first = n

    def context(ids: list[int]) -> str:
        return repr(tokenizer.decode(ids[max(0, first - 8) : first + 8]))

    message = (
        f"sample {sample.index}: token stream and chat template differ at token {first} "
        f"(stream {len(stream)} tokens, template {len(expected)}): "
        f"stream ...{context(stream)}... vs template ...{context(expected)}..."
    )
    return ConsistencyReport(
        consistent=False,
        first_mismatch=first,
        num_stream_tokens=len(stream),
        num_template_tokens=len(expected),
        message=message,
    )


def record_segment(
    sample: Sample,
    role: str,
    content: str,
    *,
    tool_responses: Sequence[str] | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
) -> None:
    """Appends one piece of the sample's conversation (multi-turn generate function, agent adapter).

    Args:
        sample: the sample being generated.
        role: `assistant` (a model turn, decoded with special tokens kept) or `observation` (the exact text
            that was tokenized as observation).
        content: the text.
        tool_responses: for an observation rendered from tool messages, their contents.
        messages: for an observation rendered from any chat messages (`render_continuation`), those messages.
    """
    record = sample.metadata.setdefault(CONVERSATION_KEY, {"tools": None, "segments": []})
    segment: dict[str, Any] = {"role": role, "content": content}
    if tool_responses is not None:
        segment["tool_responses"] = list(tool_responses)
    if messages is not None:
        segment["messages"] = [dict(m) for m in messages]
    record["segments"].append(segment)


def _chat_messages(
    tokenizer: Any, prompt: str | list[dict[str, Any]], segments: list[dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """The conversation as chat messages, or None when some observation was not rendered from chat messages.

    None too when a model turn ends with a marker the template writes in place of its end-of-turn one
    (`_ends_with_own_marker`): the concatenated text is compared then.
    """
    if isinstance(prompt, str) or any(
        s["role"] == "observation" and s.get("tool_responses") is None and s.get("messages") is None for s in segments
    ):
        return None
    eot = end_of_turn(tokenizer)
    rest = _head(tokenizer).header_rest
    messages = list(prompt)
    for k, segment in enumerate(segments):
        if segment["role"] == "assistant":
            if _ends_with_own_marker(tokenizer, segment["content"]):
                # The template writes such a turn only from structured tool calls (Llama 3.1: `tool_calls` and
                # `builtin_tools`), which the recorded text is not; as plain content it would close it twice.
                return None
            text = segment["content"].rstrip()
            text = text.removesuffix(eot) if eot else text
            text = text.removeprefix(rest) if rest.strip() == "" else text  # whitespace the template writes again
            if not eot and k + 1 < len(segments) and segments[k + 1]["role"] == "observation":
                # The role token the model stopped on opens the next turn (GLM-4): the template writes it there.
                opening = render_continuation(tokenizer, _segment_messages(segments[k + 1]), model_turn="")
                shared = [t for t in _special_tokens(tokenizer) if text.endswith(t) and opening.startswith(t)]
                text = text[: len(text) - len(max(shared, key=len))] if shared else text
            messages.append({"role": "assistant", "content": text})
        else:
            messages += _segment_messages(segment)
    return messages


def _segment_messages(segment: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages an observation segment was rendered from (its messages, or tool messages)."""
    if segment.get("messages") is not None:
        return list(segment["messages"])
    return [{"role": "tool", "content": r} for r in segment["tool_responses"]]


def checkable(sample: Sample) -> bool:
    """Whether the sample's recorded conversation renders as recorded.

    Not when the response budget cut an observation, nor for an aborted or failed episode (partial output).
    """
    record = sample.metadata.get(CONVERSATION_KEY)
    return bool(record) and not record.get("cut") and sample.status not in (Status.ABORTED, Status.FAILED)


def check_sample(tokenizer: Any, sample: Sample) -> ConsistencyReport | None:
    """Checks one recorded sample; returns a `ConsistencyReport`, None if not `checkable`.

    The report's `message` says which rendering was compared (chat template or concatenated text).
    """
    if not checkable(sample):
        return None
    record = sample.metadata[CONVERSATION_KEY]
    tools = record.get("tools")
    segments = record["segments"]
    # The agent adapter records the chat messages its first request was rendered from (sample.prompt stays the
    # dataset's prompt, which reward functions read).
    prompt = record.get("prompt", sample.prompt)
    messages = _chat_messages(tokenizer, prompt, segments)
    if messages is not None:
        report = check_chat_template_consistency(tokenizer, sample, messages, tools=tools)
        if sample.status is Status.TRUNCATED and report.first_mismatch == len(sample.tokens):
            # The length limit cut the last model turn: the template closes it, the stream stops. A prefix is fine.
            report.consistent, report.first_mismatch = True, None
            report.message = "token stream is a prefix of the chat template (last turn cut at the length limit)"
        report.message = f"chat template: {report.message}"
        return report
    if not isinstance(prompt, str):
        prompt = tokenizer.apply_chat_template(list(prompt), tools=tools, tokenize=False, add_generation_prompt=True)
    text = prompt + "".join(s["content"] for s in segments)
    expected = tokenizer.encode(text, add_special_tokens=False)
    stream = list(sample.tokens)
    first = next((i for i, (a, b) in enumerate(zip(stream, expected, strict=False)) if a != b), None)
    if first is None and len(stream) != len(expected):
        first = min(len(stream), len(expected))
    if first is None:
        message = "concatenated text: token stream matches re-tokenization"
    else:
        window = slice(max(0, first - 8), first + 8)
        message = (
            f"concatenated text: sample {sample.index}: token stream and re-tokenization differ at token {first} "
            f"(stream {len(stream)} tokens, re-tokenized {len(expected)}): stream "
            f"...{tokenizer.decode(stream[window])!r}... vs ...{tokenizer.decode(expected[window])!r}..."
        )
    return ConsistencyReport(
        consistent=first is None,
        first_mismatch=first,
        num_stream_tokens=len(stream),
        num_template_tokens=len(expected),
        message=message,
    )


def check_samples(tokenizer: Any, samples: Sequence[Sample], limit: int) -> dict[str, float]:
    """Checks the first `limit` samples that carry a recorded conversation; logs every mismatch.

    Args:
        tokenizer: the run's tokenizer (`--hf-checkpoint`).
        samples: a rollout's samples, in order.
        limit: how many recorded samples to check (`--check-chat-template-samples`).

    Returns:
        `rollout/chat_template/checked`, `rollout/chat_template/mismatched`, `rollout/chat_template/skipped`
        (recorded samples passed over: cut by the budget, aborted, failed) and, with a mismatch,
        `rollout/chat_template/first_mismatch_token` (position in `sample.tokens` of the first one); empty when no
        sample has a record (single-turn runs).
    """
    checked = mismatched = skipped = 0
    first_position: int | None = None
    for sample in samples:
        if checked >= limit:
            break
        if CONVERSATION_KEY not in sample.metadata:
            continue
        report = check_sample(tokenizer, sample)
        if report is None:
            skipped += 1
            continue
        checked += 1
        if not report.consistent:
            mismatched += 1
            first_position = report.first_mismatch if first_position is None else first_position
            logger.warning("chat-template check: %s", report.message)
    if not checked and not skipped:
        return {}
    logger.info(
        "chat-template check: %d of %d multi-turn samples differ (%d not checkable)", mismatched, checked, skipped
    )
    out = {
        "rollout/chat_template/checked": float(checked),
        "rollout/chat_template/mismatched": float(mismatched),
        "rollout/chat_template/skipped": float(skipped),
    }
    if first_position is not None:
        out["rollout/chat_template/first_mismatch_token"] = float(first_position)
    return out
