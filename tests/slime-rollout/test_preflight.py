"""slime-rollout's own pre-launch checks (`slime_rollout.preflight.check`): rows, labels, images, engine flags.

Moved with the code from tests/apps/test_preflight.py; the app's preflight runs this check (`slime.preflight`
entry point), which tests/apps/test_preflight.py still covers end to end. The checks of the run's shape (response
budgets, eval-only runs, prompt makers, template kwargs, row reward types) are in `test_preflight_run_shape.py`.
"""

import dataclasses
import importlib.metadata
import json
import pathlib
import re
import sys
import types

import pytest
from slime_preflight_helpers import _cfg, _errors, _write

from slime_core.config import parse_args
from slime_core.extensions import PREFLIGHT_CHECKS, REWARDS, RewardSpec
from slime_core.registry import Problem
from slime_rollout.preflight import check


def test_it_is_this_packages_preflight_entry_point():
    declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="slime.preflight")}
    assert declared["slime-rollout"] == "slime_rollout.preflight:check"
    assert PREFLIGHT_CHECKS.get("slime-rollout").load() is check


def test_rows_are_numbered_like_lines(tmp_path):
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"}, {"q": "x", "label": "1"})
    (error,) = _errors(_cfg(data))
    assert error.startswith(f"--prompt-data {data} line 2: no --input-key 'prompt'")


@pytest.mark.parametrize(
    ("row", "extra", "message"),
    [
        ({"prompt": "", "label": "2"}, (), r"line 2: empty prompt in --input-key 'prompt'"),
        ({"prompt": [{"role": "user", "content": " "}], "label": "2"}, (), r"line 2: empty prompt"),
        ({"prompt": "1+2=", "label": None}, ("--rm-type", "math"), r"line 2: null --label-key 'label'.*math"),
        ({"prompt": "1+2=", "label": None}, ("--rm-type", "boxed_deepscaler"), r"line 2: null --label-key"),
    ],
)
def test_empty_prompts_and_null_labels_are_problems(tmp_path, row, extra, message):
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"}, row)
    (error,) = _errors(_cfg(data, *extra))
    assert re.search(rf"--prompt-data .*d\.jsonl {message}", error), error


@pytest.mark.parametrize("rm_type", ["f1", "math", "gpqa", "boxed_dapo"])
def test_a_grader_that_compares_with_the_label_needs_a_label_key(tmp_path, rm_type):
    # Without --label-key every label is None: math failed at the first sample, f1 scored the text "None" as 1.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    args = ["--train-backend", "fsdp", "--prompt-data", str(data), "--input-key", "prompt", "--rollout-batch-size",
            "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "1",
            "--actor-num-gpus-per-node", "1", "--rollout-max-response-len", "8", "--rm-type", rm_type]  # fmt: skip
    (error,) = _errors(parse_args(args))
    assert error == (
        f"--prompt-data {data} line 1: --rm-type {rm_type} grades against a label, but no --label-key is set "
        "(name the column that holds the answer)"
    )
    # gpqa may take its answer from the row's metadata; a reward that grades no label needs none.
    _write(data, {"prompt": "Pick one", "metadata": {"correct_letter": "B"}})
    expected = 0 if rm_type == "gpqa" else 1
    assert len(_errors(parse_args([*args, "--metadata-key", "metadata"]))) == expected
    assert _errors(parse_args([*args[:-2], "--rm-type", "random"])) == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt", 5, "--input-key 'prompt' holds int 5, not a prompt"),
        ("prompt", ["hi"], "--input-key 'prompt': message 0 is str 'hi', not a chat message"),
        ("metadata", [[1, 2]], "--metadata-key 'metadata' must hold a dict (or its JSON), got list [[1, 2]]"),
        ("tools", {"name": "calc"}, "--tool-key 'tools' must hold a list of tool schemas (dicts) or its JSON"),
    ],
)
def test_malformed_prompts_metadata_and_tools_name_the_row(tmp_path, field, value, message):
    bad = {"prompt": "2+2=", "label": "4", field: value}
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"}, bad)
    (error,) = _errors(_cfg(data, "--rm-type", "math"))
    assert error.startswith(f"--prompt-data {data} line 2: {message}"), error


