"""`slime.utils.mask_utils`: loss masks of chat conversations for SFT (original module path).

`MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen").get_loss_mask(messages, tools)` returns
`(token_ids, loss_mask)`; see `slime_rollout.data.sft.ChatLossMask` for the supported `--loss-mask-type` values. The
original's per-type methods (`gen_multi_turn_loss_mask_qwen3(messages, tools)`, ...) and
`get_loss_mask_with_multimodal_alignment` are here too, for plugins and tests written against it.
"""

from collections.abc import Sequence
from typing import Any

from slime_rollout.data.sft import ChatLossMask
from slime_rollout.data.sft import response_lengths as get_response_lengths

__all__ = ["MultiTurnLossMaskGenerator", "get_response_lengths"]


class MultiTurnLossMaskGenerator(ChatLossMask):
    """`ChatLossMask` with the original generator's methods (same arguments, same `(token_ids, loss_mask)`)."""

    def _as(self, tokenizer_type: str, messages: list[dict[str, Any]], tools: list[dict] | None):
        # A generator of that type on the same tokenizer (renders qwen3's anchor turn once more: cheap).
        return ChatLossMask(self.tokenizer, tokenizer_type).get_loss_mask(messages, tools=tools)

    def gen_multi_turn_loss_mask_qwen(self, messages: list[dict[str, Any]], tools: list[dict] | None = None):
        """`--loss-mask-type qwen`'s `(token_ids, loss_mask)`, both `[T]`, whatever this generator's type."""
        return self._as("qwen", messages, tools)

    def gen_multi_turn_loss_mask_qwen3(self, messages: list[dict[str, Any]], tools: list[dict] | None = None):
        """`--loss-mask-type qwen3`'s `(token_ids, loss_mask)`, both `[T]`, whatever this generator's type."""
        return self._as("qwen3", messages, tools)

    def gen_multi_turn_loss_mask_qwen3_5(self, messages: list[dict[str, Any]], tools: list[dict] | None = None):
        """`--loss-mask-type qwen3_5`'s `(token_ids, loss_mask)`, both `[T]`, whatever this generator's type."""
        return self._as("qwen3_5", messages, tools)

    def gen_multi_turn_loss_mask_distill_qwen(self, messages: list[dict[str, Any]], tools: list[dict] | None = None):
        """`--loss-mask-type distill_qwen`'s `(token_ids, loss_mask)`, both `[T]`, whatever this generator's type."""
        return self._as("distill_qwen", messages, tools)

    def get_loss_mask_with_multimodal_alignment(
        self, messages: list[dict[str, Any]], input_ids: Sequence[int], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """`(input_ids, loss_mask)`: the mask of the conversation's text, left-padded with 0 to `len(input_ids)`.

        As the original: a message's content list becomes its text parts joined by a space (image and video parts
        dropped); the processor's `input_ids` hold the media tokens the text does not, all before the reply.

        Raises:
            ValueError: `input_ids` are shorter than the text's mask (processor and tokenizer disagree).
        """
        text = [
            {**m, "content": " ".join(_text_parts(m["content"]))} if isinstance(m.get("content"), list) else m
            for m in messages
        ]
        _, mask = self.get_loss_mask(text, tools=tools)
        pad = len(input_ids) - len(mask)
        if pad < 0:
            raise ValueError(
                f"input_ids ({len(input_ids)} tokens) are shorter than the text's loss mask ({len(mask)}): the "
                "processor and the tokenizer do not tokenize the conversation alike"
            )
        return list(input_ids), [0] * pad + mask


def _text_parts(parts: list[Any]) -> list[str]:
    """The text of a content list: `{"type": "text"}` parts and bare strings, in order."""
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type") == "text":
            texts.append(part.get("text", ""))
    return texts
