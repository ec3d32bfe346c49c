r"""Supervised fine-tuning data: chat conversations → token ids and loss masks, and the SFT "rollout".

The original's SFT recipe (`scripts/run-qwen3-4B-base-sft.sh`) trains with `--rollout-function-path
slime.rollout.sft_rollout.generate_rollout --loss-type sft_loss --debug-train-only`: no engine generates; the
"rollout" turns each dataset conversation (`--input-key messages`) into tokens and a loss mask that is 1 on the
assistant turns only, as `--loss-mask-type` says for the tokenizer's chat template.

`ChatLossMask` renders the whole conversation once with the tokenizer's chat template, tokenizes that text with
character offsets (and checks the ids equal the template's own tokenization), marks the characters of every
assistant turn's body — after the `<|im_start|>assistant\n` header, through its `<|im_end|>` and newline — and
maps them to tokens. Types (the original's `--loss-mask-type` values):

| type | chat format | trainable |
|---|---|---|
| `qwen` | ChatML (Qwen2.5); any other (Llama 3, GLM-4) | assistant body incl. a leading `<think>` block |
| `qwen3` | ChatML (Qwen3) | the same, each turn rendered as the original does (below) |
| `qwen3_5` | ChatML (Qwen3.5) | the same as `qwen` without the leading `<think>\n` line |
| `distill_qwen` | DeepSeek-R1-Distill-Qwen | the last message (text + end-of-sentence token) after the earlier ones |

On a template without ChatML's markers, `qwen` trains what each reply's rendering adds after the generation prompt of
the messages before it (Llama 3: `hello<|eot_id|>`), as the original's message-by-message cut does.

`qwen3` renders the conversation turn by turn, as the original's `gen_multi_turn_loss_mask_qwen3` does: each
message (a run of tool messages as one) after a fixed user message, whose rendering is then cut off. Qwen3's template
keeps a turn's `<think>` block only after the last user message, so one rendering of a whole conversation dropped the
reasoning of every earlier assistant turn from the training data; rendered alone, every assistant turn keeps its
reasoning (and gets Qwen3's empty `<think>\n\n</think>\n\n` when it has none), as the original trains them.

A message with `"step_loss_mask": 0` is not trained on. Everything here is CPU string and tokenizer work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jinja2

from slime_core.error_text import preview
from slime_core.sample import Sample, Status
from slime_rollout.base_types import RolloutFnTrainOutput
from slime_rollout.data.prompt_length import model_context_len
from slime_rollout.data.rows import prompt_problem
from slime_rollout.data.tokenizer import get_tokenizer

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs
    from slime_core.protocols import DataSource

__all__ = ["LOSS_MASK_TYPES", "ChatLossMask", "conversation_problem", "generate_sft_rollout", "response_lengths"]

logger = logging.getLogger(__name__)

LOSS_MASK_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")
_START = "<|im_start|>"
_HEADER = _START + "assistant\n"
_END = "<|im_end|>"
_THINK = "<think>\n"
_ROLES = ("system", "user", "assistant", "tool")  # the roles every LOSS_MASK_TYPES template renders
_DISTILL_MARKER = "<｜Assistant｜>"  # DeepSeek-R1-Distill-Qwen's assistant token (full-width bars)


def response_lengths(loss_masks: Sequence[Sequence[int]]) -> list[int]:
    """Per mask, the number of tokens from its first 1 to its end (0 for a mask without a 1).

    The response of an SFT sample starts at the first trainable token; everything before it is the prompt.
    """
    return [len(mask) - list(mask).index(1) if 1 in mask else 0 for mask in loss_masks]


class ChatLossMask:
    """Token ids and loss mask of a chat conversation (original `MultiTurnLossMaskGenerator`).

    Args:
        tokenizer: a Hugging Face fast tokenizer with a chat template.
        tokenizer_type: one of `LOSS_MASK_TYPES` (`--loss-mask-type`).

    Raises:
        ValueError: an unknown type.
    """

    def __init__(self, tokenizer: Any, tokenizer_type: str = "qwen") -> None:
        if tokenizer_type not in LOSS_MASK_TYPES:
            raise ValueError(f"--loss-mask-type {tokenizer_type!r}: expected one of {', '.join(LOSS_MASK_TYPES)}")
        self.tokenizer = tokenizer
        self.tokenizer_type = tokenizer_type
        if tokenizer_type == "qwen" and _DISTILL_MARKER in tokenizer.get_added_vocab():
            # The original's `get_loss_mask` does the same: its default type on a DeepSeek-R1-Distill-Qwen tokenizer
            # (no ChatML) is distill_qwen.
            logger.info("--loss-mask-type qwen on a tokenizer with %r: masking as distill_qwen", _DISTILL_MARKER)
            self.tokenizer_type = "distill_qwen"
        # `qwen3`'s fixed user turn and its rendering (the same for every conversation: rendered once here).
        self._anchor = [{"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}]
        self._anchor_text = (
            tokenizer.apply_chat_template(self._anchor, tokenize=False) if self.tokenizer_type == "qwen3" else ""
        )
        # What the template's generation prompt writes after the anchor: `<|im_start|>assistant\n`, and with a
        # thinking-only template (Qwen3-*-Thinking-2507) `<|im_start|>assistant\n<think>\n`. The model never
        # generates it, so a turn is trained after it, as the original's `gen_token_length` cut does.
        self._gen_prompt = _HEADER
        if self.tokenizer_type == "qwen3":
            prompted = tokenizer.apply_chat_template(self._anchor, tokenize=False, add_generation_prompt=True)
            if prompted.startswith(self._anchor_text) and prompted[len(self._anchor_text) :].startswith(_HEADER):
                self._gen_prompt = prompted[len(self._anchor_text) :]

    def get_response_lengths(self, loss_masks: Sequence[Sequence[int]]) -> list[int]:
        """See `response_lengths`."""
        return response_lengths(loss_masks)

    def get_loss_mask(
        self, messages: list[dict[str, Any]], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """`(token_ids, loss_mask)` of the conversation, both `[T]` (mask 1 = trained on).

        Raises:
            ValueError: the template's text does not re-tokenize to its own ids, or an assistant turn cannot be
                found in the rendered text (a template this type does not describe; with `qwen` on a template
                without ChatML markers, one that rewrites earlier turns).
        """
        if self.tokenizer_type == "distill_qwen":
            return self._distill(messages, tools)
        if self.tokenizer_type == "qwen3":
            return self._turn_by_turn(messages, tools)
        text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
        expected = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
        if ids != list(expected):
            raise ValueError(f"--loss-mask-type {self.tokenizer_type}: the chat template's text does not re-tokenize "
                             "to its own token ids; use a fast tokenizer of the same model")  # fmt: skip
        if self.tokenizer_type == "qwen" and _START not in text:
            # Not ChatML (Llama 3's `<|start_header_id|>`, GLM-4's `<|assistant|>`): the original's default type
            # masks any template message by message; here each assistant turn is the text its rendering adds after
            # the conversation so far with the generation prompt, as the model generates it.
            marked = _generated_characters(self.tokenizer, text, messages, tools)
            return ids, [1 if end > start and marked[start] else 0 for start, end in offsets]
        marked = self._marked_characters(text, messages)
        if self.tokenizer_type == "qwen":
            # A token is trained on if it starts in a turn's body: the original cuts the header's tokens from each
            # assistant message, so a token that also holds the header's newline (a reply opening with "\n" merges
            # into "\n\n") is not trained.
            return ids, [1 if end > start and marked[start] else 0 for start, end in offsets]
        # qwen3_5, as the original's: a token is trained on if its span holds a marked character
        # (prefix[i] = marked characters before position i).
        prefix = [0]
        for flag in marked:
            prefix.append(prefix[-1] + flag)
        mask = [1 if end > start and prefix[end] > prefix[start] else 0 for start, end in offsets]
        return ids, mask

    def _turn_by_turn(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> tuple[list[int], list[int]]:
        r"""`qwen3`: each turn rendered after (the first: before) a fixed user message that is then cut off.

        The original's `gen_multi_turn_loss_mask_qwen3`, on text: a run of tool messages is one turn (Qwen's
        templates wrap them in one user turn); an assistant turn is trained on after the template's generation
        prompt (its header, plus `<think>\n` with a thinking-only template), or after its header where it does not
        start with that prompt (the original cut the prompt's token count from it anyway).
        """
        anchor, anchor_text = self._anchor, self._anchor_text
        ids: list[int] = []
        mask: list[int] = []
        i = 0
        while i < len(messages):
            end = i + 1
            while messages[i].get("role") == "tool" and end < len(messages) and messages[end].get("role") == "tool":
                end += 1
            turn = messages[i:end]
            if i == 0:  # tools go with the first turn, where the template writes them (the system block)
                text = self.tokenizer.apply_chat_template(turn + anchor, tools=tools, tokenize=False)
                cut = text[: -len(anchor_text)] if text.endswith(anchor_text) else None
            else:
                text = self.tokenizer.apply_chat_template(anchor + turn, tokenize=False)
                cut = text[len(anchor_text) :] if text.startswith(anchor_text) else None
            if cut is None:
                raise ValueError(f"--loss-mask-type qwen3: message {i} does not render apart from the fixed user "
                                 "message the turns are cut from; the chat template is not Qwen3's ChatML")  # fmt: skip
            trained = turn[0].get("role") == "assistant" and turn[0].get("step_loss_mask", 1) == 1
            # A first assistant turn given tools comes after the template's tools system block, which is not trained
            # (the original trained it as the reply: it cut only the header's length).
            body = len(_HEADER) + (cut.find(_HEADER) if i == 0 and tools and not cut.startswith(_HEADER) else 0)
            if trained and cut[body - len(_HEADER) : body] != _HEADER:
                raise ValueError(f"--loss-mask-type qwen3: message {i} (assistant) does not render as "
                                 f"'{_HEADER!r}...'; the chat template is not ChatML")  # fmt: skip
            if trained and cut.startswith(self._gen_prompt, body - len(_HEADER)):
                body += len(self._gen_prompt) - len(_HEADER)
            encoded = self.tokenizer(cut, add_special_tokens=False, return_offsets_mapping=True)
            ids += encoded["input_ids"]
            # A token is trained on when it starts at or after the generation prompt (the original: all but the
            # prompt's tokens; a token spanning its end, such as `<think>\n`'s newline merged with the next, is not).
            mask += [int(trained and start >= body) for start, _ in encoded["offset_mapping"]]
            i = end
        return ids, mask

    def _marked_characters(self, text: str, messages: list[dict[str, Any]]) -> list[int]:
        """One flag per character of `text`: 1 inside the trainable body of an assistant turn."""
        marked = [0] * len(text)
        cursor = 0
        for message in messages:
            if message.get("role") != "assistant":
                continue
            start = text.find(_HEADER, cursor)
            end = text.find(_END, start + len(_HEADER)) if start >= 0 else -1
            if end < 0:
                raise ValueError(f"--loss-mask-type {self.tokenizer_type}: no '{_HEADER!r}...{_END}' assistant turn in "
                                 "the rendered conversation; the chat template is not ChatML")  # fmt: skip
            body = start + len(_HEADER)
            stop = end + len(_END) + (1 if text.startswith("\n", end + len(_END)) else 0)
            cursor = stop
            if message.get("step_loss_mask", 1) != 1:
                continue
            if self.tokenizer_type == "qwen3_5" and text.startswith(_THINK, body):
                body += len(_THINK)
            marked[body:stop] = [1] * (stop - body)
        return marked

    def _distill(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> tuple[list[int], list[int]]:
        # The prompt is every message before the reply. The original renders only the first (`messages[:1]`): the
        # same for [user, assistant], but [system, user, assistant] was trained as the reply to the system prompt
        # alone, the question dropped.
        prompt = self.tokenizer.apply_chat_template(
            messages[:-1], tools=tools, tokenize=False, add_generation_prompt=True
        )
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = self.tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        if eos is not None and response_ids[-1:] != [eos]:
            # The template closes every reply with it; the original tokenized the text alone, so a model trained on
            # it never learned to stop.
            response_ids.append(eos)
        trainable = 1 if messages[-1].get("step_loss_mask", 1) == 1 else 0
        return [*prompt_ids, *response_ids], [0] * len(prompt_ids) + [trainable] * len(response_ids)

    def get_text_from_loss_mask(self, token_ids: Sequence[int], loss_mask: Sequence[int]) -> list[str]:
        """The decoded text of each run of trainable tokens (for inspecting a mask)."""
        runs: list[list[int]] = []
        current: list[int] = []
        for token, flag in zip(token_ids, loss_mask, strict=True):
            if flag:
                current.append(token)
            elif current:
                runs.append(current)
                current = []
        if current:
            runs.append(current)
        return [self.tokenizer.decode(run) for run in runs]


def _generated_characters(
    tokenizer: Any, text: str, messages: list[dict[str, Any]], tools: list[dict] | None
) -> list[int]:
    r"""One flag per character of `text` (the whole conversation rendered): 1 where an assistant turn is generated.

    Assistant turn `i` spans from the end of `messages[:i]` rendered with the generation prompt to the end of
    `messages[: i + 1]` rendered without it, through its end-of-turn marker (Llama 3: `hello<|eot_id|>` after
    `<|start_header_id|>assistant<|end_header_id|>\n\n`): the tokens the model writes after the prompt it is given.

    Raises:
        ValueError: the template does not render a conversation as its prefixes followed by each turn (it rewrites
            earlier turns, as Qwen3's drops their reasoning); names the message.
    """
    marked = [0] * len(text)
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        if not (upto.startswith(prompt) and text.startswith(upto)):
            raise ValueError(
                f"--loss-mask-type qwen: message {i} (assistant) does not render as the generation prompt of the "
                "messages before it followed by the reply, within the whole conversation; this chat template "
                "rewrites earlier turns, which no --loss-mask-type describes"
            )
        if message.get("step_loss_mask", 1) == 1:
            marked[len(prompt) : len(upto)] = [1] * (len(upto) - len(prompt))
    return marked


def conversation_problem(messages: Any, tokenizer_type: str, input_key: str = "messages") -> str | None:
    r"""What makes a conversation unfit for SFT (its mask would be wrong or empty), or None; no tokenizer needed.

    The shape of the messages is the data's row check (`rows.prompt_problem`: chat messages with a role, some
    content, text a tokenizer can encode); SFT adds a list (a string prompt is one user turn, nothing to train
    on), roles the chat templates render (system, user, assistant, tool: they skip any other without a word), a
    `step_loss_mask` of 0 or 1 (any other value, null included, meant "not trained"), text content, and no chat
    marker inside a message: the ChatML types find assistant turns by
    their markers in the rendered text, so a user message quoting `<|im_start|>assistant\n` was trained on in place
    of the reply, and an assistant text holding `<|im_end|>` was trained on up to it only. A conversation must hold
    a turn to train on: an assistant message without `"step_loss_mask": 0` (a ChatML type), or a last message that
    is an assistant reply (`distill_qwen`). Preflight runs this on every row, so a bad row is named by file and
    line before the run starts, not by its sample index at the rollout that reaches it.

    Args:
        messages: the row's `--input-key` value.
        tokenizer_type: `--loss-mask-type`.
        input_key: `--input-key`, named in the message.

    Returns:
        The problem, naming the message, or None.
    """
    if not isinstance(messages, list) or not messages:
        shown = "an empty list" if isinstance(messages, list) else f"{type(messages).__name__} {preview(messages, 40)}"
        return f"SFT needs a non-empty list of chat messages in --input-key {input_key!r}, got {shown}"
    problem = prompt_problem(messages, input_key)
    if problem is not None:
        return problem
    for j, message in enumerate(messages):
        if not isinstance(message["role"], str):
            role = message["role"]
            return f"message {j} has the role {role!r} ({type(role).__name__}), not text"
        if message["role"] not in _ROLES:
            # Qwen's and DeepSeek-R1-Distill's templates skip any other role without a word (a ShareGPT "human"
            # turn vanished from the training text, the next reply trained as the answer to the turn before).
            return (
                f"message {j} has the role {message['role']!r}, which the chat template does not render (it would "
                f"be left out of the training text); use {', '.join(_ROLES[:-1])} or {_ROLES[-1]}"
            )
        step = message.get("step_loss_mask", 1)
        if step not in (0, 1):  # any value but 1 meant "not trained": null, "1", 2
            return (
                f"message {j} ({message['role']}) has step_loss_mask {step!r} ({type(step).__name__}); it takes 0 "
                "(not trained on) or 1 (trained on)"
            )
        content = message.get("content")
        if not isinstance(content, str | None):
            return f"message {j} ({message['role']}) has {type(content).__name__} content, not text"
        for marker in (_START, _END):
            if tokenizer_type != "distill_qwen" and content and marker in content:
                return (
                    f"message {j} ({message['role']}) holds the chat marker {marker!r} in its text; --loss-mask-type "
                    f"{tokenizer_type} finds assistant turns by these markers, so its loss mask would cover other "
                    "tokens"
                )
    last = messages[-1]
    if tokenizer_type == "distill_qwen":
        if last["role"] != "assistant" or len(messages) < 2 or not last["content"]:
            # distill_qwen trains on the last message's text: a user message there was trained on.
            return (
                "--loss-mask-type distill_qwen trains on the last message, which must be an assistant reply with "
                f"text after the prompt; got {len(messages)} message(s) ending with {last['role']!r}"
            )
        if last.get("step_loss_mask", 1) != 1:
            return "no message to train on (the last message, the one distill_qwen trains on, has step_loss_mask 0)"
    elif not any(m["role"] == "assistant" and m.get("step_loss_mask", 1) == 1 for m in messages):
        roles = ", ".join(dict.fromkeys(m["role"] for m in messages))
        return f"no assistant message to train on (roles: {roles}; an assistant turn with step_loss_mask 0 is not)"
    return None


def _check_messages(sample: Sample, tokenizer_type: str, input_key: str) -> None:
    """Raises `conversation_problem`'s finding, naming the sample."""
    problem = conversation_problem(sample.prompt, tokenizer_type, input_key)
    if problem is not None:
        raise ValueError(f"sample {sample.index}: {problem}")


def sft_sample(sample: Sample, builder: ChatLossMask, *, input_key: str = "messages") -> Sample:
    """Fills one SFT sample in place from its conversation (`sample.prompt`, a list of chat messages).

    Args:
        sample: the sample; its `prompt` is the conversation.
        builder: the tokenizer's loss-mask reader (`--loss-mask-type`).
        input_key: `--input-key`, named in errors about the messages.

    Raises:
        ValueError: the prompt is not a non-empty list of messages (as the data's row check takes them:
            `rows.prompt_problem`; each with a role the templates render, text or null `content` and a
            `step_loss_mask` of 0 or 1 if any), a message's text holds a
            ChatML marker the mask is located by, a distill_qwen conversation that does not end with an assistant
            reply, a chat template that cannot render the messages (its error chained), or no message is trained
            on; each names the sample.
    """
    _check_messages(sample, builder.tokenizer_type, input_key)
    try:
        ids, mask = builder.get_loss_mask(sample.prompt, tools=sample.metadata.get("tools"))
    except (TypeError, KeyError, AttributeError, IndexError, jinja2.TemplateError) as e:
        # Raised by the chat template on data it cannot take (e.g. Qwen3's on a null content): name the sample.
        raise ValueError(
            f"sample {sample.index}: the chat template cannot render its messages ({type(e).__name__}: {e})"
        ) from e
    except ValueError as e:  # the mask's own checks (a template this --loss-mask-type does not describe)
        raise ValueError(f"sample {sample.index}: {e}") from e
    (length,) = response_lengths([mask])
    if length == 0:
        raise ValueError(f"sample {sample.index}: no assistant message to train on")
    sample.tokens = ids
    sample.response_length = length
    sample.loss_mask = mask[-length:]
    sample.rollout_log_probs = None
    sample.reward = 0.0
    sample.status = Status.COMPLETED
    return sample


def generate_sft_rollout(
    args: SlimeArgs, rollout_id: int, data_source: DataSource, evaluation: bool = False
) -> RolloutFnTrainOutput:
    """The SFT "rollout" (original `slime.rollout.sft_rollout.generate_rollout`): no generation.

    Args:
        args: the plugin view; reads `hf_checkpoint` (tokenizer), `loss_mask_type`, `rollout_batch_size`,
            `n_samples_per_prompt` (must be 1).
        rollout_id: id of this rollout.
        data_source: the dataset (`--input-key` holds chat message lists).
        evaluation: not supported (the original asserts it away).

    Returns:
        `rollout_batch_size` groups of one sample: tokens, loss mask, reward 0.

    Raises:
        ValueError: `evaluation`, `--n-samples-per-prompt` != 1, or a malformed conversation.
    """
    if evaluation:
        raise ValueError("the SFT rollout has no eval mode; leave --eval-interval out")
    if args.n_samples_per_prompt != 1:
        raise ValueError(f"SFT needs --n-samples-per-prompt 1, got {args.n_samples_per_prompt}")
    builder = ChatLossMask(get_tokenizer(args.hf_checkpoint), args.loss_mask_type)
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            sft_sample(sample, builder, input_key=args.input_key)
    if rollout_id == 0 and groups:
        s = groups[0][0]
        logger.info("SFT rollout: first sample %d tokens, %d trained on", len(s.tokens), sum(s.loss_mask or []))
    lengths = [s.response_length for group in groups for s in group]
    metrics = {"rollout/response_len/mean": sum(lengths) / len(lengths)} if lengths else None
    context = model_context_len(args.hf_checkpoint)
    if metrics is not None and context is not None:
        # The data's length limit measures one rendering of the whole conversation; `qwen3` trains every turn's
        # reasoning, which that rendering drops, so a kept conversation can still outgrow the model's positions.
        over = [s.index for group in groups for s in group if len(s.tokens) > context]
        metrics["rollout/sft/num_over_context"] = float(len(over))
        if over:
            logger.warning(
                "SFT rollout %d: %d of %d samples are longer than the model's context (max_position_embeddings %d "
                "of --hf-checkpoint; samples %s): they train past it; shorten those conversations",
                rollout_id, len(over), len(lengths), context, ", ".join(map(str, over[:10])),
            )  # fmt: skip
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)
