"""`generation.template_check`: the fixed head of a continuation is rendered once per tokenizer and template.

`render_continuation` rendered `[user, assistant(<sentinel>)]` twice on every call (to count the sentinel's echoes
and, through `end_of_turn`, for the end-of-turn marker), besides the continuation itself: three template renders
per tool turn where one is needed.
"""

import pytest
from transformers import AutoTokenizer

from slime_core.sample import Sample, Status
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
    # The head once (with its user turn alone, prompted), then one continuation (head + tool message) per call.
    assert tok.renders == [2, 1, 3, 3, 3]


def test_another_template_is_rendered_anew_and_the_cache_is_bounded(tok, monkeypatch):
    monkeypatch.setattr(template_check, "_MAX_HEADS", 2)
    assert end_of_turn(tok) == "<|im_end|>"
    tok.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}[end]\n{% endfor %}"
    assert end_of_turn(tok) == "[end]"  # not the first template's marker
    tok.chat_template += " "
    assert end_of_turn(tok) == "[end]"
    assert tok.renders == [2, 1] * 3
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


_GLM4 = (  # GLM-4's layout: a role token opens each turn, none closes one; the model stops on the next role token
    "[gMASK]<sop>{% for m in messages %}{% if m['role'] == 'tool' %}<|observation|>\n{{ m['content'] }}{% else %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_role_token_the_model_stopped_on_is_not_repeated(qwen3_tokenizer_dir, monkeypatch):
    # Reproducer: a GLM-4 model ends a tool-calling turn with <|observation|> (a stop id of its generation config);
    # the observation rendered after it began with <|observation|> again, so the trained stream held
    # 'call<|observation|><|observation|>\n42<|assistant|>' where the template renders 'call<|observation|>\n42...'.
    monkeypatch.setattr(template_check, "_heads", type(template_check._heads)())
    tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": ["[gMASK]", "<sop>", "<|user|>", "<|assistant|>",
                                                          "<|observation|>"]})  # fmt: skip
    tok.chat_template = _GLM4
    assert render_continuation(tok, TOOL, model_turn="call<|observation|>") == "\n42<|assistant|>"
    # A turn that stopped otherwise (its budget) gets the header.
    assert render_continuation(tok, TOOL, model_turn="call") == "<|observation|>\n42<|assistant|>"
    # The token stream (prompt, model turn, observation) is the template's tokenization of the conversation.
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call"}, *TOOL]
    prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, return_dict=False)
    turn = tok.encode("\ncall<|observation|>", add_special_tokens=False)
    observation = tok.encode(render_continuation(tok, TOOL, model_turn=tok.decode(turn)), add_special_tokens=False)
    assert prompt + turn + observation == tok.apply_chat_template(messages, add_generation_prompt=True,
                                                                   return_dict=False)  # fmt: skip
    # The in-loop check (--check-chat-template-samples) agrees: it renders the model turn without the shared token.
    last = tok.encode("\nIt is 42.<|user|>", add_special_tokens=False)  # the episode's last turn, stopped on <|user|>
    sample = Sample(prompt=messages[:1], tokens=prompt + turn + observation + last, status=Status.COMPLETED)
    sample.response_length = len(turn) + len(observation) + len(last)
    template_check.record_segment(sample, "assistant", tok.decode(turn))
    template_check.record_segment(sample, "observation", tok.decode(observation), tool_responses=["42"])
    template_check.record_segment(sample, "assistant", tok.decode(last))
    report = template_check.check_sample(tok, sample)
    assert report.consistent, report.message


_LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                   "<|python_tag|>"]  # fmt: skip
BUILTIN = {"builtin_tools": ["brave_search", "wolfram_alpha"]}


@pytest.fixture
def llama31(qwen3_tokenizer_dir, monkeypatch):
    """The Qwen3 fixture tokenizer with Llama 3's special tokens and Llama 3.1's own chat template."""
    monkeypatch.setattr(template_check, "_heads", type(template_check._heads)())
    tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": _LLAMA_SPECIALS})
    tok.bos_token = "<|begin_of_text|>"
    tok.chat_template = (qwen3_tokenizer_dir.parent / "llama3.1-chat-template" / "chat_template.jinja").read_text()
    return tok


