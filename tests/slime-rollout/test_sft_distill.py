"""`--loss-mask-type distill_qwen` (DeepSeek-R1-Distill-Qwen's format), and the original's switch to it.

Reproducers: [system, user, assistant] was trained as the reply to the system prompt alone (the prompt rendered
only the first message: the question was not in the sample); `--loss-mask-type qwen` (the default) on a tokenizer
with DeepSeek's `<｜Assistant｜>` token failed "the chat template is not ChatML", where the original masks it as
distill_qwen.
"""

import pytest
from transformers import AutoTokenizer

from slime_core.sample import Sample
from slime_rollout.data.sft import ChatLossMask, sft_sample

# DeepSeek-R1-Distill-Qwen's template, shortened to what a conversation without tools uses.
DISTILL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}"
    "{% elif m.role == 'user' %}<｜User｜>{{ m.content }}{% elif m.role == 'assistant' %}<｜Assistant｜>"
    "{{ m.content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(scope="module")
def distill_tokenizer(qwen3_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))  # a private copy: tokens are added to it
    added = ["<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
    tokenizer.add_special_tokens({"additional_special_tokens": added})
    tokenizer.chat_template = DISTILL_TEMPLATE
    tokenizer.eos_token = "<｜end▁of▁sentence｜>"  # as DeepSeek-R1-Distill-Qwen's tokenizer_config.json says
    return tokenizer


@pytest.mark.parametrize("kind", ["distill_qwen", "qwen"])
def test_the_prompt_is_every_message_before_the_reply(distill_tokenizer, kind):
    builder = ChatLossMask(distill_tokenizer, kind)
    # `qwen` switches on the tokenizer's <｜Assistant｜>, as the original's get_loss_mask does
    assert builder.tokenizer_type == "distill_qwen"
    ids, mask = builder.get_loss_mask(CONVERSATION)
    prompt = [t for t, m in zip(ids, mask, strict=True) if not m]
    # Was "Be brief.<｜Assistant｜>": the question left out.
    assert distill_tokenizer.decode(prompt) == "Be brief.<｜User｜>What is 2+2?<｜Assistant｜>"
    assert builder.get_text_from_loss_mask(ids, mask) == ["4<｜end▁of▁sentence｜>"]
    # A two-message conversation is masked as the original masks it (its first message is all before the reply),
    # and the reply ends with the end-of-sentence token the template closes it with (below).
    two_ids, two_mask = builder.get_loss_mask(CONVERSATION[1:])
    first = distill_tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True)
    first_ids = distill_tokenizer(first, add_special_tokens=False)["input_ids"]
    reply_ids = [*distill_tokenizer("4", add_special_tokens=False)["input_ids"], distill_tokenizer.eos_token_id]
    assert (two_ids, two_mask) == (first_ids + reply_ids, [0] * len(first_ids) + [1] * len(reply_ids))


def test_the_reply_is_trained_with_the_end_of_sentence_token_the_template_closes_it_with(distill_tokenizer):
    # The original tokenized the reply's text alone: the model never saw <｜end▁of▁sentence｜> after a reply, so
    # an SFT'd model did not learn to stop. The template writes it after every assistant turn.
    builder = ChatLossMask(distill_tokenizer, "distill_qwen")
    eos = distill_tokenizer.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    ids, mask = builder.get_loss_mask(CONVERSATION)
    assert ids[-1] == eos and mask[-1] == 1
    assert distill_tokenizer.apply_chat_template(CONVERSATION, tokenize=False).endswith("4<｜end▁of▁sentence｜>")
    # A reply that already ends with it keeps one.
    closed = [*CONVERSATION[:2], {"role": "assistant", "content": "4<｜end▁of▁sentence｜>"}]
    assert builder.get_loss_mask(closed) == (ids, mask)


def test_the_switched_type_checks_the_conversation_as_distill_qwen(distill_tokenizer):
    with pytest.raises(ValueError, match="^sample 3: --loss-mask-type distill_qwen trains on the last message"):
        sft_sample(Sample(prompt=CONVERSATION[:2], index=3), ChatLossMask(distill_tokenizer, "qwen"))
