"""Data source: JSONL/Parquet, keys, chat template (real Qwen3 tokenizer; message rendering:
test_data_source_templates.py), filtering (shuffling and the cursor: test_data_source_cursor.py)."""

import json
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from slime_data_source_helpers import ROWS, _args, _write_jsonl

from slime_rollout.data.source import RolloutDataSource, RolloutDataSourceWithBuffer, load_prompt_rows


def test_jsonl_and_parquet_give_same_samples(tmp_path):
    jsonl = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    for path in (jsonl, str(parquet)):
        ds = RolloutDataSource(_args(prompt_data=path))
        assert len(ds) == 5
        groups = ds.get_samples(2)
        assert [[s.prompt for s in g] for g in groups] == [["q0", "q0"], ["q1", "q1"]]
        assert [[s.label for s in g] for g in groups] == [["0", "0"], ["1", "1"]]
        assert [[(s.group_index, s.index) for s in g] for g in groups] == [[(0, 0), (0, 1)], [(1, 2), (1, 3)]]
        assert groups[1][0].metadata == {"k": 1}
        # Copies are independent.
        groups[0][0].metadata["x"] = 1
        assert "x" not in groups[0][1].metadata


def test_slicing_and_real_gsm8k(fixtures_dir, tmp_path):
    path = fixtures_dir / "gsm8k" / "test-50.jsonl"
    assert len(load_prompt_rows(str(path))) == 50
    assert load_prompt_rows(f"{path}@[2:5]") == load_prompt_rows(str(path))[2:5]
    assert load_prompt_rows(f"{path}@[-3:]") == load_prompt_rows(str(path))[-3:]
    ds = RolloutDataSource(_args(prompt_data=f"{path}@[:4]", n_samples_per_prompt=1))
    assert len(ds) == 4
    assert ds.get_samples(1)[0][0].prompt.startswith("Janet")


def test_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a"}\n\n{"question": oops}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: invalid JSON"):
        load_prompt_rows(str(path))
    with pytest.raises(ValueError, match="unsupported format"):
        load_prompt_rows(str(_write_jsonl(tmp_path / "x.json", [])))
    with pytest.raises(ValueError, match="--input-key 'prompt'"):
        RolloutDataSource(_args(prompt_data=_write_jsonl(tmp_path / "d.jsonl", ROWS), input_key="prompt"))


def test_a_folder_or_a_device_as_prompt_data_is_one_error(tmp_path):
    # A folder said "[Errno 21] Is a directory", naming no flag; a link to /dev/zero was read until MemoryError.
    (tmp_path / "rows.jsonl").mkdir()
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'rows.jsonl'))}: a folder; give a \.jsonl"):
        load_prompt_rows(str(tmp_path / "rows.jsonl"))
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match=r"zero\.jsonl: not a regular file; give a \.jsonl or \.parquet file"):
        load_prompt_rows(str(tmp_path / "zero.jsonl"))