def test_a_llama_built_in_tool_call_ending_in_eom_gets_no_eot(llama31):
    # Reproducer: Llama 3.1 ends a built-in tool call with <|eom_id|> and its template opens the ipython turn right
    # after it; the observation began with <|eot_id|>, so the trained stream held '...<|eom_id|><|eot_id|><|start_
    # header_id|>ipython' where the template renders '...<|eom_id|><|start_header_id|>ipython'.
    tok = llama31
    call = {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "x"}}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]},
                {"role": "ipython", "content": "42"}]  # fmt: skip
    observation_text = (
        '<|start_header_id|>ipython<|end_header_id|>\n\n"42"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
    )
    turn_text = '<|python_tag|>brave_search.call(query="x")<|eom_id|>'
    assert render_continuation(tok, messages[2:], model_turn=turn_text, template_kwargs=BUILTIN) == observation_text
    # Token for token: prompt + model turn + observation is the template's rendering of the conversation.
    prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, return_dict=False, **BUILTIN)
    turn = tok.encode(turn_text, add_special_tokens=False)
    observation = tok.encode(
        render_continuation(tok, messages[2:], model_turn=tok.decode(turn), template_kwargs=BUILTIN),
        add_special_tokens=False,
    )
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **BUILTIN)
    assert prompt + turn + observation == expected
    # A turn the model closed with <|eot_id|> gets none again; one its budget cut gets it.
    assert (
        render_continuation(tok, messages[2:], model_turn="hi<|eot_id|>", template_kwargs=BUILTIN) == observation_text
    )
    cut = render_continuation(tok, messages[2:], model_turn="hi", template_kwargs=BUILTIN)
    assert cut == "<|eot_id|>" + observation_text


def test_eom_keeps_the_eot_where_the_template_never_writes_eom(llama31):
    # Llama 3.0's template closes every message with <|eot_id|>: an <|eom_id|> in a turn is content it closes too.
    tok = llama31
    tok.chat_template = tok.chat_template.replace('{{- "<|eom_id|>" }}', '{{- "<|eot_id|>" }}')
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call<|eom_id|>"},
                {"role": "ipython", "content": "42"}]  # fmt: skip
    observation = render_continuation(tok, messages[2:], model_turn="call<|eom_id|>")
    assert observation.startswith("<|eot_id|><|start_header_id|>ipython<|end_header_id|>")
    prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
    assert prompt + "call<|eom_id|>" + observation == tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


def test_the_in_loop_check_compares_an_eom_episode_as_text(llama31):
    # Rendered as a plain assistant message, the eom turn would be closed twice ('<|eom_id|><|eot_id|>'): the check
    # compares the concatenated text instead of reporting a mismatch on every built-in tool episode.
    tok = llama31
    prompt_messages = [{"role": "user", "content": "q"}]
    prompt = tok.apply_chat_template(prompt_messages, add_generation_prompt=True, return_dict=False)
    turn = tok.encode('<|python_tag|>brave_search.call(query="x")<|eom_id|>', add_special_tokens=False)
    observation = tok.encode(render_continuation(tok, TOOL, model_turn=tok.decode(turn)), add_special_tokens=False)
    last = tok.encode("It is 42.<|eot_id|>", add_special_tokens=False)
    sample = Sample(prompt=prompt_messages, tokens=prompt + turn + observation + last, status=Status.COMPLETED)
    sample.response_length = len(turn) + len(observation) + len(last)
    template_check.record_segment(sample, "assistant", tok.decode(turn))
    template_check.record_segment(sample, "observation", tok.decode(observation), tool_responses=["42"])
    template_check.record_segment(sample, "assistant", tok.decode(last))
    report = template_check.check_sample(tok, sample)
    assert report.consistent and report.message == "concatenated text: token stream matches re-tokenization"


def test_a_marker_the_template_writes_before_its_eot_keeps_the_eot(llama31):
    # A template that closes a tool call with its own token and then the end-of-turn marker (as DeepSeek-V3's
    # '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'): a turn stopped on that token still gets the marker.
    tok = llama31
    tok.chat_template = tok.chat_template.replace('{{- "<|eom_id|>" }}', '{{- "<|eom_id|><|eot_id|>" }}')
    call = {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "x"}}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]},
                {"role": "ipython", "content": "42"}]  # fmt: skip
    turn = '<|python_tag|>brave_search.call(query="x")<|eom_id|>'
    observation = render_continuation(tok, messages[2:], model_turn=turn, template_kwargs=BUILTIN)
    prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False, **BUILTIN)
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **BUILTIN)
    assert observation.startswith("<|eot_id|><|start_header_id|>ipython")
    assert prompt + turn + observation == expected
