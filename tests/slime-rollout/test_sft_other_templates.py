r"""SFT loss masks (`--loss-mask-type qwen`, the default) on chat templates that are not ChatML: Llama 3's and GLM-4's.

The original's default type masks any template message by message; ours refused every template without
`<|im_start|>assistant\n` ("the chat template is not ChatML"), so the SFT recipe stopped on a Llama 3 or GLM-4
checkpoint. The expected masks are the original's (`slime/utils/mask_utils.py` `gen_multi_turn_loss_mask_qwen`, run
on the same tokenizer and messages): the reply after the generation prompt, through the end-of-turn marker.
"""

import copy

import pytest

from slime_rollout.data.sft import ChatLossMask
from slime_rollout.data.source import get_tokenizer

# Meta-Llama-3-8B-Instruct's chat template.
_LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# GLM-4's layout: `[gMASK]<sop>`, a `<|role|>` token per turn, no end-of-turn marker (the model stops at `<|user|>`).
_GLM4 = (
    "[gMASK]<sop>{% for m in messages %}{% if m['role'] in ['system', 'user', 'assistant'] %}<|{{ m['role'] }}|>\n"
    "{{ m['content'] }}{% elif m['role'] == 'tool' %}<|observation|>\n{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_SPECIAL = {
    "llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "glm4": ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"],
}
CONVERSATION = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "call", "step_loss_mask": 0},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
]


def _tokenizer(qwen3_tokenizer_dir, name):
    tok = copy.deepcopy(get_tokenizer(str(qwen3_tokenizer_dir)))
    special = {"additional_special_tokens": _SPECIAL[name]}
    if name == "llama3":
        special["bos_token"] = "<|begin_of_text|>"
    tok.add_special_tokens(special)
    tok.chat_template = _LLAMA3 if name == "llama3" else _GLM4
    return tok


@pytest.mark.parametrize(
    ("name", "trained"),
    [
        ("llama3", ["hello<|eot_id|>", "It is sunny.<|eot_id|>"]),
        ("glm4", ["\nhello", "\nIt is sunny."]),
    ],
)
def test_qwen_masks_the_replies_of_a_template_that_is_not_chatml(qwen3_tokenizer_dir, name, trained):
    # Reproducer: ChatLossMask(tok).get_loss_mask(CONVERSATION) raised "--loss-mask-type qwen: no
    # '<|im_start|>assistant\n'...<|im_end|>' assistant turn in the rendered conversation; the chat template is not
    # ChatML"; the original trains the two replies (the one with step_loss_mask 0 not).
    tok = _tokenizer(qwen3_tokenizer_dir, name)
    builder = ChatLossMask(tok)
    ids, mask = builder.get_loss_mask(copy.deepcopy(CONVERSATION))
    assert ids == tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    assert builder.get_text_from_loss_mask(ids, mask) == trained
    # The trained tokens are exactly the replies' own (an independent count: each reply tokenized alone).
    reply_ids = [tok.encode(text, add_special_tokens=False) for text in trained]
    assert sum(mask) == sum(map(len, reply_ids))
    if name == "llama3":  # one BOS: the template's (the tokenizer adds none of its own)
        assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id


def test_a_template_that_rewrites_earlier_turns_is_one_error_naming_the_message(qwen3_tokenizer_dir):
    # A template that drops an earlier turn's reasoning renders no conversation as its prefix plus a reply: the mask
    # cannot place the reply, so it says which message, not a mask over the wrong tokens.
    tok = _tokenizer(qwen3_tokenizer_dir, "glm4")
    tok.chat_template = _GLM4.replace(
        "{{ m['content'] }}", "{{ m['content'].split('</think>')[-1] if not loop.last else m['content'] }}"
    )
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>r</think>a"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "b"},
    ]
    with pytest.raises(ValueError, match=r"--loss-mask-type qwen: message 1 \(assistant\) does not render as the "):
        ChatLossMask(tok).get_loss_mask(messages)