def test_chat_template_with_tools_and_kwargs(tmp_path, qwen3_tokenizer_dir):
    tool = {"type": "function", "function": {"name": "calc", "description": "calculator", "parameters": {}}}
    rows = [
        {"question": "What is 2+2?", "answer": "4", "tools": json.dumps([tool])},
        {"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "answer": "x"},
    ]
    args = _args(
        prompt_data=_write_jsonl(tmp_path / "d.jsonl", rows),
        apply_chat_template=True,
        hf_checkpoint=str(qwen3_tokenizer_dir),
        n_samples_per_prompt=1,
    )
    ds = RolloutDataSource(args)
    (s0,), (s1,) = ds.get_samples(2)
    assert s0.metadata["tools"] == [tool]
    assert s0.prompt.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "calc"' in s0.prompt
    assert s0.prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert (
        s1.prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    args.apply_chat_template_kwargs = {"enable_thinking": False}
    (s0,), _ = RolloutDataSource(args).get_samples(2)
    assert s0.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_max_prompt_len_filter_preserves_order(tmp_path, qwen3_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    rows = [{"question": q, "answer": "0"} for q in ["short", "a much much much longer prompt text here", "tiny", "x"]]
    lengths = [len(tok.encode(r["question"], add_special_tokens=False)) for r in rows]
    limit = max(lengths[0], lengths[2], lengths[3])
    assert lengths[1] > limit
    args = _args(
        prompt_data=_write_jsonl(tmp_path / "d.jsonl", rows),
        rollout_max_prompt_len=limit,
        hf_checkpoint=str(qwen3_tokenizer_dir),
        n_samples_per_prompt=1,
    )
    ds = RolloutDataSource(args)
    assert [g[0].prompt for g in ds.get_samples(3)] == ["short", "tiny", "x"]


def test_huge_line_is_dropped_by_length_without_tokenizing(tmp_path, qwen3_tokenizer_dir, monkeypatch, caplog):
    # Issue 17: a 50 MB line was tokenized whole (~290 MB of memory per MB) only to be dropped. Now a prompt longer
    # than limit × (longest vocabulary entry) characters is refused by its length; the rest are tokenized.
    from slime_rollout.data import source as data_source

    tok = data_source.get_tokenizer(str(qwen3_tokenizer_dir))
    encoded = []
    real_encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text, **kw: encoded.append(len(text)) or real_encode(text, **kw))
    huge = "word " * 2_000_000  # 10 MB
    rows = [{"question": q, "answer": str(i + 1)} for i, q in enumerate(["short", huge, "tiny"])]
    args = _args(
        prompt_data=_write_jsonl(tmp_path / "d.jsonl", rows),
        rollout_max_prompt_len=64,
        hf_checkpoint=str(qwen3_tokenizer_dir),
        n_samples_per_prompt=1,
    )
    with caplog.at_level("WARNING"):
        ds = RolloutDataSource(args)
    assert [g[0].label for g in ds.get_samples(2)] == ["1", "3"]
    assert max(encoded, default=0) < 100  # the 10 MB prompt never reached the tokenizer (short ones need not)
    assert "dropped 1 of 3 prompts longer than --rollout-max-prompt-len=64 tokens" in caplog.text


def test_message_prompts_are_measured_as_the_engine_gets_them(tmp_path, qwen3_tokenizer_dir):
    # Without --apply-chat-template the generate function applies the template (generation prompt on, tools):
    # the filter counts the same tokens.
    from slime_rollout.data.source import encode_prompt, get_tokenizer

    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    messages = [{"role": "user", "content": "hi"}]
    n = len(encode_prompt(tok, messages))
    assert n > len(tok.encode("hi", add_special_tokens=False)) + 3  # the template's tokens count
    rows = [{"question": messages, "answer": "1"}]
    for limit, kept in ((n, 1), (n - 1, 0)):
        args = _args(
            prompt_data=_write_jsonl(tmp_path / f"m{limit}.jsonl", rows + [{"question": "x", "answer": "2"}]),
            rollout_max_prompt_len=limit,
            hf_checkpoint=str(qwen3_tokenizer_dir),
            n_samples_per_prompt=1,
        )
        assert len(RolloutDataSource(args)) == 1 + kept


@pytest.mark.parametrize("prompt", ["", "   ", None, [], [{"role": "user", "content": ""}]])
def test_empty_prompt_names_the_row(tmp_path, prompt):
    rows = [{"question": "fine", "answer": "1"}, {"question": prompt, "answer": "2"}]
    args = _args(prompt_data=_write_jsonl(tmp_path / "e.jsonl", rows))
    with pytest.raises(ValueError, match=r"e\.jsonl line 2: empty prompt in --input-key 'question'"):
        RolloutDataSource(args)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (5, r"--input-key 'question' holds int 5, not a prompt \(a string, or a list of chat messages"),
        ({"text": "hi"}, r"--input-key 'question' holds dict \{'text': 'hi'\}, not a prompt"),
        (["hi", "there"], r"--input-key 'question': message 0 is str 'hi', not a chat message"),
        ([{"content": "hi"}], r"--input-key 'question': message 0 is dict \{'content': 'hi'\}, not a chat message"),
    ],
)
def test_a_prompt_that_is_neither_text_nor_chat_messages_names_the_row(tmp_path, prompt, message):
    # A number or a dict passed as "a message list" and failed in the tokenizer mid-rollout; a list of strings was
    # reported as an empty prompt.
    rows = [{"question": "fine", "answer": "1"}, {"question": prompt, "answer": "2"}]
    args = _args(prompt_data=_write_jsonl(tmp_path / "p.jsonl", rows))
    with pytest.raises(ValueError, match=rf"p\.jsonl line 2: {message}"):
        RolloutDataSource(args)