def test_null_labels_are_fine_where_nothing_grades_against_them(tmp_path):
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": None})
    assert _errors(_cfg(data, "--rm-type", "remote_rm", "--rm-url", "http://localhost:1")) == []
    _write(data, {"prompt": "Pick one", "label": None, "metadata": {"correct_letter": "B"}})
    assert _errors(_cfg(data, "--rm-type", "gpqa")) == []


def test_a_remote_reward_needs_its_url(tmp_path):
    # Used to fail at the first scored sample, mid-rollout.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    assert _errors(_cfg(data, "--rm-type", "boxed_remote_rm")) == [
        "--rm-type boxed_remote_rm calls a reward service: set --rm-url http://host:port/path"
    ]
    assert _errors(_cfg(data, "--rm-type", "remote_rm", "--rm-url", "http://localhost:1/rm")) == []
    assert _errors(_cfg(data, "--rm-type", "math")) == []


def test_whether_a_reward_grades_the_label_is_its_capability(tmp_path):
    # A reward of another package: its record, not a fixed list of grader names, says whether labels matter.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": None})
    REWARDS.register(RewardSpec(name="judge_free", factory=lambda args, sample: 1.0))
    REWARDS.register(RewardSpec(name="judge_label", factory=lambda args, sample: 1.0, grades_label=True))
    try:
        assert _errors(_cfg(data, "--rm-type", "judge_free")) == []
        (error,) = _errors(_cfg(data, "--rm-type", "judge_label"))
        assert "null --label-key 'label', which --rm-type judge_label grades against" in error
    finally:
        REWARDS.unregister("judge_free")
        REWARDS.unregister("judge_label")


def test_a_binary_parquet_label_is_refused_naming_the_row(tmp_path):
    # A binary column reads as bytes, graded as the text "b'4'": every sample of the row scored 0.
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["1+1=", "2+2="], "label": pa.array([b"2", b"4"], type=pa.binary())}), data)
    (error,) = _errors(_cfg(data, "--rm-type", "math"))
    assert error == (
        f"--prompt-data {data} row index 0: --label-key 'label' holds bytes b'2' (a binary Parquet column; store it "
        "as strings), not text, which --rm-type math grades against"
    )


def test_a_label_stand_in_in_the_metadata_is_the_records_field(tmp_path):
    # gpqa's `correct_letter` was special-cased by name: a package's reward with the same kind of stand-in was
    # refused ("null --label-key") though it grades from the metadata. Its record now says which key it reads.
    data = _write(tmp_path / "d.jsonl", {"prompt": "Pick one", "label": None, "metadata": {"gold": "B"}})
    REWARDS.register(RewardSpec(name="judge_meta", factory=lambda args, sample: 1.0, grades_label=True,
                                label_in_metadata="gold"))  # fmt: skip
    try:
        assert _errors(_cfg(data, "--rm-type", "judge_meta", "--metadata-key", "metadata")) == []
        _write(data, {"prompt": "Pick one", "label": None, "metadata": {"correct_letter": "B"}})
        (error,) = _errors(_cfg(data, "--rm-type", "judge_meta", "--metadata-key", "metadata"))
        assert "null --label-key 'label', which --rm-type judge_meta grades against" in error
        assert _errors(_cfg(data, "--rm-type", "gpqa", "--metadata-key", "metadata")) == []
        assert REWARDS.get("gpqa").label_in_metadata == "correct_letter"
    finally:
        REWARDS.unregister("judge_meta")


@pytest.mark.parametrize(
    ("label", "rm_type", "message"),
    [
        ("", "math", "holds an empty label '', which --rm-type math grades against"),
        ("  ", "f1", "holds an empty label '  ', which --rm-type f1 grades against"),
        (float("nan"), "math", "holds nan (a JSON NaN/Infinity), not an answer, which --rm-type math grades against"),
        (float("inf"), "boxed_gpqa", "holds inf (a JSON NaN/Infinity), not an answer"),
    ],
)
def test_an_empty_or_nan_label_is_refused_naming_the_row(tmp_path, label, rm_type, message):
    # Graded as the text "" or "nan" (a missing value a data tool wrote), which no answer equals: every sample of
    # the row scored 0 without a word.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"}, {"prompt": "1+2=", "label": label})
    (error,) = _errors(_cfg(data, "--rm-type", rm_type))
    assert error.startswith(f"--prompt-data {data} line 2: --label-key 'label' {message}"), error
    # Not where nothing grades against the label, nor for a bool (`\boxed{True}` is an answer to `true`).
    assert _errors(_cfg(data, "--rm-type", "random")) == []
    _write(data, {"prompt": "Is 2 prime?", "label": True})
    assert _errors(_cfg(data, "--rm-type", rm_type)) == []


