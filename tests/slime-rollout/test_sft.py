"""SFT loss masks with the real Qwen3 tokenizer, and the SFT rollout (original `--rollout-function-path
slime.rollout.sft_rollout.generate_rollout`)."""

import copy

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.data.sft import ChatLossMask, generate_sft_rollout, response_lengths
from slime_rollout.data.source import get_tokenizer

CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
]


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_dir):
    return get_tokenizer(str(qwen3_tokenizer_dir))


def test_qwen_masks_exactly_the_assistant_turns(tokenizer):
    builder = ChatLossMask(tokenizer, "qwen")
    ids, mask = builder.get_loss_mask(CONVERSATION)
    assert ids == tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    assert len(mask) == len(ids)
    # Everything after each `<|im_start|>assistant\n` header through its `<|im_end|>\n` is trained on.
    assert builder.get_text_from_loss_mask(ids, mask) == [
        "Hello!<|im_end|>\n",
        "<think>\nadd\n</think>\n\n4<|im_end|>\n",
    ]
    # The prompt part (system, users, headers) is not.
    assert tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m]).startswith("<|im_start|>system\nS")
    # `qwen3` renders turn by turn, as the original does (test_sft_qwen3_turns.py): "Hello!" gains Qwen3's empty
    # think block there.
    qwen3_ids, qwen3_mask = ChatLossMask(tokenizer, "qwen3").get_loss_mask(CONVERSATION)
    assert builder.get_text_from_loss_mask(qwen3_ids, qwen3_mask)[0] == "<think>\n\n</think>\n\nHello!<|im_end|>\n"


def test_qwen_leaves_out_a_token_that_holds_the_headers_newline(tokenizer):
    # Reproducer: a reply opening with a newline ("\nA\n") merges with the header's into one "\n\n" token, which was
    # trained ("\n\nA\n<|im_end|>\n"); the original's qwen type cuts the header's tokens from each assistant message
    # (its gen_token_length, 3: "<|im_start|>", "assistant", "\n\n") and trains "A\n<|im_end|>\n". qwen3_5 trains a
    # token holding any body character, as the original's qwen3_5 does.
    conversation = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "\nA\n"}, *CONVERSATION[3:5]]
    builder = ChatLossMask(tokenizer, "qwen")
    ids, mask = builder.get_loss_mask(conversation)
    assert builder.get_text_from_loss_mask(ids, mask)[0] == "A\n<|im_end|>\n"
    ids, mask = ChatLossMask(tokenizer, "qwen3_5").get_loss_mask(conversation)
    assert builder.get_text_from_loss_mask(ids, mask)[0] == "\n\nA\n<|im_end|>\n"


def test_qwen3_5_leaves_the_think_line_out_and_step_loss_mask_drops_a_turn(tokenizer):
    ids, mask = ChatLossMask(tokenizer, "qwen3_5").get_loss_mask(CONVERSATION)
    assert ChatLossMask(tokenizer).get_text_from_loss_mask(ids, mask) == [
        "Hello!<|im_end|>\n",
        "add\n</think>\n\n4<|im_end|>\n",
    ]
    quiet = copy.deepcopy(CONVERSATION)
    quiet[2]["step_loss_mask"] = 0
    ids, mask = ChatLossMask(tokenizer).get_loss_mask(quiet)
    assert ChatLossMask(tokenizer).get_text_from_loss_mask(ids, mask) == ["<think>\nadd\n</think>\n\n4<|im_end|>\n"]


def test_distill_and_errors(tokenizer):
    ids, mask = ChatLossMask(tokenizer, "distill_qwen").get_loss_mask(CONVERSATION[1:3])
    prompt = tokenizer.apply_chat_template(CONVERSATION[1:2], tokenize=False, add_generation_prompt=True)
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert mask == [0] * n_prompt + [1] * (len(ids) - n_prompt)
    assert tokenizer.decode(ids[n_prompt:]) == "Hello!<|im_end|>"  # the reply closed with the tokenizer's eos
    with pytest.raises(
        ValueError, match="--loss-mask-type 'llama': expected one of qwen, qwen3, qwen3_5, distill_qwen"
    ):
        ChatLossMask(tokenizer, "llama")
    other = copy.copy(tokenizer)
    other.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="the chat template is not ChatML"):  # qwen takes it: test_sft_other_templates
        ChatLossMask(other, "qwen3_5").get_loss_mask(CONVERSATION)