@pytest.mark.parametrize(
    ("metadata", "shown"), [([1, 2], "list [1, 2]"), (5, "int 5"), ("[[1, 2]]", "list [[1, 2]]"), ("x", None)]
)
def test_metadata_that_is_not_a_dict_names_the_row(tmp_path, metadata, shown):
    # A list of pairs ("[[1, 2]]") became the dict {1: 2}; [1, 2] and 5 failed naming no row.
    rows = [
        {"question": "q", "answer": "1", "metadata": {"k": 1}},
        {"question": "q", "answer": "2", "metadata": metadata},
    ]
    args = _args(prompt_data=_write_jsonl(tmp_path / "m.jsonl", rows))
    expected = (
        rf"m\.jsonl line 2: --metadata-key 'metadata' must hold a dict \(or its JSON\), got {re.escape(shown)}$"
        if shown
        else r"m\.jsonl line 2: --metadata-key 'metadata' holds a string that is not valid JSON: 'x'"
    )
    with pytest.raises(ValueError, match=expected):
        RolloutDataSource(args)
    rows[1]["metadata"] = json.dumps({"k": 2})  # a JSON string of a dict is read as the dict
    args = _args(prompt_data=_write_jsonl(tmp_path / "m.jsonl", rows))
    assert [s.metadata for s in RolloutDataSource(args).prompts] == [{"k": 1}, {"k": 2}]


@pytest.mark.parametrize(("tools", "shown"), [({"name": "calc"}, "dict {'name': 'calc'}"), (["calc"], "list ['calc']")])
def test_tools_that_are_not_a_list_of_schemas_name_the_row(tmp_path, tools, shown):
    # The chat template refused them naming no row ("Tools should either be a JSON schema, ...").
    rows = [{"question": "q", "answer": "1"}, {"question": "q", "answer": "2", "tools": tools}]
    args = _args(prompt_data=_write_jsonl(tmp_path / "t.jsonl", rows))
    message = r"t\.jsonl line 2: --tool-key 'tools' must hold a list of tool schemas \(dicts\) or its JSON, got "
    with pytest.raises(ValueError, match=message + re.escape(shown) + "$"):
        RolloutDataSource(args)
    rows[1]["tools"] = json.dumps([{"type": "function", "function": {"name": "calc"}}])  # JSON of a list: fine
    args = _args(prompt_data=_write_jsonl(tmp_path / "t.jsonl", rows))
    assert RolloutDataSource(args).prompts[1].metadata["tools"] == [{"type": "function", "function": {"name": "calc"}}]


@pytest.mark.parametrize(
    "text", ['[{"type": "function", "function": {"name": "calc", "x": ' + "9" * 5000 + "}}]", "[" * 5000]
)
def test_a_tools_string_json_cannot_decode_names_the_row(tmp_path, text):
    # An integer past Python's 4,300-digit limit (a plain ValueError) or nesting past the decoder's depth
    # (RecursionError) escaped as "Exceeds the limit (4300 digits) ..." / "maximum recursion depth", naming no row.
    rows = [{"question": "q", "answer": "1"}, {"question": "q", "answer": "2", "tools": text}]
    args = _args(prompt_data=_write_jsonl(tmp_path / "t.jsonl", rows))
    with pytest.raises(ValueError, match=r"/t\.jsonl line 2: --tool-key 'tools' holds a string that is not valid JSON"):
        RolloutDataSource(args)