def test_a_rows_own_reward_must_be_registered(tmp_path):
    # metadata["rm_type"] overrides --rm-type per sample; a typo used to pass preflight and stop the rollout.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2", "metadata": {"rm_type": "boxed_f1"}},
                  {"prompt": "1+2=", "label": "3", "metadata": {"rm_type": "mth"}})  # fmt: skip
    (error,) = _errors(_cfg(data, "--rm-type", "math"))
    assert re.search(r"d\.jsonl line 2: metadata rm_type 'mth' is not a registered reward function \(registered: "
                     r"dapo, deepscaler, f1, gpqa, ifbench, math, ", error), error  # fmt: skip
    _write(data, {"prompt": "1+1=", "label": "2", "metadata": {"rm_type": "boxed_f1"}})
    assert _errors(_cfg(data, "--rm-type", "math")) == []


def test_missing_and_malformed_files_keep_their_exception_class(tmp_path):
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    assert check(_cfg(data)) == []
    (missing,) = check(_cfg(tmp_path / "nope.jsonl"))
    assert (missing.exception, missing.message) == (FileNotFoundError, f"--prompt-data: file not found: "
                                                                        f"{tmp_path / 'nope.jsonl'}")  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1"}\n{"prompt": \n')
    (malformed,) = check(_cfg(data, "--eval-prompt-data", "e", str(bad)))
    assert malformed.exception is ValueError and malformed.message.startswith("--eval-prompt-data: ")
    assert "bad.jsonl:2: invalid JSON" in malformed.message


def _vlm_dir(tmp_path) -> pathlib.Path:
    model = tmp_path / "vlm"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (model / "chat_template.jinja").write_text("{{ messages }}")
    (model / "tokenizer_config.json").write_text("{}")  # a checkpoint holds its tokenizer's files
    (model / "processor_config.json").write_text(json.dumps({"image_processor": {"patch_size": 14}}))
    return model


def test_images_are_checked_row_by_row(tmp_path):
    from PIL import Image

    model = _vlm_dir(tmp_path)
    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    ok = {"prompt": "<image>How many?", "label": "2", "images": ["ok.png"]}

    def errors(*rows):
        data = _write(tmp_path / "d.jsonl", ok, *rows)
        return _errors(_cfg(data, "--hf-checkpoint", str(model), "--apply-chat-template",
                            "--multimodal-keys", '{"image": "images"}'))  # fmt: skip

    assert errors() == []  # the image is found next to the data file and decodes
    (gone,) = errors({"prompt": "<image>?", "label": "1", "images": ["gone.png"]})
    assert "d.jsonl line 2 (--multimodal-keys column 'images') image 1: image 'gone.png' is neither" in gone
    (broken,) = errors({"prompt": "<image>?", "label": "1", "images": ["broken.png"]})
    assert "broken.png: cannot be decoded" in broken
    (surplus,) = errors(ok, {"prompt": "<image><image>?", "label": "1", "images": ["ok.png"]})
    assert "d.jsonl line 3" in surplus and "the prompt has 2 <image> placeholder(s) for 1" in surplus
    (model / "processor_config.json").unlink()
    cfg = _cfg(tmp_path / "d.jsonl", "--hf-checkpoint", str(model), "--apply-chat-template",
               "--multimodal-keys", '{"image": "images"}')  # fmt: skip
    no_processor = next(p for p in check(cfg) if p.severity == "error")
    assert no_processor.exception is FileNotFoundError and "has no preprocessor_config.json" in no_processor.message


