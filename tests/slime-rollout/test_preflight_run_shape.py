"""slime-rollout's preflight checks of the run's shape: response budgets, eval-only runs, runs without a global
dataset, eval configs without datasets, chat-template kwargs and the reward types rows name.

Rows, labels, images and engine flags are in `test_preflight.py`; both build configs with `slime_preflight_helpers`.
"""

import pytest
from slime_preflight_helpers import _cfg, _errors, _write

from slime_core.config import parse_args
from slime_rollout.preflight import check


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        ([], True),
        (["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async"], True),
        (["--rollout-max-response-len", "8"], False),
        (["--debug-train-only"], False),  # no engine request
    ],
)
def test_the_built_in_rollout_needs_a_response_budget_before_the_run_starts(tmp_path, extra, refused):
    # Without --rollout-max-response-len the run started Ray, the engines and the trainer, then stopped at its first
    # rollout ("--rollout-max-response-len is required"); the original subtracted from None there.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    args = ["--train-backend", "fsdp", "--prompt-data", str(data), "--input-key", "prompt", "--label-key", "label",
            "--rm-type", "math", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
            "--actor-num-gpus-per-node", "1", *extra]  # fmt: skip
    errors = _errors(parse_args(args))
    path = (
        extra[1]
        if extra and extra[0] == "--rollout-function-path"
        else "slime_rollout.generation.rollout.generate_rollout"
    )
    expected = [
        f"--rollout-max-response-len is not set: the rollout ({path}) sends it to the engines as max_new_tokens; give "
        "the longest response to generate, e.g. --rollout-max-response-len 1024"
    ]
    assert errors == (expected if refused else [])


@pytest.mark.parametrize(("extra", "refused"), [([], True), (["--eval-max-response-len", "8"], False)])
def test_an_eval_only_run_needs_only_the_eval_response_budget(tmp_path, extra, refused):
    # --num-rollout 0 with --eval-interval (the original's eval-only run) sends no training request: its eval takes
    # --eval-max-response-len, so the training rollout's budget is not asked for (it was refused without one); with
    # neither, the one error is the eval's.
    data = _write(tmp_path / "aime.jsonl", {"prompt": "1+1=", "label": "2"})
    args = ["--train-backend", "fsdp", "--input-key", "prompt", "--label-key", "label", "--rm-type", "math",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "0", "--eval-interval", "1",
            "--eval-prompt-data", "aime", str(data), "--actor-num-gpus-per-node", "1", *extra]  # fmt: skip
    errors = _errors(parse_args(args))
    message = "--eval-prompt-data dataset 'aime': no response length: set --eval-max-response-len or "
    assert errors == ([message + "--rollout-max-response-len"] if refused else [])


async def make_prompt(args, sample, sampling_params):
    """A generate function that makes its own prompt (what --disable-rollout-global-dataset runs need)."""
    return sample


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        ([], True),
        (["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async"], True),
        (["--custom-generate-function-path", f"{__name__}.make_prompt"], False),
        (["--rollout-function-path", f"{__name__}.make_prompt"], False),  # a rollout function of one's own
    ],
)
def test_no_global_dataset_needs_something_that_makes_the_prompts(extra, refused):
    # With --disable-rollout-global-dataset the data source hands out empty samples; the default generate function
    # sent them as they were and the run stopped at its first rollout on the engine's "the prompt is empty".
    args = ["--train-backend", "fsdp", "--disable-rollout-global-dataset", "--rm-type", "math",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
            "--rollout-max-response-len", "8", "--actor-num-gpus-per-node", "1", *extra]  # fmt: skip
    expected = (
        "--disable-rollout-global-dataset: the data source serves empty prompts, which the default generate function "
        "would send to the engines as they are; give --custom-generate-function-path (it makes each prompt), a "
        "--data-source-path or a --rollout-function-path, or drop the flag and give --prompt-data"
    )
    assert _errors(parse_args(args)) == ([expected] if refused else [])