def test_a_json_string_that_cannot_decode_names_the_key_flag_and_column(tmp_path):
    # Reproducer: with --metadata-key extra a bad JSON string said "metadata is a string but not valid JSON",
    # naming neither the flag nor the column the run reads (nor, for --tool-key fns, "tools").
    rows = [{"question": "q", "answer": "1", "extra": "{bad", "fns": "[oops"}]
    args = _args(prompt_data=_write_jsonl(tmp_path / "k.jsonl", rows), metadata_key="extra", tool_key="fns")
    with pytest.raises(ValueError, match=r"k\.jsonl line 1: --metadata-key 'extra' holds a string that is not valid "
                                         r"JSON: '\{bad'$"):  # fmt: skip
        RolloutDataSource(args)
    rows[0]["extra"] = "{}"
    args = _args(prompt_data=_write_jsonl(tmp_path / "k.jsonl", rows), metadata_key="extra", tool_key="fns")
    with pytest.raises(ValueError, match=r"k\.jsonl line 1: --tool-key 'fns' holds a string that is not valid JSON: "):
        RolloutDataSource(args)


def test_a_prompt_that_looks_like_json_messages_but_cannot_decode_stays_text(tmp_path):
    # messages_from_json let the 4,300-digit ValueError escape: the data source failed naming no row.
    prompt = '[{"role": "user", "content": "n", "x": ' + "9" * 5000 + "}]"
    rows = [{"question": prompt, "answer": "1"}]
    assert RolloutDataSource(_args(prompt_data=_write_jsonl(tmp_path / "p.jsonl", rows))).prompts[0].prompt == prompt


def _model_dir(tmp_path, qwen3_tokenizer_dir, max_position_embeddings):
    """A checkpoint directory as the data source sees it: the real Qwen3 tokenizer and a config.json."""
    import shutil

    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_tokenizer_dir / name, model / name)
    (model / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "max_position_embeddings": max_position_embeddings})
    )
    return model


def test_prompts_longer_than_the_model_context_are_dropped_by_default(
    tmp_path, qwen3_tokenizer_dir, monkeypatch, caplog
):
    # Issue 27 #13: without --rollout-max-prompt-len a prompt longer than the model's context was kept (1-token
    # responses) and a 20 MB line went to the engine. The default limit is max_position_embeddings - 1 (64 - 1 here).
    from slime_rollout.data import source as data_source

    model = _model_dir(tmp_path, qwen3_tokenizer_dir, max_position_embeddings=64)
    tok = data_source.get_tokenizer(str(model))
    encoded = []
    real_encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text, **kw: encoded.append(len(text)) or real_encode(text, **kw))
    fits = " ".join(["one"] * 40)  # 40 tokens: kept
    over = " ".join(["one"] * 70)  # 70 tokens > 63: dropped after tokenizing
    assert (
        len(real_encode(fits, add_special_tokens=False)) == 40
        and len(real_encode(over, add_special_tokens=False)) == 70
    )
    huge = "word " * 4_000_000  # a 20 MB line
    rows = [{"question": q, "answer": str(i + 1)} for i, q in enumerate(["short", over, huge, fits, "tiny"])]
    base = dict(prompt_data=_write_jsonl(tmp_path / "d.jsonl", rows), hf_checkpoint=str(model), n_samples_per_prompt=1)
    args = _args(**base)
    assert args.rollout_max_prompt_len is None
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="slime_rollout.data"):
        ds = RolloutDataSource(args)
    elapsed = time.monotonic() - start
    assert [g[0].label for g in ds.get_samples(3)] == ["1", "4", "5"]
    assert max(encoded) < 1000  # the 20 MB prompt never reached the tokenizer
    assert elapsed < 10.0, elapsed  # reading and parsing the 20 MB line only (measured 0.19 s here)
    warnings = [r.getMessage() for r in caplog.records if r.name == "slime_rollout.data.prompt_samples"]
    assert warnings == [
        f"{tmp_path / 'd.jsonl'}: dropped 2 of 5 prompts longer than --rollout-max-prompt-len (default: the context "
        "less one token)=63 tokens (lines 2, 3)"
    ]
    # --rollout-max-context-len sets the context as in the original (limit 39 here), and the flag itself wins.
    assert len(RolloutDataSource(_args(**base, rollout_max_context_len=40))) == 2
    assert len(RolloutDataSource(_args(**base, rollout_max_prompt_len=100))) == 4