def test_sglang_and_router_flags_are_checked_against_the_installed_packages(tmp_path, monkeypatch):
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    flags = ("--sglang-mem-fraction-statc", "0.5", "--router-policy", "round_robin")
    # Not installed here (CPU): a note says they were not checked.
    assert Problem(message="--sglang-* flags not checked: sglang.srt.server_args is not importable here",
                   severity="note") in check(_cfg(data, *flags))  # fmt: skip
    # Installed: the dataclasses' fields decide, as the original's argparse does.
    server = types.ModuleType("sglang.srt.server_args")
    server.ServerArgs = dataclasses.make_dataclass("ServerArgs", [("mem_fraction_static", float), ("tp_size", int)])
    router = types.ModuleType("sglang_router.router_args")
    router.RouterArgs = dataclasses.make_dataclass("RouterArgs", [("policy", str)])
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", server)
    monkeypatch.setitem(sys.modules, "sglang_router.router_args", router)
    assert _errors(_cfg(data, *flags)) == [
        "--sglang-mem-fraction-statc: sglang.srt.server_args.ServerArgs has no field 'mem_fraction_statc'; "
        "did you mean --sglang-mem-fraction-static?"
    ]
    assert check(_cfg(data, "--sglang-mem-fraction-static", "0.5", *flags[2:])) == []
    assert _errors(_cfg(data, "--router-foo", "3")) == [
        "--router-foo: sglang_router.router_args.RouterArgs has no field 'foo'"
    ]


def test_eval_files_are_checked_with_their_own_keys(tmp_path):
    # The eval file was checked with the training keys: a valid --eval-input-key/--eval-label-key run was refused
    # ("no --input-key 'prompt'"), and the files of an --eval-config were not checked at all.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    evals = _write(tmp_path / "e.jsonl", {"question": "2+2=", "answer": "4"})
    eval_flags = ("--eval-prompt-data", "ev", str(evals), "--eval-interval", "1")
    assert _errors(_cfg(data, "--rm-type", "math", *eval_flags, "--eval-input-key", "question",
                        "--eval-label-key", "answer")) == []  # fmt: skip
    (error,) = _errors(_cfg(data, "--rm-type", "math", *eval_flags, "--eval-input-key", "question"))
    assert error == f"--eval-prompt-data {evals} line 1: no --label-key 'label' (keys: ['answer', 'question'])"
    config = tmp_path / "eval.yaml"
    config.write_text(
        f"eval:\n  datasets:\n    - {{name: good, path: {evals}, input_key: question, label_key: answer}}\n"
        f"    - {{name: bad, path: {evals}, input_key: prompt}}\n"
    )
    (error,) = _errors(_cfg(data, "--rm-type", "math", "--eval-config", str(config), "--eval-interval", "1"))
    assert error == (
        f"--eval-config {config} dataset 'bad' {evals} line 1: no --eval-config {config} dataset 'bad' input_key "
        "'prompt' (keys: ['answer', 'question'])"
    )
    # A dataset's own reward decides whether it needs a label (f1 does, random does not).
    for rm_type, expected in (("f1", 1), ("random", 0)):
        config.write_text(
            f"eval:\n  datasets:\n    - {{name: r, path: {evals}, input_key: question, label_key: null, "
            f"rm_type: {rm_type}}}\n"
        )
        errors = _errors(_cfg(data, "--rm-type", "math", "--eval-config", str(config), "--eval-interval", "1"))
        assert len(errors) == expected, errors
        # The dataset's own `label_key: null` is what is at fault, so the message names it.
        assert all(f"--rm-type f1 grades against a label, but no --eval-config {config} dataset 'r' label_key is set"
                   in e for e in errors)  # fmt: skip