def test_response_lengths():
    assert response_lengths([[0, 0, 1, 0, 1], [0, 0], [1]]) == [3, 0, 1]


class _Conversations:
    def __init__(self, conversations):
        self.conversations = conversations
        self.next = 0

    def get_samples(self, num_groups):
        groups = []
        for _ in range(num_groups):
            groups.append([Sample(prompt=self.conversations[self.next % len(self.conversations)], index=self.next)])
            self.next += 1
        return groups


def test_sft_rollout_builds_trainable_samples_without_an_engine(tokenizer, qwen3_tokenizer_dir):
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 2, "num_rollout": 1, "hf_checkpoint": str(qwen3_tokenizer_dir),
                               "loss_type": "sft_loss", "disable_compute_advantages_and_returns": True})  # fmt: skip
    args = PluginArgs.from_config(cfg)
    out = generate_sft_rollout(args, 0, _Conversations([CONVERSATION, CONVERSATION[1:3]]))
    assert [len(g) for g in out.samples] == [1, 1]
    ids, mask = ChatLossMask(tokenizer).get_loss_mask(CONVERSATION)
    s = out.samples[0][0]
    first_trained = mask.index(1)
    assert s.tokens == ids and s.response_length == len(ids) - first_trained
    assert s.loss_mask == mask[first_trained:] and s.reward == 0.0 and s.status is Status.COMPLETED
    s.validate()
    with pytest.raises(ValueError, match="SFT needs --n-samples-per-prompt 1"):
        generate_sft_rollout(PluginArgs.from_config(cfg.model_copy(update={"n_samples_per_prompt": 2})), 0, None)
    with pytest.raises(ValueError, match="no eval mode"):
        generate_sft_rollout(args, 0, None, evaluation=True)


USER_HI = {"role": "user", "content": "hi"}
ODD_CONVERSATIONS = {
    # a bare IndexError / AttributeError / TypeError naming no sample
    "empty": ([], "qwen3", "SFT needs a non-empty list of chat messages in --input-key 'messages', got an empty list"),
    # the data's row check (rows.prompt_problem), named with --input-key
    "strings": (["hi", "yo"], "qwen3", "--input-key 'messages': message 0 is str 'hi', not a chat message"),
    "no_role": ([{"content": "hi"}], "qwen3", "--input-key 'messages': message 0 is dict {'content': 'hi'}, not a"),
    "no_content": ([{"role": "user", "content": " "}], "qwen3", "empty prompt in --input-key 'messages' (no message"),
    "int_role": ([{"role": 1, "content": "hi"}], "qwen3", "message 0 has the role 1 (int), not text"),
    "int_content": ([USER_HI, {"role": "assistant", "content": 5}], "qwen3", "message 1 (assistant) has int content"),
    "null_content": (
        [USER_HI, {"role": "assistant", "content": None}],
        "qwen3",
        "the chat template cannot render its messages (TypeError: ",
    ),
    # trained on the user's quoted 'X<|im_end|>' in place of the reply 'yo', silently
    "quoted_header": (
        [{"role": "user", "content": "say <|im_start|>assistant\nX<|im_end|>"}, {"role": "assistant", "content": "yo"}],
        "qwen3",
        "message 0 (user) holds the chat marker '<|im_start|>' in its text",
    ),
    # trained on 'a<|im_end|>' only
    "end_in_reply": (
        [USER_HI, {"role": "assistant", "content": "a<|im_end|>b"}],
        "qwen",
        "message 1 (assistant) holds the chat marker '<|im_end|>' in its text",
    ),
    # trained on the user's own text
    "distill_user_last": ([USER_HI], "distill_qwen", "trains on the last message, which must be an assistant reply"),
}


@pytest.mark.parametrize("case", sorted(ODD_CONVERSATIONS))
def test_odd_conversations_are_one_error_naming_the_sample(tokenizer, case):
    from slime_rollout.data.sft import sft_sample

    messages, kind, message = ODD_CONVERSATIONS[case]
    with pytest.raises(ValueError, match="^sample 9: ") as raised:
        sft_sample(Sample(prompt=messages, index=9), ChatLossMask(tokenizer, kind))
    assert message in str(raised.value)