def test_no_config_json_means_no_default_limit(tmp_path, qwen3_tokenizer_dir):
    from slime_rollout.data.prompt_length import default_max_prompt_len, model_context_len

    assert model_context_len(str(qwen3_tokenizer_dir)) is None  # a tokenizer directory, no config.json
    assert default_max_prompt_len(_args(hf_checkpoint=str(qwen3_tokenizer_dir))) is None
    vlm = tmp_path / "vlm"
    vlm.mkdir()
    (vlm / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert default_max_prompt_len(_args(hf_checkpoint=str(vlm))) == 4095
    assert default_max_prompt_len(_args(hf_checkpoint=str(vlm), rollout_max_context_len=100)) == 99
    assert default_max_prompt_len(_args(hf_checkpoint=str(vlm), rollout_max_context_len=100,
                                        rollout_max_prompt_len=7)) == 7  # fmt: skip
    # The eval datasets' limit reads the eval_* flags.
    evaluation = _args(hf_checkpoint=str(vlm), rollout_max_context_len=100, eval_max_context_len=50)
    assert default_max_prompt_len(evaluation, evaluation=True) == 49 and default_max_prompt_len(evaluation) == 99


def test_dropped_and_bad_rows_are_named_by_their_place_in_the_file(tmp_path, qwen3_tokenizer_dir, caplog):
    """JSONL rows by their 1-based file line (blank lines counted, a slice not restarting the count); Parquet rows by
    their 0-based row index, the index an `@[start:end]` slice uses (issue 28)."""
    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    tok = get_tokenizer(qwen3_tokenizer_dir)
    long = "a" + " a" * 50  # 51 tokens > 20
    path = tmp_path / "blank.jsonl"
    path.write_text(json.dumps({"p": "short"}) + "\n\n\n" + json.dumps({"p": long}) + "\n" + json.dumps({"p": "ok"}))
    pq.write_table(pa.table({"p": ["short", long, long]}), tmp_path / "x.parquet")
    cases = [
        (f"{path}", "dropped 1 of 3 prompts", "(lines 4)"),
        (f"{path}@[1:]", "dropped 1 of 2 prompts", "(lines 4)"),
        (f"{tmp_path / 'x.parquet'}", "dropped 2 of 3 prompts", "(row indices 1, 2)"),
        (f"{tmp_path / 'x.parquet'}@[2:]", "dropped 1 of 1 prompts", "(row indices 2)"),
    ]
    for spec, count, where in cases:
        caplog.clear()
        with caplog.at_level("WARNING", logger="slime_rollout.data"):
            rows_to_samples(load_prompt_rows(spec), source=spec, input_key="p", tokenizer=tok, max_prompt_len=20)
        assert [r.getMessage() for r in caplog.records] == [
            f"{spec}: {count} longer than --rollout-max-prompt-len=20 tokens {where}"
        ]
    # Errors too; plain rows (not read from a file) keep their 1-based position among the rows.
    path.write_text(json.dumps({"p": "short"}) + "\n\n" + json.dumps({"q": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"blank\.jsonl@\[1:\] line 3: no --input-key 'p'"):
        rows_to_samples(load_prompt_rows(f"{path}@[1:]"), source=f"{path}@[1:]", input_key="p")
    with pytest.raises(ValueError, match=r"^mem row 2: no --input-key 'p'"):
        rows_to_samples([{"p": "x"}, {"q": "y"}], source="mem", input_key="p")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"q": "hi\\ud800", "a": "1"}',
            r"a.jsonl line 2: --input-key 'q' holds a lone surrogate '\\ud800' at character 2",
        ),
        (
            '{"q": [{"role": "user", "content": [{"type": "text", "text": "x\\udc00"}]}], "a": "1"}',
            r"a.jsonl line 2: --input-key 'q' message 0 holds a lone surrogate '\\udc00' at character 1",
        ),
    ],
)
def test_a_prompt_no_tokenizer_can_encode_names_file_and_line(tmp_path, line, message):
    # json reads a "\ud800" escape into a str no UTF-8 encoder takes: the tokenizer failed mid-rollout with
    # UnicodeEncodeError (or "TextEncodeInput must be Union[...]"), naming no file or row.
    from slime_rollout.data.source import rows_to_samples

    path = tmp_path / "a.jsonl"
    path.write_text('{"q": "fine \\ud83d\\ude00", "a": "1"}\n' + line + "\n")  # a whole pair (an emoji) is fine
    with pytest.raises(ValueError, match=message):
        rows_to_samples(load_prompt_rows(str(path)), source=str(path), input_key="q", label_key="a")