def test_eval_row_errors_name_the_flag_that_set_the_key(tmp_path):
    # "no --input-key 'q'" was said when --eval-input-key q (or the dataset's own input_key) named the column:
    # --input-key was not at fault and changing it changed nothing.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    evals = _write(tmp_path / "e.jsonl", {"question": "2+2=", "answer": "4"}, {"q": "3+3=", "answer": "6"},
                   {"question": "", "answer": "1"})  # fmt: skip
    eval_flags = ("--rm-type", "math", "--eval-prompt-data", "ev", str(evals), "--eval-interval", "1",
                  "--eval-input-key", "question", "--eval-label-key", "answer")  # fmt: skip
    (error,) = _errors(_cfg(data, *eval_flags))
    assert error == f"--eval-prompt-data {evals} line 2: no --eval-input-key 'question' (keys: ['answer', 'q'])"
    _write(evals, {"question": "2+2=", "answer": "4"}, {"question": "", "answer": "1"})
    (error,) = _errors(_cfg(data, *eval_flags))
    assert error == f"--eval-prompt-data {evals} line 2: empty prompt in --eval-input-key 'question'"
    _write(evals, {"question": "2+2=", "answer": None})
    (error,) = _errors(_cfg(data, *eval_flags))
    assert error.startswith(f"--eval-prompt-data {evals} line 1: null --eval-label-key 'answer', which --rm-type math")
    _write(evals, {"question": "2+2=", "answer": {"value": 4}})
    (error,) = _errors(_cfg(data, *eval_flags))
    assert "--eval-label-key 'answer' holds a dict" in error and "point --eval-label-key at the answer" in error
    # A key set in --eval-config's defaults is named there; the training file keeps the training flags.
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  defaults: {{input_key: qq}}\n  datasets:\n    - {{name: d, path: {evals}}}\n")
    (error,) = _errors(_cfg(data, "--rm-type", "math", "--eval-config", str(config), "--eval-interval", "1"))
    assert f"line 1: no --eval-config {config} eval.defaults input_key 'qq'" in error
    _write(data, {"question": "1+1=", "label": "2"})
    (error,) = _errors(_cfg(data, "--rm-type", "math"))
    assert error == f"--prompt-data {data} line 1: no --input-key 'prompt' (keys: ['label', 'question'])"


def test_eval_prompts_at_run_time_name_the_eval_flag(tmp_path):
    # The same rows read by the eval rollout itself (`rows_to_samples`), not only by preflight.
    from slime_rollout.generation import eval as eval_module

    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    evals = _write(tmp_path / "e.jsonl", {"q": "3+3=", "answer": "6"})
    cfg = _cfg(data, "--rm-type", "math", "--eval-prompt-data", "ev", str(evals), "--eval-interval", "1",
               "--eval-input-key", "question", "--eval-label-key", "answer")  # fmt: skip
    (dataset,) = eval_module.eval_datasets(cfg)
    dataset["max_prompt_len"] = None  # no tokenizer in this test
    expected = r"e\.jsonl line 1: no --eval-input-key 'question' \(keys: \['answer', 'q'\]\)"
    with pytest.raises(ValueError, match=expected):
        eval_module._prompts(cfg, dataset)


def test_a_checkpoint_without_tokenizer_files_is_refused(tmp_path, qwen3_tokenizer_dir):
    # transformers built an empty tokenizer from config.json alone: --dry-run showed "first prompt 0 tokens".
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    (problem,) = check(_cfg(data, "--hf-checkpoint", str(model)))
    assert problem.exception is FileNotFoundError and problem.message.startswith(
        f"--hf-checkpoint {model}: no tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model, "
        "vocab.json, vocab.txt); every prompt would be encoded by an empty tokenizer"
    )
    from slime_rollout.data.source import get_tokenizer

    with pytest.raises(ValueError, match=r"its tokenizer is empty \(1 token\)"):
        get_tokenizer(str(model))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((qwen3_tokenizer_dir / name).read_bytes())
    assert check(_cfg(data, "--hf-checkpoint", str(model))) == []


@pytest.mark.parametrize(
    ("rm_type", "label"), [("math", {"answer": "2"}), ("boxed_dapo", ["2", "two"]), ("gpqa", ["B"])]
)
def test_a_dict_or_list_label_is_refused_where_the_grader_compares_one_answer(tmp_path, rm_type, label):
    # Compared as its Python text ("{'answer': '2'}"), it scored 0 on every sample of the row.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"}, {"prompt": "1+1=", "label": label})
    (error,) = _errors(_cfg(data, "--rm-type", rm_type))
    assert error.startswith(f"--prompt-data {data} line 2: --label-key 'label' holds a {type(label).__name__} ")
    assert error.endswith(f"but --rm-type {rm_type.removeprefix('boxed_')} grades one answer (text or a number); "
                          "point --label-key at the answer itself")  # fmt: skip
    # f1 takes a list of references; the record (`RewardSpec.label_is_value`) says so, not a list of names here.
    _write(data, {"prompt": "1+1=", "label": ["2", "two"]})
    assert _errors(_cfg(data, "--rm-type", "f1")) == []


