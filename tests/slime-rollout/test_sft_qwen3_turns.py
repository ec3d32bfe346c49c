"""`--loss-mask-type qwen3` renders turn by turn, as the original's `gen_multi_turn_loss_mask_qwen3` does.

Qwen3's chat template keeps an assistant turn's `<think>` block only after the last user message: one rendering of
the whole conversation dropped the reasoning of every earlier turn from the SFT data (reproducer: two turns with
reasoning trained on `A1<|im_end|>` without `R1`). The expected values come from `_original_qwen3`, the original's
algorithm on token ids, written out here.
"""

import pytest

from slime_core.sample import Sample
from slime_rollout.data.sft import ChatLossMask, sft_sample
from slime_rollout.data.source import get_tokenizer

TWO_THINKING_TURNS = [
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"},
]
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "adds", "parameters": {"type": "object"}}}]
AGENT_TURNS = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "2+2 and 3+3?"},
    {"role": "assistant", "content": "<think>\nuse the tool\n</think>\n\ncalling", "step_loss_mask": 1},
    {"role": "tool", "content": "4"},
    {"role": "tool", "content": "6"},
    {"role": "assistant", "content": "no thinking here"},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "content": "<think>\nbye\n</think>\n\nbye", "step_loss_mask": 0},
]


@pytest.fixture(scope="module")
def tokenizer(qwen3_tokenizer_dir):
    return get_tokenizer(str(qwen3_tokenizer_dir))