@pytest.mark.parametrize("yaml_text", ["eval:\n  defaults: {max_response_len: 8}\n", "eval:\n  datasets: []\n"])
def test_an_eval_config_without_datasets_is_one_error_before_launch(tmp_path, yaml_text):
    # The original refuses it when reading the config; here it passed, and the run stopped at its first eval (before
    # training) with "eval rollout needs --eval-prompt-data name path [...] or --eval-config", the flag given.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    config = tmp_path / "eval.yaml"
    config.write_text(yaml_text)
    flags = ("--rm-type", "math", "--eval-interval", "1", "--eval-config", str(config))
    assert _errors(_cfg(data, *flags)) == [f"--eval-config {config}: no datasets under eval.datasets (nor "
                                           "--eval-prompt-data)"]  # fmt: skip
    # Its defaults for the datasets of --eval-prompt-data alone are a valid use (both are evaluated here).
    assert _errors(_cfg(data, *flags, "--eval-prompt-data", "d", str(data))) == []


@pytest.mark.parametrize(
    ("kwargs", "unread"),
    [('{"enable_thinking": false}', None), ('{"enable_thinkng": false}', "'enable_thinkng'"),
     ('{"enable_thinking": false, "documents": [], "reasoning": "low"}', "'documents', 'reasoning'")],
)  # fmt: skip
def test_template_kwargs_the_chat_template_never_reads_are_said(tmp_path, qwen3_tokenizer_dir, kwargs, unread):
    # apply_chat_template hands every kwarg to the template, which ignores one it does not name: a misspelt key (or a
    # switch the model's template does not have) left the prompts as they were, without a word.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"})
    flags = ("--rm-type", "math", "--hf-checkpoint", str(qwen3_tokenizer_dir), "--apply-chat-template",
             "--apply-chat-template-kwargs", kwargs)  # fmt: skip
    notes = [p.message for p in check(_cfg(data, *flags)) if p.severity == "note" and "reads no" in p.message]
    assert notes == ([] if unread is None else [
        f"--apply-chat-template-kwargs: the chat template of --hf-checkpoint {qwen3_tokenizer_dir} reads no {unread}, "
        "so it has no effect on the prompts (check the spelling and the model)"
    ])  # fmt: skip


def test_reward_types_the_rows_name_are_checked_as_rm_type_is(tmp_path):
    # A mixed-source file's rows pick their reward (metadata rm_type); only --rm-type's record was checked, so a
    # remote_rm row without --rm-url, or a dapo row (a score dict) without a --reward-key that picks a number of it,
    # stopped the run after its first rollout.
    data = _write(tmp_path / "d.jsonl", {"prompt": "1+1=", "label": "2"},
                  {"prompt": "1+2=", "label": "3", "metadata": {"rm_type": "remote_rm"}},
                  {"prompt": "1+3=", "label": "4", "metadata": {"rm_type": "boxed_dapo"}})  # fmt: skip
    where = f"--prompt-data {data}: rows of rm_type"
    assert _errors(_cfg(data, "--rm-type", "math")) == [
        f"{where} dapo: its reward is a dict {{'score': 1.0 or -1.0, 'acc': True or False, 'pred': the answer}}; "
        "--reward-key is not set: set --reward-key score (the DAPO recipe's) or acc",
        f"{where} remote_rm call a reward service: set --rm-url http://host:port/path",
    ]
    assert _errors(_cfg(data, "--rm-type", "math", "--rm-url", "http://rm:8000/score", "--reward-key", "score")) == []
    # An eval dataset's rewards are read with --eval-reward-key (else --reward-key): that one must pick the number.
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  datasets:\n    - {{name: dapo_eval, path: {data}, rm_type: dapo}}\n")
    flags = ("--rm-type", "math", "--eval-interval", "1", "--eval-config", str(config))
    train = _write(tmp_path / "t.jsonl", {"prompt": "1+1=", "label": "2"})
    (error,) = _errors(_cfg(train, *flags))
    assert error.startswith(f"--eval-config {config} dataset 'dapo_eval' {data}: rows of rm_type dapo: its reward")
    assert _errors(_cfg(train, *flags, "--eval-reward-key", "score")) == []
    assert _errors(_cfg(train, "--rm-type", "math", "--eval-config", str(config))) == []  # no --eval-interval: no eval