def test_an_eval_config_that_is_not_yaml_or_not_utf8_is_one_error(tmp_path):
    # Invalid YAML ended the run in a traceback; a latin-1 file in "function takes exactly 5 arguments (1 given)"
    # (the preflight rebuilt the UnicodeDecodeError from its message).
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets: [\n")
    flags = ("--rm-type", "math", "--eval-config", str(config), "--eval-interval", "1")
    assert _errors(_cfg(data, *flags)) == [
        f"--eval-config {config}:3: invalid YAML (expected the node content, but found '<stream end>')"
    ]
    config.write_bytes("eval:\n  datasets: []\n# caf\u00e9\n".encode("latin-1"))
    assert _errors(_cfg(data, *flags)) == [f"--eval-config {config}:3: not UTF-8 (byte 0xe9); re-encode it"]


def test_sglang_flags_the_reference_engine_ignores_are_noted(tmp_path):
    # --sglang-mem-fraction-static & co. passed silently on a run served by the CPU reference engines.
    from slime_core.extensions import run_preflight_hooks

    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    flags = ("--rm-type", "math", "--rollout-engine", "reference", "--sglang-mem-fraction-static", "0.5",
             "--sglang-dtype", "bfloat16", "--sglang-enable-deterministic-inference")  # fmt: skip
    notes = [p.message for p in run_preflight_hooks(_cfg(data, *flags)) if "reference engines read only" in p.message]
    assert notes == [
        "--rollout-engine reference: the CPU reference engines read only --sglang-context-length, --sglang-dtype, "
        "--sglang-enable-deterministic-inference, --sglang-max-running-requests and --sglang-num-threads; these have "
        "no effect in this run (SGLang engines read them): --sglang-mem-fraction-static"
    ]
    outside = _cfg(data, *flags, "--rollout-engine-urls", "http://127.0.0.1:1")
    assert not [p for p in run_preflight_hooks(outside) if "reference engines read only" in p.message]


def test_a_gpqa_row_whose_correct_letter_is_index_0_needs_no_label():
    # correct_letter 0 (option A) was falsy, so the row was refused for lacking a --label-key.
    from slime_core.config import SlimeArgs
    from slime_rollout.preflight import check_prompt_rows

    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rm_type": "gpqa", "input_key": "q"})
    check_prompt_rows([{"q": "pick", "metadata": {"correct_letter": 0}}], cfg, where="--prompt-data x.jsonl")
    with pytest.raises(ValueError, match="grades against a label"):
        check_prompt_rows([{"q": "pick", "metadata": {"correct_letter": ""}}], cfg, where="--prompt-data x.jsonl")


@pytest.mark.parametrize("label", ["Natalia sold 48 clips. ####", "####   ", r"The answer is \boxed{}"])
def test_a_label_whose_final_answer_is_empty_is_refused(label):
    # A GSM8K solution cut before its answer graded every response against "": all 0, without a word.
    from slime_core.config import SlimeArgs
    from slime_rollout.preflight import check_prompt_rows

    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "rm_type": "math", "input_key": "q", "label_key": "a"}
    )
    with pytest.raises(ValueError, match=r"x.jsonl row 1: --label-key 'a' holds .* whose final answer .* is empty"):
        check_prompt_rows([{"q": "how many?", "a": label}], cfg, where="--prompt-data x.jsonl")
    fixed = label.replace("{}", "{72}") if "boxed" in label else label + " 72"
    check_prompt_rows([{"q": "how many?", "a": fixed}], cfg, where="--prompt-data x.jsonl")
    check_prompt_rows([{"q": "how many?", "a": label}], cfg.model_copy(update={"rm_type": "f1"}), where="x.jsonl")


def test_each_rows_reward_is_looked_up_once(monkeypatch):
    # Looked up 3-4 times per row (the row's rm_type, whether a label is needed, its type, its final answer), each
    # `in REWARDS` listing and sorting every registered name, entry points included.
    from slime_core.config import SlimeArgs
    from slime_rollout.preflight import check_prompt_rows

    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "rm_type": "math", "input_key": "q", "label_key": "a"}
    )
    gets, listings = [], []
    real_get, real_names = REWARDS.get, REWARDS.names
    monkeypatch.setattr(REWARDS, "get", lambda name: gets.append(name) or real_get(name))
    monkeypatch.setattr(REWARDS, "names", lambda: listings.append(1) or real_names())
    rows = [{"q": "how many?", "a": "#### 72"}, {"q": "pick", "a": "B", "metadata": {"rm_type": "boxed_gpqa"}}]
    check_prompt_rows(rows, cfg, where="--prompt-data x.jsonl")
    assert (gets, listings) == (["math", "gpqa"], [])
    with pytest.raises(ValueError, match=r"^x.jsonl row 1: metadata rm_type 'mth' is not a registered reward"):
        check_prompt_rows([{"q": "?", "a": "1", "metadata": {"rm_type": "mth"}}], cfg, where="x.jsonl")


