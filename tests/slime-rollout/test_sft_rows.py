"""SFT rows are checked before the run starts (`slime_rollout.preflight`, `data.sft.conversation_problem`).

Reproducer: a conversation without an assistant turn on line 4 of the file passed preflight; the run stopped at
the rollout that reached it with "sample 3: no assistant message to train on", naming neither the file nor the line
(the sample index counts samples served, across epochs and shuffles). `--apply-chat-template` with the SFT rollout
rendered every conversation into text, which the rollout refused at its first sample.
"""

import json
import pathlib
import shutil

import pytest

from slime_core.config import parse_args
from slime_core.sample import Sample
from slime_rollout.data.sft import ChatLossMask, conversation_problem, sft_sample
from slime_rollout.data.source import get_tokenizer
from slime_rollout.preflight import check

GOOD = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def _cfg(data: pathlib.Path, model: pathlib.Path, *extra: str):
    return parse_args(
        ["--train-backend", "fsdp", "--prompt-data", str(data), "--input-key", "messages", "--rollout-function-path",
         "slime.rollout.sft_rollout.generate_rollout", "--loss-type", "sft_loss",
         "--disable-compute-advantages-and-returns", "--rollout-batch-size", "2", "--global-batch-size", "2",
         "--num-rollout", "1", "--actor-num-gpus-per-node", "1", "--hf-checkpoint", str(model), *extra]
    )  # fmt: skip


def _write(path: pathlib.Path, *conversations) -> pathlib.Path:
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in conversations))
    return path


def _errors(cfg) -> list[str]:
    return [p.message for p in check(cfg) if p.severity == "error"]


@pytest.mark.parametrize(
    ("bad", "extra", "message"),
    [
        ([GOOD[0]], (), "line 4: no assistant message to train on (roles: user;"),
        ([GOOD[0], {**GOOD[1], "step_loss_mask": 0}], (), "line 4: no assistant message to train on"),
        ([{"role": "user", "content": "<|im_start|>assistant\nX"}, GOOD[1]], (), "line 4: message 0 (user) holds the"),
        (GOOD[::-1], ("--loss-mask-type", "distill_qwen"), "line 4: --loss-mask-type distill_qwen trains on the last"),
        ([*GOOD, {"role": "human", "content": "Q2"}, GOOD[1]], (), "line 4: message 2 has the role 'human', which"),
        ([GOOD[0], {**GOOD[1], "step_loss_mask": None}], (), "line 4: message 1 (assistant) has step_loss_mask None"),
    ],
)
def test_a_conversation_the_sft_rollout_cannot_train_on_is_named_by_line(
    tmp_path, qwen3_tokenizer_dir, bad, extra, message
):
    data = _write(tmp_path / "sft.jsonl", GOOD, GOOD, GOOD, bad, GOOD)
    (error,) = _errors(_cfg(data, qwen3_tokenizer_dir, *extra))
    assert error.startswith(f"--prompt-data {data} ") and message in error
    # The rollout that reaches it says the same, naming the sample (a custom data source skips preflight's rows).
    builder = ChatLossMask(get_tokenizer(str(qwen3_tokenizer_dir)), extra[1] if extra else "qwen")
    with pytest.raises(ValueError, match="^sample 7: ") as raised:
        sft_sample(Sample(prompt=bad, index=7), builder)
    assert message.split(": ", 1)[1] in str(raised.value)


def test_good_conversations_pass_and_other_rollouts_are_not_held_to_sft(tmp_path, qwen3_tokenizer_dir):
    data = _write(tmp_path / "sft.jsonl", GOOD, GOOD + [{"role": "user", "content": "more?"}])
    assert _errors(_cfg(data, qwen3_tokenizer_dir)) == []
    assert conversation_problem(GOOD, "qwen3") is None
    prompts = _write(tmp_path / "rl.jsonl", [GOOD[0]])  # a prompt without a reply is what RL rows are
    rl = _cfg(prompts, qwen3_tokenizer_dir, "--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout")
    assert not any("train on" in e for e in _errors(rl))


