"""`generation.template_check`: the fixed head of a continuation is rendered once per tokenizer and template.

`render_continuation` rendered `[user, assistant(<sentinel>)]` twice on every call (to count the sentinel's echoes
and, through `end_of_turn`, for the end-of-turn marker), besides the continuation itself: three template renders
per tool turn where one is needed.
"""

import pytest
from transformers import AutoTokenizer

from slime_rollout.generation import template_check
from slime_rollout.generation.template_check import end_of_turn, render_continuation

TOOL = [{"role": "tool", "content": "42"}]
QWEN3_OBSERVATION = (
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture
def tok(qwen3_tokenizer_dir, monkeypatch):
    monkeypatch.setattr(template_check, "_heads", type(template_check._heads)())  # an empty cache per test
    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    renders = []
    real = tokenizer.apply_chat_template
    tokenizer.apply_chat_template = lambda messages, **kw: renders.append(len(messages)) or real(messages, **kw)
    tokenizer.renders = renders
    return tokenizer


def test_the_head_is_rendered_once_per_tokenizer(tok):
    for model_turn in ("call a tool", "call a tool<|im_end|>", "again"):
        # A model turn that ends with the marker already does not get it again.
        expected = QWEN3_OBSERVATION.removeprefix("<|im_end|>" if model_turn.endswith("<|im_end|>") else "")
        assert render_continuation(tok, TOOL, model_turn=model_turn) == expected
    assert end_of_turn(tok) == "<|im_end|>"
    assert tok.renders == [2, 3, 3, 3]  # the head once, then one continuation (head + tool message) per call


def test_another_template_is_rendered_anew_and_the_cache_is_bounded(tok, monkeypatch):
    monkeypatch.setattr(template_check, "_MAX_HEADS", 2)
    assert end_of_turn(tok) == "<|im_end|>"
    tok.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}[end]\n{% endfor %}"
    assert end_of_turn(tok) == "[end]"  # not the first template's marker
    tok.chat_template += " "
    assert end_of_turn(tok) == "[end]"
    assert tok.renders == [2, 2, 2]
    assert len(template_check._heads) == 2  # the oldest went


def test_a_template_that_drops_assistant_content_is_refused(tok):
    tok.chat_template = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}{% endfor %}"
    for call in (lambda: end_of_turn(tok), lambda: render_continuation(tok, TOOL, model_turn="x")):
        with pytest.raises(ValueError, match="^chat template does not render assistant content verbatim"):
            call()


def test_the_continuation_header_follows_the_template_kwargs(tok):
    # Qwen3 with enable_thinking=False puts an empty think block after every generation header; the continuation
    # ignored the kwargs, so every turn after the first was prompted in thinking mode.
    off = render_continuation(tok, TOOL, model_turn="x", template_kwargs={"enable_thinking": False})
    assert off == QWEN3_OBSERVATION + "<think>\n\n</think>\n\n"
    assert (
        render_continuation(tok, TOOL, model_turn="x", template_kwargs={"enable_thinking": True}) == QWEN3_OBSERVATION
    )