def test_dapo_needs_a_reward_key_that_picks_a_number(tmp_path):
    # Issue 27: its reward is a dict; without --reward-key (or with 'pred', its text) the run generated a whole
    # rollout and then stopped at the first reward it read.
    from slime_core.extensions import run_preflight_hooks

    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})

    def dapo_errors(*extra: str) -> list[str]:
        problems = run_preflight_hooks(_cfg(data, "--rm-type", "dapo", *extra))
        return [p.message for p in problems if p.severity == "error" and "dapo" in p.message]

    (error,) = dapo_errors()
    assert error.startswith("--rm-type dapo: its reward is a dict") and "--reward-key is not set" in error
    (error,) = dapo_errors("--reward-key", "pred")
    assert "--reward-key is 'pred', which is not a number of it: set --reward-key score" in error
    (error,) = dapo_errors("--reward-key", "score", "--eval-reward-key", "pred")
    assert "--eval-reward-key is 'pred'" in error
    assert dapo_errors("--reward-key", "score") == []
    assert dapo_errors("--reward-key", "acc", "--eval-reward-key", "score") == []


def test_a_label_whose_final_answer_is_a_whole_solution_is_refused():
    # Issue 27: --label-key on a worked solution without '#### x' or a box made the whole text the answer: no
    # response equals it (every sample 0, without a word), and a 10 MB one took 5-9 s per grade on the event loop.
    from slime_core.config import SlimeArgs
    from slime_rollout.preflight import check_prompt_rows

    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "rm_type": "math", "input_key": "q", "label_key": "a"}
    )
    solution = "Natalia sold 48 clips in April and half as many in May. " * 20  # 1,119 chars stripped, no answer
    with pytest.raises(ValueError, match=r"x.jsonl row 1: --label-key 'a' holds a final answer of 1,119 characters"):
        check_prompt_rows([{"q": "how many?", "a": solution}], cfg, where="--prompt-data x.jsonl")
    check_prompt_rows([{"q": "how many?", "a": solution + "#### 72"}], cfg, where="--prompt-data x.jsonl")
    check_prompt_rows([{"q": "how many?", "a": solution + r"So \boxed{72}."}], cfg, where="--prompt-data x.jsonl")
    f1 = cfg.model_copy(update={"rm_type": "f1"})  # a text reference: long is fine
    check_prompt_rows([{"q": "how many?", "a": solution}], f1, where="--prompt-data x.jsonl")


def test_group_rm_with_the_built_in_eval_is_refused_before_the_run(tmp_path):
    # Issue 27 plugin pass: the built-in eval refuses --group-rm (as the original asserts); the run stopped there at
    # its first eval, after --eval-interval rollouts of training.
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "p", "label": "1"}) + "\n")
    evals = ("--eval-prompt-data", "toy", str(data), "--eval-interval", "5", "--rm-type", "math")
    problems = check(_cfg(data, "--group-rm", *evals))
    assert [p.message for p in problems if "--group-rm" in p.message] == [
        "--group-rm is not supported by the built-in eval rollout (as in the original), and --eval-interval 5 runs "
        "it: drop --group-rm, the eval datasets, or give --eval-function-path"
    ]
    # The original's alias of the default is the default; a custom eval function, or no eval interval, is fine.
    aliased = check(_cfg(data, "--group-rm", *evals, "--rollout-function-path",
                         "slime.rollout.sglang_rollout.generate_rollout"))  # fmt: skip
    assert any("--group-rm" in p.message for p in aliased)
    custom = check(_cfg(data, "--group-rm", *evals, "--eval-function-path", "slime_rollout_fakes.reward_is_a"))
    assert not any("--group-rm" in p.message for p in custom)
    assert not any("--group-rm" in p.message for p in check(_cfg(data, "--group-rm", "--rm-type", "math")))