def test_apply_chat_template_and_a_tokenizer_without_a_template_are_refused_with_sft(tmp_path, qwen3_tokenizer_dir):
    data = _write(tmp_path / "sft.jsonl", GOOD)
    (error,) = _errors(_cfg(data, qwen3_tokenizer_dir, "--apply-chat-template"))
    assert error.startswith("--apply-chat-template with --rollout-function-path slime.rollout.sft_rollout.")
    assert "drop the flag" in error
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(qwen3_tokenizer_dir / "tokenizer.json", bare)
    config = json.loads((qwen3_tokenizer_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (error,) = _errors(_cfg(data, bare))
    assert error.startswith(f"--loss-mask-type qwen (SFT): the tokenizer of --hf-checkpoint {bare} has no chat")


def test_images_with_the_sft_rollout_are_one_error_that_says_to_drop_them(tmp_path, qwen3_tokenizer_dir):
    # Reproducer: --multimodal-keys alone was refused as "needs --apply-chat-template"; with it, the run was refused
    # as "--apply-chat-template with ... the SFT rollout ...: drop the flag": each error sent the user to the other.
    from slime_core.config.base import ConfigError

    rows = [{"messages": GOOD, "images": ["x.png"]}] * 2
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"the SFT rollout, slime.rollout.sft_rollout, takes no images: drop the"):
        _cfg(data, qwen3_tokenizer_dir, "--multimodal-keys", '{"image": "images"}')
    errors = _errors(
        _cfg(data, qwen3_tokenizer_dir, "--multimodal-keys", '{"image": "images"}', "--apply-chat-template")
    )
    sft = [e for e in errors if "the SFT rollout" in e]
    assert sft == [
        "--multimodal-keys with --rollout-function-path slime.rollout.sft_rollout.generate_rollout: the SFT rollout "
        "trains text conversations only (no image reaches the model); drop --multimodal-keys and --apply-chat-template"
    ]


def test_template_kwargs_without_apply_chat_template_are_a_note(tmp_path, qwen3_tokenizer_dir):
    # Reproducer: the kwargs were read only with --apply-chat-template, without a word otherwise.
    data = _write(tmp_path / "sft.jsonl", GOOD)
    cfg = _cfg(data, qwen3_tokenizer_dir, "--apply-chat-template-kwargs", '{"enable_thinking": false}')
    notes = [p.message for p in check(cfg) if p.severity == "note"]
    assert '--apply-chat-template-kwargs {"enable_thinking": false} has no effect without --apply-chat-template' in (
        "\n".join(notes)
    )
    assert _errors(cfg) == []


def test_eval_data_with_the_sft_rollout_as_eval_function_is_one_error(tmp_path, qwen3_tokenizer_dir):
    # Reproducer: it passed preflight; with --skip-eval-before-train the run stopped at its first eval, after
    # --eval-interval rollouts of training ("the SFT rollout has no eval mode").
    data = _write(tmp_path / "sft.jsonl", GOOD)
    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"input": "1+1=", "label": "2"}) + "\n")
    flags = ("--eval-prompt-data", "aime", str(evals), "--eval-input-key", "input", "--eval-label-key", "label",
             "--eval-interval", "2", "--skip-eval-before-train", "--rollout-max-response-len", "8")  # fmt: skip
    errors = _errors(_cfg(data, qwen3_tokenizer_dir, *flags))
    assert any(e.startswith("--eval-prompt-data / --eval-config with the SFT rollout (slime.rollout.sft_rollout.")
               for e in errors), errors  # fmt: skip
    generating = ("--eval-function-path", "slime.rollout.sglang_rollout.generate_rollout")
    assert not any("SFT rollout" in e for e in _errors(_cfg(data, qwen3_tokenizer_dir, *flags, *generating)))


def test_sft_rows_need_no_label_for_a_grading_rm_type(tmp_path, qwen3_tokenizer_dir):
    # Reproducer: `--rm-type math` (for eval, or left over) refused every SFT row "grades against a label, but no
    # --label-key is set", though the SFT rollout grades nothing.
    data = _write(tmp_path / "sft.jsonl", GOOD)
    assert _errors(_cfg(data, qwen3_tokenizer_dir, "--rm-type", "math")) == []


def test_no_dataset_with_the_sft_rollout_is_one_error(tmp_path, qwen3_tokenizer_dir):
    # Reproducer: it passed; the first rollout failed "got an empty list" on a prompt that was the empty string.
    data = _write(tmp_path / "sft.jsonl", GOOD)
    errors = _errors(_cfg(data, qwen3_tokenizer_dir, "--disable-rollout-global-dataset"))
    assert "--disable-rollout-global-dataset with the SFT rollout: it trains on the conversations of --prompt-data" in (
        "\n".join(errors)
    )
    builder = ChatLossMask(get_tokenizer(str(qwen3_tokenizer_dir)))
    with pytest.raises(ValueError, match=r"^sample 0: SFT needs a non-empty list of chat messages in --input-key "
                       r"'messages', got str ''$"):  # fmt: skip
        sft_sample(Sample(prompt="", index=0), builder)


def test_several_samples_per_conversation_is_one_error_before_launch(tmp_path, qwen3_tokenizer_dir):
    data = _write(tmp_path / "sft.jsonl", GOOD)
    errors = _errors(_cfg(data, qwen3_tokenizer_dir, "--n-samples-per-prompt", "2", "--global-batch-size", "4"))
    assert "SFT needs --n-samples-per-prompt 1, got 2" in errors


@pytest.mark.parametrize("mask_type", ["qwen", "qwen3", "qwen3_5", "distill_qwen"])
def test_a_role_the_chat_templates_do_not_render_is_one_error_naming_the_message(mask_type, qwen3_tokenizer_dir):
    # Qwen's and DeepSeek-R1-Distill's templates render system, user, assistant and tool turns only: a ShareGPT
    # "human" turn was left out of the rendered text without a word, so A2 was trained as the answer to Q1.
    tokenizer = get_tokenizer(str(qwen3_tokenizer_dir))
    conversation = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "human", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert "Q2" not in rendered  # the template drops the turn (why it must be refused)
    problem = conversation_problem(conversation, mask_type)
    assert problem == (
        "message 2 has the role 'human', which the chat template does not render (it would be left out of the "
        "training text); use system, user, assistant or tool"
    )
    with pytest.raises(ValueError, match=r"^sample 5: message 2 has the role 'human'"):
        sft_sample(Sample(prompt=conversation, index=5), ChatLossMask(tokenizer, mask_type))


