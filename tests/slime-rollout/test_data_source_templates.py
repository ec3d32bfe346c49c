"""Data source: chat-template rendering of message prompts (tool messages, content parts, messages stored as JSON
text), with the real Qwen3 tokenizer (the rest: test_data_source.py)."""

import json

import pytest
from slime_data_source_helpers import _write_jsonl

from slime_rollout.data.source import load_prompt_rows


def test_a_tool_message_the_template_writes_as_json_is_not_left_out(tmp_path, qwen3_tokenizer_dir):
    # Reproducer: Llama 3.1's template writes a tool message as `content | tojson` (a string is iterable in Jinja);
    # a tool output with a newline or a quote was refused "the chat template left out message 2 (role 'tool'): ...
    # rename the role", though it was there, escaped.
    import copy

    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    tok = copy.copy(get_tokenizer(str(qwen3_tokenizer_dir)))
    tok.chat_template = (  # renders user, assistant and tool messages only
        "{% for m in messages %}{% if m.role == 'tool' and m.content is iterable %}<tool>{{ m.content | tojson }}"
        "{% elif m.role in ['user', 'assistant'] %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}<assistant>"
    )
    history = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "calling"}]

    def render(name, last):
        spec = _write_jsonl(tmp_path / name, [{"q": [*history, last]}])
        return rows_to_samples(
            load_prompt_rows(spec), source=spec, input_key="q", tokenizer=tok, apply_chat_template=True
        )

    (sample,) = render("d.jsonl", {"role": "tool", "content": 'line 1\n"sunny" é'})
    assert sample.prompt == '<user>weather?<assistant>calling<tool>"line 1\\n\\"sunny\\" é"<assistant>'
    # A role the template does not render at all is still refused.
    with pytest.raises(ValueError, match=r"e.jsonl line 1: the chat template left out message 2 \(role 'obs'\)"):
        render("e.jsonl", {"role": "obs", "content": "x y"})


_PRINTS_CONTENT = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)
_STRING_CONTENT_ONLY = (
    "{% for m in messages %}[{{ m['role'] }}] {% if m['content'] is string %}{{ m['content'] }}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        # Was the prompt "[user] [{'type': 'text', 'text': 'What is 2+2?'}]\n[assistant] ", silently.
        (_PRINTS_CONTENT, r"d.jsonl line 1: the chat template \(--apply-chat-template\) wrote message 0's content "
                          r"parts \(\{'type': 'text', \.\.\.\}\) as Python text"),
        # Was the prompt "[user] \n[assistant] ": the question was gone.
        (_STRING_CONTENT_ONLY, r"d.jsonl line 1: the chat template left out message 0 \(role 'user'\): its content is "
                               r"a list of parts, which this template does not render as text"),
    ],
)  # fmt: skip
def test_content_parts_a_text_template_does_not_render_are_named(tmp_path, qwen3_tokenizer_dir, template, message):
    # OpenAI-format rows give a message's content as parts; a text model's template reads content as a string.
    import copy

    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    parts = [{"type": "text", "text": "What is 2+2?"}]
    spec = _write_jsonl(tmp_path / "d.jsonl", [{"q": [{"role": "user", "content": parts}]}])
    tok = copy.copy(get_tokenizer(str(qwen3_tokenizer_dir)))
    tok.chat_template = template
    with pytest.raises(ValueError, match=message):
        rows_to_samples(load_prompt_rows(spec), source=spec, input_key="q", tokenizer=tok, apply_chat_template=True)
    # The same text as a string renders, with either template.
    spec = _write_jsonl(tmp_path / "d.jsonl", [{"q": [{"role": "user", "content": "What is 2+2?"}]}])
    (sample,) = rows_to_samples(load_prompt_rows(spec), source=spec, input_key="q", tokenizer=tok,
                                apply_chat_template=True)  # fmt: skip
    assert sample.prompt.startswith("[user] What is 2+2?") and sample.prompt.endswith("[assistant] ")


def test_messages_stored_as_json_text_are_read_as_messages(tmp_path, qwen3_tokenizer_dir, caplog):
    # A CSV export or a stringified Parquet column holds the messages as JSON text; read as text, the model's user
    # turn was '[{"role": "system", ...}, ...]' itself (the system prompt inside a user turn, no chat structure).
    import logging

    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    rows = [
        {"q": json.dumps(messages), "a": "4"},
        {"q": "Parse this: [1, 2]", "a": "ok"},  # text that merely holds JSON stays text
        {"q": '[{"role": "user"}]', "a": "x"},  # no content: not messages, kept as its text
    ]
    spec = _write_jsonl(tmp_path / "d.jsonl", rows)
    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    with caplog.at_level(logging.INFO, logger="slime_rollout.data"):
        samples = rows_to_samples(load_prompt_rows(spec), source=spec, input_key="q", label_key="a", tokenizer=tok,
                                  apply_chat_template=True)  # fmt: skip
    assert samples[0].prompt == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert samples[0].prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "Parse this: [1, 2]" in samples[1].prompt and '[{"role": "user"}]' in samples[2].prompt
    assert (
        f"{spec}: 1 of 3 --input-key prompts were JSON text of chat messages, read as the messages (first at line 1)"
        in caplog.text
    )


_LLAMA3 = (  # Meta-Llama-3-8B-Instruct's chat template
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.mark.parametrize("template", ["qwen3", "llama3"])
def test_a_prompt_rendered_already_is_refused_with_apply_chat_template(tmp_path, qwen3_tokenizer_dir, template):
    # Reproducer: a prompt file of templated text with --apply-chat-template was wrapped a second time, silently:
    # Qwen3's prompt became '<|im_start|>user\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n
    # <|im_end|>\n<|im_start|>assistant\n', Llama 3's began with two <|begin_of_text|> (BOS twice); as the original.
    import copy

    from slime_rollout.data.source import encode_prompt, get_tokenizer, rows_to_samples

    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    if template == "llama3":
        tok = copy.deepcopy(tok)
        headers = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "additional_special_tokens": headers})
        tok.chat_template = _LLAMA3
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    marker = "<|im_start|>" if template == "qwen3" else "<|begin_of_text|>"
    spec = _write_jsonl(tmp_path / "d.jsonl", [{"q": "2+2?"}, {"q": rendered}])

    def read(flag):
        return rows_to_samples(load_prompt_rows(spec), source=spec, input_key="q", tokenizer=tok,
                               apply_chat_template=flag)  # fmt: skip

    with pytest.raises(ValueError, match=rf"d.jsonl line 2: message 0 \(role 'user'\) holds '{marker}', a marker the "
                                         r"chat template writes itself: the text is rendered already, and "
                                         r"--apply-chat-template renders it again"):  # fmt: skip
        read(True)
    # Without the flag the rendered text is the prompt as it is: one BOS (the template's; none added on encoding).
    samples = read(False)
    assert samples[1].prompt == rendered
    ids = encode_prompt(tok, samples[1].prompt)
    assert ids == tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                          return_dict=False)  # fmt: skip
    if template == "llama3":
        assert ids.count(tok.bos_token_id) == 1
    # Messages holding the markers without the flag (the default generate renders them) are refused too.
    spec = _write_jsonl(tmp_path / "m.jsonl", [{"q": [{"role": "user", "content": rendered}]}])
    with pytest.raises(ValueError, match=rf"m.jsonl line 1: message 0 \(role 'user'\) holds '{marker}'"):
        read(False)