@pytest.mark.parametrize(
    ("question", "message"),
    [
        # Qwen3's template renders only the roles it knows: a ShareGPT "human" turn vanished, leaving the bare
        # generation prompt "<|im_start|>assistant\n" (the model was trained to answer no question).
        (
            [{"role": "human", "content": "What is 2+2?"}],
            r"d.jsonl line 1: the chat template left out message 0 \(role 'human'\)",
        ),
        (
            [{"role": "system", "content": "Be brief."}, {"role": "gpt", "content": "Hi"}],
            r"d.jsonl line 1: the chat template left out message 1 \(role 'gpt'\)",
        ),
        # A template that raises on a row named no file or row (jinja2's UndefinedError).
        (
            [{"role": "user", "content": [{"type": "text", "text": "parts"}]}],
            r"d.jsonl line 1: the chat template \(--apply-chat-template\) failed on this row: UndefinedError: ",
        ),
    ],
)
def test_a_row_the_chat_template_cannot_render_names_file_and_line(tmp_path, qwen3_tokenizer_dir, question, message):
    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    spec = _write_jsonl(tmp_path / "d.jsonl", [{"q": question}])
    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    with pytest.raises(ValueError, match=message):
        rows_to_samples(load_prompt_rows(spec), source=spec, input_key="q", tokenizer=tok, apply_chat_template=True)
    # Assistant turns are rendered as the template likes (Qwen3 drops their reasoning): not checked.
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>x</think>Yo"}]
    (sample,) = rows_to_samples([{"q": history}], source="m", input_key="q", tokenizer=tok, apply_chat_template=True)
    assert "<think>x</think>" not in sample.prompt and "Yo" in sample.prompt


@pytest.mark.parametrize(
    ("flag", "why"),
    [
        (True, "--apply-chat-template"),
        # Was "the chat template (--apply-chat-template) failed on this row: ValueError: Cannot use chat template
        # functions ...": a flag the user did not give.
        (False, "a prompt of chat messages without --apply-chat-template (the default generate function renders it)"),
    ],
)
def test_a_tokenizer_without_a_chat_template_is_named_with_what_needs_one(tmp_path, qwen3_tokenizer_dir, flag, why):
    import copy

    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    spec = _write_jsonl(tmp_path / "d.jsonl", [{"q": [{"role": "user", "content": "hi"}]}])
    bare = copy.copy(get_tokenizer(str(qwen3_tokenizer_dir)))
    bare.chat_template = None
    with pytest.raises(ValueError) as raised:
        rows_to_samples(load_prompt_rows(spec), source=spec, input_key="q", tokenizer=bare, apply_chat_template=flag)
    assert str(raised.value) == (
        f"{spec} line 1: {why} needs the chat template of the --hf-checkpoint tokenizer, which has none (no "
        "'chat_template' in tokenizer_config.json, no chat_template.jinja); add one, or give plain-text prompts"
    )


def test_messages_without_the_flag_are_checked_as_the_default_generate_renders_them(qwen3_tokenizer_dir):
    # Without --apply-chat-template the default generate still renders messages with the template (encode_prompt).
    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    rows = [{"q": [{"role": "human", "content": "What is 2+2?"}]}]
    with pytest.raises(ValueError, match=r"row 1: the chat template left out message 0 \(role 'human'\)"):
        rows_to_samples(rows, source="m", input_key="q", tokenizer=tok, max_prompt_len=100)
    rows = [{"q": [{"role": "user", "content": "Hi"}]}]
    assert rows_to_samples(rows, source="m", input_key="q", tokenizer=tok, max_prompt_len=100)[0].prompt == rows[0]["q"]
    assert rows_to_samples(rows, source="m", input_key="q", tokenizer=tok, max_prompt_len=5) == []  # 8 tokens rendered