@pytest.mark.parametrize("value", [None, "1", "0", 2, 0.5])
def test_a_step_loss_mask_other_than_0_or_1_is_one_error_naming_the_message(value):
    # Any value but 1 meant "not trained" without a word: a JSONL `"step_loss_mask": null` or a CSV-born "1" left
    # the turn out of the loss.
    conversation = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A1", "step_loss_mask": 1},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "step_loss_mask": value},
    ]
    assert conversation_problem(conversation, "qwen") == (
        f"message 3 (assistant) has step_loss_mask {value!r} ({type(value).__name__}); it takes 0 (not trained on) "
        "or 1 (trained on)"
    )


@pytest.mark.parametrize("value", [0, 1, True, False, 1.0])
def test_step_loss_mask_0_or_1_passes(value):
    conversation = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "step_loss_mask": 1},
                    {"role": "assistant", "content": "B", "step_loss_mask": value}]  # fmt: skip
    assert conversation_problem(conversation, "qwen") is None


def test_rollout_hooks_the_sft_rollout_never_calls_are_one_error(tmp_path, qwen3_tokenizer_dir):
    # Reproducer: `--dynamic-sampling-filter-path`, `--rollout-sample-hook-path`, `--custom-rm-path`, ... with the SFT
    # rollout passed the dry run and were never called (the SFT rollout tokenizes conversations; it generates, scores
    # and filters nothing): a user's filter or reward silently had no effect.
    data = _write(tmp_path / "sft.jsonl", GOOD)
    hooks = ("--dynamic-sampling-filter-path", "os.path.join", "--rollout-sample-hook-path", "os.path.join",
             "--custom-rm-path", "os.path.join")  # fmt: skip
    errors = [e for e in _errors(_cfg(data, qwen3_tokenizer_dir, *hooks)) if "never calls" in e]
    assert errors == [
        "--dynamic-sampling-filter-path, --custom-rm-path, --rollout-sample-hook-path with --rollout-function-path "
        "slime.rollout.sft_rollout.generate_rollout: the SFT rollout generates nothing, so it never calls them (nor "
        "does the original's); drop them"
    ]
    # A generating eval function calls the per-sample hooks on the eval samples: only the training-only one is named.
    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"input": "1+1=", "label": "2"}) + "\n")
    generating = "slime.rollout.sglang_rollout.generate_rollout"
    flags = ("--eval-prompt-data", "aime", str(evals), "--eval-input-key", "input", "--eval-label-key", "label",
             "--rollout-max-response-len", "8", "--eval-function-path", generating)  # fmt: skip
    errors = [e for e in _errors(_cfg(data, qwen3_tokenizer_dir, *hooks, *flags)) if "never calls" in e]
    assert [e.split(" with ")[0] for e in errors] == ["--dynamic-sampling-filter-path"]


def test_the_length_limit_measures_a_conversation_as_the_sft_rollout_trains_it(tmp_path, qwen3_tokenizer_dir, caplog):
    # Reproducer: the conversation was measured with the template's generation prompt ("<|im_start|>assistant\n", 3
    # tokens the SFT rollout never adds), so one that fits the limit exactly was dropped ("no prompts left").
    from slime_rollout.data.source import RolloutDataSource

    ids, _ = ChatLossMask(get_tokenizer(str(qwen3_tokenizer_dir)), "qwen").get_loss_mask(GOOD)
    assert len(ids) == 16  # what the SFT rollout trains on
    data = _write(tmp_path / "sft.jsonl", GOOD, GOOD)
    source = RolloutDataSource(_cfg(data, qwen3_tokenizer_dir, "--rollout-max-prompt-len", "16"))
    assert [s.prompt for s in source.prompts] == [GOOD, GOOD]
    with pytest.raises(ValueError, match="no prompts left: all 2 are longer than --rollout-max-prompt-len=15"):
        RolloutDataSource(_cfg(data, qwen3_tokenizer_dir, "--rollout-max-prompt-len", "15"))


def test_a_template_error_on_a_conversation_names_the_sft_rollout(tmp_path, qwen3_tokenizer_dir):
    # It said "(the default generate function renders it)": in an SFT run the SFT rollout renders the conversation.
    from slime_rollout.data.source import RolloutDataSource

    data = _write(tmp_path / "sft.jsonl", GOOD, [GOOD[0], {"role": "assistant"}])
    with pytest.raises(ValueError) as raised:
        RolloutDataSource(_cfg(data, qwen3_tokenizer_dir))
    assert str(raised.value).startswith(
        f"{data} line 2: the chat template (an SFT conversation (the SFT rollout renders it)) failed on this row: "
        "UndefinedError"
    )
