"""`slime.utils.mask_utils.MultiTurnLossMaskGenerator` answers the original's per-type and multimodal methods.

Reproducer: the original's own tests and plugins call `gen_multi_turn_loss_mask_qwen3(messages, tools)` (and its
qwen / qwen3_5 / distill_qwen siblings) or `get_loss_mask_with_multimodal_alignment(messages, input_ids)` on the
generator; here they stopped at AttributeError ('ChatLossMask' object has no attribute ...).
"""

import pytest

from slime.utils.mask_utils import MultiTurnLossMaskGenerator
from slime_rollout.data.sft import ChatLossMask
from slime_rollout.data.source import get_tokenizer

CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Q"},
    {"role": "assistant", "content": "<think>\nR\n</think>\n\nA"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "B"},
]


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_dir):
    return get_tokenizer(str(qwen3_tokenizer_dir))


@pytest.mark.parametrize("mask_type", ["qwen", "qwen3", "qwen3_5", "distill_qwen"])
def test_each_per_type_method_is_that_types_mask_whatever_the_generators_type(tokenizer, mask_type):
    generator = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen")
    got = getattr(generator, f"gen_multi_turn_loss_mask_{mask_type}")(CONVERSATION)
    assert got == ChatLossMask(tokenizer, mask_type).get_loss_mask(CONVERSATION)
    assert generator.tokenizer_type == "qwen"  # the generator itself is unchanged


def test_qwen3_method_keeps_every_turns_reasoning(tokenizer):
    ids, mask = MultiTurnLossMaskGenerator(tokenizer).gen_multi_turn_loss_mask_qwen3(CONVERSATION)
    trained = MultiTurnLossMaskGenerator(tokenizer).get_text_from_loss_mask(ids, mask)
    assert trained == ["<think>\nR\n</think>\n\nA<|im_end|>\n", "<think>\n\n</think>\n\nB<|im_end|>\n"]


def test_multimodal_alignment_masks_the_text_parts_and_left_pads_to_the_processors_ids(tokenizer):
    generator = MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen3")
    parts = [
        {"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "Q"}, "more"]},
        {"role": "assistant", "content": [{"type": "text", "text": "A"}]},
    ]
    text_ids, text_mask = generator.get_loss_mask(
        [{"role": "user", "content": "Q more"}, {"role": "assistant", "content": "A"}]
    )
    # A processor's ids hold the image's placeholder tokens too: 4 more here.
    input_ids = [7, 7, 7, 7, *text_ids]
    ids, mask = generator.get_loss_mask_with_multimodal_alignment(parts, input_ids)
    assert ids == input_ids and mask == [0, 0, 0, 0, *text_mask] and sum(mask) == sum(text_mask) > 0
    with pytest.raises(ValueError, match=r"input_ids \(3 tokens\) are shorter than the text's loss mask"):
        generator.get_loss_mask_with_multimodal_alignment(parts, [1, 2, 3])