@pytest.mark.parametrize(
    ("path", "refused"),
    [
        ("slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std", True),
        ("slime_rollout.generation.filters.check_reward_nonzero_std", True),
        ("slime_rollout.generation.filters.check_reward_nonzero_std_with_fallback", False),  # keeps when short
    ],
)
def test_the_zero_std_filter_on_groups_of_one_is_refused_before_the_run(tmp_path, path, refused):
    # Every group of one sample has zero reward spread: all dropped, the rollout could never fill its batch.
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "p", "label": "1"}) + "\n")
    base = (
        "--rm-type",
        "math",
        "--dynamic-sampling-filter-path",
        path,
        "--advantage-estimator",
        "reinforce_plus_plus",
        "--normalize-advantages",
    )
    one = _cfg(data, *base, "--n-samples-per-prompt", "1", "--global-batch-size", "2")
    messages = [p.message for p in check(one) if "--dynamic-sampling-filter-path" in p.message]
    expected = [f"--dynamic-sampling-filter-path {path} drops every group of --n-samples-per-prompt 1 (one reward has "
                "no spread), so no rollout could fill its batch: use --n-samples-per-prompt 2 or more, or another "
                "filter"]  # fmt: skip
    assert messages == (expected if refused else [])
    assert not any("--dynamic-sampling-filter-path" in p.message for p in check(_cfg(data, *base)))  # groups of 2


def test_an_eval_config_rm_type_is_the_one_its_rows_are_checked_against(tmp_path):
    # The eval rollout grades an --eval-config dataset's rows with the dataset's rm_type over the rows' own (as the
    # original's inject_metadata); preflight checked them against the rows' own type, passing labels the eval's
    # grader reads as nothing (math on an f1 row's '#### ' label: an empty answer, every sample 0).
    train = _write(tmp_path / "train.jsonl", {"prompt": "1+2?", "label": "3"})
    rows = _write(tmp_path / "eval.jsonl", {"prompt": "1+2?", "label": "#### ", "metadata": {"rm_type": "f1"}})
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  datasets:\n    - {{name: mixed, path: {rows}, rm_type: math}}\n")
    errors = _errors(_cfg(train, "--rm-type", "math", "--eval-config", str(config), "--eval-interval", "1"))
    assert errors == [
        f"--eval-config {config} dataset 'mixed' {rows} line 1: --label-key 'label' holds '#### ', whose final answer "
        "('#### x' or its last box) is empty, which --rm-type math grades against"
    ]
    # Named by --eval-prompt-data, the dataset has no rm_type of its own: the row's f1 grades it, which reads text.
    assert (
        _errors(_cfg(train, "--rm-type", "math", "--eval-prompt-data", "mixed", str(rows), "--eval-interval", "1"))
        == []
    )


def test_an_eval_config_dataset_with_images_gets_the_flags_checks(tmp_path):
    # Pass 48: an --eval-config dataset's own multimodal_keys on a run without --multimodal-keys skipped the
    # checkpoint's image-processor check and the backend's (the first eval then failed on a text-only model).
    from PIL import Image

    Image.new("RGB", (8, 8), (1, 2, 3)).save(tmp_path / "ok.png")
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    evals = _write(tmp_path / "e.jsonl", {"prompt": "<image>How many?", "label": "2", "images": ["ok.png"]})
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  datasets:\n    - {{name: v, path: {evals}, multimodal_keys: {{image: images}}}}\n")
    model = _vlm_dir(tmp_path)
    flags = (
        "--hf-checkpoint",
        str(model),
        "--apply-chat-template",
        "--eval-config",
        str(config),
        "--eval-interval",
        "1",
    )
    assert _errors(_cfg(data, *flags)) == []  # a vision-language checkpoint: its images are checked and pass
    (model / "processor_config.json").unlink()
    (error,) = [p for p in check(_cfg(data, *flags)) if p.severity == "error"]
    assert error.exception is FileNotFoundError
    assert error.message == (
        f"--eval-config {config} dataset 'v' multimodal_keys: --hf-checkpoint {model} has no preprocessor_config.json "
        "(no image processor: not a vision-language checkpoint)"
    )
    (lora,) = _errors(_cfg(data, *flags, "--lora-rank", "8"))
    assert lora.startswith(f"--eval-config {config} dataset 'v' multimodal_keys with --lora-rank 8: LoRA on vision")