def test_an_optional_column_set_away_from_its_default_and_missing_is_counted(caplog):
    # A misspelt --metadata-key made every row's metadata {} (and so its rm_type, choices, ...), without a word.
    from slime_rollout.data.source import rows_to_samples

    rows = [{"q": "a", "meta": {"rm_type": "f1"}}, {"q": "b"}, {"q": "c"}]
    with caplog.at_level("WARNING", logger="slime_rollout.data"):
        samples = rows_to_samples(rows, source="d.jsonl", input_key="q", metadata_key="meta", tool_key="tool")
    assert [s.metadata for s in samples] == [{"rm_type": "f1"}, {}, {}]
    assert "d.jsonl: 2 of 3 rows have no --metadata-key 'meta'" in caplog.text
    assert "d.jsonl: 3 of 3 rows have no --tool-key 'tool'" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="slime_rollout.data"):
        rows_to_samples([{"q": "a"}], source="d.jsonl", input_key="q")  # the defaults: optional, not warned about
    assert "rows have no" not in caplog.text


def test_a_rollout_batch_larger_than_the_data_is_said_with_its_counts(tmp_path, caplog):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    with caplog.at_level("WARNING", logger="slime_rollout.data"):
        ds = RolloutDataSource(_args(prompt_data=path, rollout_batch_size=12))
    warned = [r.getMessage() for r in caplog.records if "--rollout-batch-size" in r.getMessage()]
    assert warned == [
        f"--rollout-batch-size 12 is more than the 5 prompts of --prompt-data {path}: each rollout wraps past the "
        "end of an epoch and holds the same prompt up to 3 times"
    ]
    # What it says: one rollout's 12 groups are prompts 0-4, 0-4, 0-1 (no shuffle by default).
    assert [g[0].prompt for g in ds.get_samples(12)] == [f"q{i % 5}" for i in range(12)]
    caplog.clear()
    with caplog.at_level("WARNING", logger="slime_rollout.data"):
        RolloutDataSource(_args(prompt_data=path, rollout_batch_size=5))
    assert not [r for r in caplog.records if "--rollout-batch-size" in r.getMessage()]


def test_an_over_sampling_draw_larger_than_the_data_is_said_and_served_in_full(tmp_path, caplog):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    with caplog.at_level("WARNING", logger="slime_rollout.data"):
        ds = RolloutDataSource(_args(prompt_data=path, rollout_batch_size=2, over_sampling_batch_size=8))
    warned = [r.getMessage() for r in caplog.records if "--over-sampling-batch-size" in r.getMessage()]
    assert warned == [
        f"--over-sampling-batch-size 8 is more than the 5 prompts of --prompt-data {path}: each over-sampling draw "
        "wraps past the end of an epoch and holds the same prompt up to 2 times"
    ]
    # Every group asked for; the original wraps once per draw, so its second one returns 7 (2 + 5) and leaves its
    # cursor at offset 6 of 5.
    assert [g[0].prompt for g in ds.get_samples(8)] == [f"q{i % 5}" for i in range(8)]
    assert [g[0].prompt for g in ds.get_samples(8)] == [f"q{i % 5}" for i in range(8, 16)]
    assert (ds.epoch_id, ds.sample_offset) == (3, 1)


def test_an_eval_only_run_builds_its_data_source_without_prompt_data():
    # --num-rollout 0 (the original's eval-only run) draws no prompt; its scripts give no --prompt-data, and the
    # data source, built at start-up, refused that ("--prompt-data is required").
    source = RolloutDataSourceWithBuffer(_args(num_rollout=0, eval_interval=1, eval_prompt_data=["aime", "a.jsonl"]))
    assert len(source) == 0
    with pytest.raises(ValueError, match="--prompt-data is required"):
        RolloutDataSourceWithBuffer(_args())  # a training run still needs it


_NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tools_a_chat_template_leaves_out_name_the_row(tmp_path, qwen3_tokenizer_dir):
    # transformers hands `tools` to the template, and one without tool support ignores them: the prompt was
    # "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n" and the model was asked to call tools it never saw.
    import copy

    from slime_rollout.data.source import get_tokenizer, rows_to_samples

    tools = [{"type": "function", "function": {"name": "calculator", "description": "adds two numbers",
                                               "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
    # The prompt names the tool itself (as the retool example's do): only the schema is missing.
    spec = _write_jsonl(tmp_path / "d.jsonl", [{"q": "2+2?"}, {"q": "Use calculator: 3+3?", "tools": tools}])
    plain = copy.copy(get_tokenizer(str(qwen3_tokenizer_dir)))
    plain.chat_template = _NO_TOOLS_TEMPLATE
    with pytest.raises(ValueError) as raised:
        rows_to_samples(load_prompt_rows(spec), source=spec, input_key="q", tokenizer=plain, apply_chat_template=True)
    assert str(raised.value) == (
        f"{spec} line 2: the chat template (--apply-chat-template) left out the row's tools (the prompt is the same "
        "without them): it renders no tool schemas; use a checkpoint whose template does, or give the rows no tools"
    )
    # Qwen3's template renders them: the schema is in the prompt.
    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    samples = rows_to_samples(
        load_prompt_rows(spec), source=spec, input_key="q", tokenizer=tok, apply_chat_template=True
    )
    assert '"name": "calculator"' in samples[1].prompt and samples[1].metadata["tools"] == tools


def test_the_row_count_of_num_epoch_is_the_rows_the_data_source_reads(tmp_path):
    # --num-epoch counts the rows without reading them (count_rows); its own text-mode count counted a line holding
    # only the byte-order mark (an Excel export's blank first line) as a row, and bad bytes failed with a bare
    # UnicodeDecodeError naming no line.
    from slime_rollout.data.prompt_rows import count_rows, load_prompt_rows

    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf\r\n{"question": "q1"}\r\n\r\n{"question": "q2"}\r\n')
    assert count_rows(str(path)) == len(load_prompt_rows(str(path))) == 2
    assert count_rows(f"{path}@[1:]") == 1
    path.write_bytes(b'{"question": "q1"}\n{"question": "\xff"}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not UTF-8"):
        count_rows(str(path))


def test_message_prompts_are_checked_when_no_length_limit_loads_the_tokenizer(tmp_path, qwen3_tokenizer_dir):
    # The data source loaded the tokenizer only to template or to measure prompts: with no length limit (a config
    # without max_position_embeddings, no --rollout-max-context-len) a ShareGPT "human" turn, which Qwen3's template
    # drops, went to the engine as the bare generation prompt, and the eval datasets' the same.
    import shutil

    from slime_rollout.generation.eval import _load_eval_prompts

    model = tmp_path / "model"
    shutil.copytree(qwen3_tokenizer_dir, model)
    (model / "config.json").write_text('{"model_type": "qwen3"}')
    human = [{"role": "human", "content": "2+2?"}]
    spec = _write_jsonl(tmp_path / "d.jsonl", [{"question": "Hi"}, {"question": human}])
    args = _args(prompt_data=spec, hf_checkpoint=str(model))
    with pytest.raises(ValueError, match=r"d.jsonl line 2: the chat template left out message 0 \(role 'human'\)"):
        RolloutDataSource(args)
    with pytest.raises(ValueError, match=r"d.jsonl line 2: the chat template left out message 0 \(role 'human'\)"):
        _load_eval_prompts(spec, "question", None, "metadata", "tools", str(model), False, "{}", None)
    text = _write_jsonl(tmp_path / "t.jsonl", [{"question": "Hi"}])
    assert len(RolloutDataSource(_args(prompt_data=text, hf_checkpoint=str(model)))) == 1  # text needs no tokenizer


def test_a_slice_that_ends_early_reads_no_row_past_its_end(tmp_path):
    # `data.jsonl@[0:2]` read the whole file, so a bad line past the slice stopped the run (the original's islice
    # stops at the slice's end); a slice counted from the end still reads all of it.
    from slime_rollout.data.prompt_rows import count_rows

    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"question": "q1"}\n\n{"question": "q2"}\n{"question": "q3"}\n{"question": \n\xff\n')
    rows = load_prompt_rows(f"{path}@[0:2]")
    assert [r["question"] for r in rows] == ["q1", "q2"] and rows.positions == [1, 3]
    assert [r["question"] for r in load_prompt_rows(f"{path}@[1:3]")] == ["q2", "q3"]
    assert count_rows(f"{path}@[:3]") == 3
    with pytest.raises(ValueError, match=r"d\.jsonl:5: invalid JSON"):
        load_prompt_rows(f"{path}@[-2:]")