def _original_qwen3(tokenizer, messages, tools=None):
    """The original's qwen3 mask on token ids: each turn tokenized with a fixed user turn, whose tokens are cut.

    Qwen3's template has no default system prompt, so the original's `system_message_length` is 0; its
    `gen_token_length` is the tokens `add_generation_prompt` adds (`<|im_start|>assistant\\n`).
    """
    anchor = [{"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}]
    anchor_ids = tokenizer.apply_chat_template(anchor, tokenize=True, return_dict=False)
    plain = tokenizer.apply_chat_template(anchor, tokenize=True, return_dict=False, add_generation_prompt=True)
    header = len(plain) - len(anchor_ids)
    ids, mask, i = [], [], 0
    while i < len(messages):
        end = i + 1
        while messages[i]["role"] == "tool" and end < len(messages) and messages[end]["role"] == "tool":
            end += 1
        turn = messages[i:end]
        if i == 0:
            turn_ids = tokenizer.apply_chat_template(turn + anchor, tokenize=True, tools=tools, return_dict=False)
            turn_ids = turn_ids[: -len(anchor_ids)]
        else:
            turn_ids = tokenizer.apply_chat_template(anchor + turn, tokenize=True, return_dict=False)[len(anchor_ids) :]
        trained = messages[i]["role"] == "assistant" and messages[i].get("step_loss_mask", 1) == 1
        mask += [0] * header + [1] * (len(turn_ids) - header) if trained else [0] * len(turn_ids)
        ids += turn_ids
        i = end
    return ids, mask


def test_every_turn_keeps_its_reasoning(tokenizer):
    builder = ChatLossMask(tokenizer, "qwen3")
    ids, mask = builder.get_loss_mask(TWO_THINKING_TURNS)
    # Before: ['A1<|im_end|>\n', '<think>\nR2\n</think>\n\nA2<|im_end|>\n'] (R1 left out of the data).
    assert builder.get_text_from_loss_mask(ids, mask) == [
        "<think>\nR1\n</think>\n\nA1<|im_end|>\n",
        "<think>\nR2\n</think>\n\nA2<|im_end|>\n",
    ]
    assert (ids, mask) == _original_qwen3(tokenizer, TWO_THINKING_TURNS)
    # `qwen` (Qwen2.5's format) renders the conversation once, as the original's qwen type gives for it.
    qwen_ids, qwen_mask = ChatLossMask(tokenizer, "qwen").get_loss_mask(TWO_THINKING_TURNS)
    assert ChatLossMask(tokenizer).get_text_from_loss_mask(qwen_ids, qwen_mask)[0] == "A1<|im_end|>\n"


def test_tools_tool_runs_step_loss_mask_and_turns_without_reasoning_match_the_original(tokenizer):
    builder = ChatLossMask(tokenizer, "qwen3")
    ids, mask = builder.get_loss_mask(AGENT_TURNS, tools=TOOLS)
    assert (ids, mask) == _original_qwen3(tokenizer, AGENT_TURNS, tools=TOOLS)
    assert builder.get_text_from_loss_mask(ids, mask) == [
        "<think>\nuse the tool\n</think>\n\ncalling<|im_end|>\n",
        "<think>\n\n</think>\n\nno thinking here<|im_end|>\n",  # Qwen3's empty block, as the original trains it
    ]
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nS\n\n# Tools") and '"name": "calc"' in text
    responses = "<tool_response>\n4\n</tool_response>\n<tool_response>\n6\n</tool_response>"
    assert f"<|im_start|>user\n{responses}<|im_end|>" in text  # the two tool messages as one turn
    assert text.endswith("<|im_start|>assistant\n<think>\nbye\n</think>\n\nbye<|im_end|>\n")  # kept, not trained


@pytest.fixture(scope="module")
def thinking_tokenizer(qwen3_tokenizer_dir):
    """The Qwen3 tokenizer with a thinking-only template (as Qwen3-*-Thinking-2507's): its generation prompt opens
    the reasoning, `<|im_start|>assistant\\n<think>\\n`; the turns render as the fixture's."""
    import copy

    tokenizer = copy.copy(get_tokenizer(str(qwen3_tokenizer_dir)))
    hybrid = "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}"
    assert tokenizer.chat_template.count(hybrid) == 1
    tokenizer.chat_template = tokenizer.chat_template.replace(
        hybrid, "{{- '<|im_start|>assistant\\n<think>\\n' }}\n    {%- if false %}"
    )
    return tokenizer


def test_a_thinking_only_template_trains_each_turn_after_its_generation_prompt(thinking_tokenizer):
    # Reproducer: with a template whose generation prompt ends in `<think>\n` (the model is given it and never
    # writes it), each turn was trained from `<think>\n` on; the original cuts the generation prompt's tokens
    # (`gen_token_length`, 5 here), so the empty block's `\n\n` token, which holds the prompt's last newline, is
    # cut too.
    builder = ChatLossMask(thinking_tokenizer, "qwen3")
    prompted = thinking_tokenizer.apply_chat_template(AGENT_TURNS[:2], tokenize=False, add_generation_prompt=True)
    assert prompted.endswith("<|im_start|>assistant\n<think>\n")
    ids, mask = builder.get_loss_mask(TWO_THINKING_TURNS)
    assert builder.get_text_from_loss_mask(ids, mask) == [
        "R1\n</think>\n\nA1<|im_end|>\n",
        "R2\n</think>\n\nA2<|im_end|>\n",
    ]
    assert (ids, mask) == _original_qwen3(thinking_tokenizer, TWO_THINKING_TURNS)
    ids, mask = builder.get_loss_mask(AGENT_TURNS, tools=TOOLS)
    assert (ids, mask) == _original_qwen3(thinking_tokenizer, AGENT_TURNS, tools=TOOLS)
    assert builder.get_text_from_loss_mask(ids, mask) == [
        "use the tool\n</think>\n\ncalling<|im_end|>\n",
        "</think>\n\nno thinking here<|im_end|>\n",
    ]


def test_a_template_that_is_not_qwen3s_is_one_error(tokenizer):
    import copy

    other = copy.copy(tokenizer)
    other.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match=r"--loss-mask-type qwen3: message 1 \(assistant\) does not render as"):
        ChatLossMask(other, "qwen3").get_loss_mask(TWO_THINKING_TURNS)
    # The SFT rollout names the sample (was the bare message above).
    with pytest.raises(ValueError, match=r"^sample 5: --loss-mask-type qwen3: message 1 \(assistant\)"):
        sft_sample(Sample(prompt=TWO_THINKING_TURNS, index=5), ChatLossMask(other, "qwen3"))


def test_samples_longer_than_the_models_context_are_counted_and_named(tmp_path, qwen3_tokenizer_dir, caplog):
    # Reproducer: the data's default length limit measures one rendering of the conversation, which drops the earlier
    # reasoning qwen3 trains on: a kept conversation outgrew the model's positions without a word.
    import json
    import shutil

    from slime_core.config import PluginArgs, SlimeArgs
    from slime_rollout.data.sft import generate_sft_rollout

    model = tmp_path / "model"
    shutil.copytree(qwen3_tokenizer_dir, model)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 48}))
    reasoning = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\n" + "long reasoning " * 10 + "\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]

    class Conversations:
        def get_samples(self, num_groups):
            return [[Sample(prompt=p, index=i)] for i, p in enumerate([reasoning, reasoning[2:]][:num_groups])]

    cfg = SlimeArgs.from_dict({"rollout_batch_size": 2, "num_rollout": 1, "hf_checkpoint": str(model),
                               "loss_type": "sft_loss", "disable_compute_advantages_and_returns": True,
                               "loss_mask_type": "qwen3"})  # fmt: skip
    out = generate_sft_rollout(PluginArgs.from_config(cfg), 0, Conversations())
    lengths = [len(g[0].tokens) for g in out.samples]
    assert lengths[0] > 48 >= lengths[1]
    whole = get_tokenizer(str(model)).apply_chat_template(reasoning, tokenize=True, add_generation_prompt=True)
    assert len(whole) <= 47  # the rendering the data's default limit (context - 1) measures: kept
    assert out.metrics["rollout/sft/num_over_context"] == 1.0
    assert "1 of 2 samples are longer than the model's context (max_position_embeddings 48 of --hf-checkpoint; " \
        "samples 0)" in caplog.text  # fmt: skip


def test_a_first_assistant_turn_with_tools_trains_the_reply_not_the_tools_block(tokenizer):
    # Was "message 0 (assistant) does not render as '<|im_start|>assistant\n...'; the chat template is not ChatML"
    # (the template is; the tools' system block comes first). The original trained that block as the reply.
    conversation = [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "Q"},
                    {"role": "assistant", "content": "A"}]  # fmt: skip
    builder = ChatLossMask(tokenizer, "qwen3")
    ids, mask = builder.get_loss_mask(conversation, tools=TOOLS)
    assert builder.get_text_from_loss_mask(ids, mask) == [
        "hello<|im_end|>\n", "<think>\n\n</think>\n\nA<|im_end|>\n"
    ]  # fmt: skip
    original_ids, original_mask = _original_qwen3(tokenizer, conversation, TOOLS)
    assert ids == original_ids  # the same tokens; only the mask of the tools block differs
    block = original_mask.index(1)
    assert tokenizer.decode(ids[block : mask.index(1)]).startswith("# Tools\n")
