"""Eval rollouts as an original user's plugins and `--eval-config` files expect them (issue 27, plugin pass).

A generate function that marks an eval sample ABORTED (or an engine that aborted its request) left it without a
reward, and the eval failed as "sample 1 has no reward yet", naming neither the dataset nor the generate function.
An original `--eval-config` with `datasets` as a mapping, or with `repetition_penalty`, `skip_special_tokens`,
`no_stop_trim` or `metadata_overrides`, was refused.
"""

import logging
import re

import pytest
from slime_rollout_fakes import FakeClient
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Status
from slime_rollout.generation.eval import eval_datasets, eval_rollout_async
from slime_rollout.generation.rollout import run_rollout

A = ord("A")


async def odd_aborted_generate(args, sample, sampling_params, evaluation=False):
    """Answers "A" (reward 1 with the fakes' reward) for even sample indices, ABORTED for odd ones."""
    if sample.index % 2:
        sample.status = Status.ABORTED
        return sample
    sample.append_response_tokens([A], log_probs=[-0.1], text="A")
    sample.status = Status.COMPLETED
    return sample


async def test_aborted_eval_samples_are_left_out_counted_and_named(use_client, tmp_path, caplog):
    use_client(FakeClient({}))
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "a", "label": "A"}\n{"prompt": "b", "label": "A"}\n')
    path = f"{__name__}.odd_aborted_generate"
    args = _args(eval_prompt_data=["toy", str(data)], input_key="prompt", n_samples_per_eval_prompt=2,
                 custom_generate_function_path=path, log_passrate=True)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="slime_rollout.generation.eval"):
        out = await eval_rollout_async(args, 4)
    # Samples 0 and 2 answered (reward 1), 1 and 3 aborted: pass@k is skipped, the groups are broken; each prompt's
    # one answer is a group of equal rewards (zero_std).
    assert out.metrics == {"eval/toy": 1.0, "eval/toy-truncated_ratio": 0.0, "eval/toy-aborted_ratio": 0.5,
                           "eval/toy/response_len/mean": 1.0, "eval/toy/response_len/median": 1.0,
                           "eval/toy/response_len/max": 1.0, "eval/toy/response_len/min": 1.0,
                           "eval/toy/repetition_frac": 0.0, "eval/toy/truncated_ratio": 0.0,
                           "eval/toy/zero_std/count_1.0": 2.0}  # fmt: skip
    assert [s.index for s in out.data["toy"]["samples"]] == [0, 2] and out.data["toy"]["rewards"] == [1.0, 1.0]
    assert (f"eval 4: dataset toy: 2 of 4 samples came back ABORTED (from --custom-generate-function-path {path}, or "
            "the engine aborted them; samples [1, 3]); they are left out of eval/toy") in caplog.text  # fmt: skip
    assert "--log-passrate: eval toy left samples out (ABORTED); pass@k skipped" in caplog.text


@pytest.mark.parametrize("path", ["slime_rollout.generation.fully_async.generate_rollout_fully_async", None])
def test_a_built_in_eval_function_keeps_its_own_metrics(use_client, tmp_path, path):
    # run_rollout recomputed a built-in's metrics with the global group size: the two answered samples of groups
    # broken by ABORTED ones passed as one whole group of 2, adding the eval/toy-pass@k the function had skipped.
    use_client(FakeClient({}))
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "a", "label": "A"}\n{"prompt": "b", "label": "A"}\n')
    args = _args(eval_prompt_data=["toy", str(data)], input_key="prompt", n_samples_per_eval_prompt=2,
                 custom_generate_function_path=f"{__name__}.odd_aborted_generate", log_passrate=True)  # fmt: skip
    if path:
        args.rollout_function_path = path
    out = run_rollout(args, 4, None, evaluation=True)
    assert out.metrics == {"eval/toy": 1.0, "eval/toy-truncated_ratio": 0.0, "eval/toy-aborted_ratio": 0.5,
                           "eval/toy/response_len/mean": 1.0, "eval/toy/response_len/median": 1.0,
                           "eval/toy/response_len/max": 1.0, "eval/toy/response_len/min": 1.0,
                           "eval/toy/repetition_frac": 0.0, "eval/toy/truncated_ratio": 0.0,
                           "eval/toy/zero_std/count_1.0": 2.0}  # fmt: skip


@pytest.fixture
def one_prompt(use_client, tmp_path):
    """`eval.jsonl` holding one prompt "a" labelled "A"; the engine is a fake (the generate plugins answer)."""
    use_client(FakeClient({}))
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "a", "label": "A"}\n')
    return data


async def answer_a(args, sample, sampling_params, evaluation=False):
    sample.metadata["params"] = dict(sampling_params)
    sample.append_response_tokens([A], log_probs=[-0.1], text="A")
    sample.status = Status.COMPLETED
    return sample


async def test_an_original_eval_config_mapping_with_its_engine_keys_and_metadata_overrides(one_prompt, tmp_path):
    # The original's EvalDatasetConfig takes `datasets` as a mapping keyed by name, repetition_penalty,
    # skip_special_tokens, no_stop_trim and metadata_overrides; each was refused here ("expected a mapping, got str",
    # "unknown key(s)").
    data = one_prompt
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  defaults: {repetition_penalty: 1.1, no_stop_trim: false}\n"
        "  datasets:\n"
        f"    first: {{path: {data}, skip_special_tokens: true, metadata_overrides: {{source: x, level: 3}}}}\n"
        f"    second: {{path: {data}, n_samples_per_eval_prompt: 2}}\n"
    )
    args = _args(eval_config=str(config), input_key="prompt", custom_generate_function_path=f"{__name__}.answer_a")
    out = await eval_rollout_async(args, 0)
    assert sorted(out.data) == ["first", "second"] and out.metrics["eval/first"] == out.metrics["eval/second"] == 1.0
    first, second = out.data["first"]["samples"], out.data["second"]["samples"]
    assert len(first) == 1 and len(second) == 2
    params = first[0].metadata["params"]
    assert (params["repetition_penalty"], params["no_stop_trim"], params["skip_special_tokens"]) == (1.1, False, True)
    assert second[0].metadata["params"]["skip_special_tokens"] is False  # --rollout-skip-special-tokens' default
    assert first[0].metadata["source"] == "x" and first[0].metadata["level"] == 3 and "level" not in second[0].metadata


async def answer_boxed_three(args, sample, sampling_params, evaluation=False):
    sample.append_response_tokens([A], log_probs=[-0.1], text=r"so the answer is \boxed{\frac{6}{2}}")
    sample.status = Status.COMPLETED
    return sample


async def test_an_eval_config_rm_type_overrides_the_rows_metadata(use_client, tmp_path):
    # The original's EvalDatasetConfig.inject_metadata sets metadata["rm_type"] = the dataset's rm_type (entry or
    # eval.defaults) over what a row carries; the row's won here, so a training file reused for eval with
    # `rm_type: math` was graded by its rows' own type (here f1, which reads \frac{6}{2} as no match for 3: 0.0).
    use_client(FakeClient({}))
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "1+2?", "label": "3", "metadata": {"rm_type": "f1"}}\n')
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  defaults: {rm_type: math}\n"
        "  datasets:\n"
        f"    by_default: {{path: {data}}}\n"
        f"    by_entry: {{path: {data}, rm_type: math}}\n"
    )
    common = dict(input_key="prompt", label_key="label", custom_rm_path=None, rm_num_workers=0,
                  custom_generate_function_path=f"{__name__}.answer_boxed_three")  # fmt: skip
    out = await eval_rollout_async(_args(eval_config=str(config), **common), 0)
    assert out.data["by_default"]["samples"][0].metadata["rm_type"] == "math"
    assert out.metrics["eval/by_default"] == out.metrics["eval/by_entry"] == 1.0
    # Without a dataset rm_type (--eval-prompt-data), the row's own type is read, before --rm-type: as the original.
    out = await eval_rollout_async(_args(eval_prompt_data=["by_row", str(data)], rm_type="math", **common), 0)
    assert out.data["by_row"]["samples"][0].metadata["rm_type"] == "f1"
    assert out.metrics["eval/by_row"] == 0.0


async def test_eval_temperature_zero_asks_the_engine_for_greedy_samples(one_prompt):
    # --eval-temperature 0 (greedy eval, which the original takes as a bare float) was refused at validation.
    data = one_prompt
    args = _args(eval_prompt_data=["greedy", str(data)], eval_temperature=0.0, input_key="prompt",
                 custom_generate_function_path=f"{__name__}.answer_a")  # fmt: skip
    out = await eval_rollout_async(args, 0)
    assert out.data["greedy"]["samples"][0].metadata["params"]["temperature"] == 0.0
    assert out.metrics["eval/greedy"] == 1.0


async def test_template_kwargs_holding_lists_or_dicts_are_read(one_prompt):
    # The eval prompts are cached per (file, keys, template kwargs, ...); kwargs holding a list or a dict (a RAG
    # template's `documents`, a tools order) made that key unhashable: "TypeError: unhashable type: 'list'", naming
    # nothing. The original keys its cache by the kwargs' JSON.
    from pathlib import Path

    data = one_prompt
    kwargs = {"enable_thinking": False, "documents": [{"title": "t", "text": "x"}], "extra": {"k": [1, 2]}}
    args = _args(eval_prompt_data=["kw", str(data)], input_key="prompt", apply_chat_template=True,
                 apply_chat_template_kwargs=kwargs, custom_generate_function_path=f"{__name__}.answer_a")  # fmt: skip
    args.hf_checkpoint = str(Path(__file__).parents[1] / "fixtures" / "qwen3-tokenizer")
    out = await eval_rollout_async(args, 0)
    prompt = out.data["kw"]["samples"][0].prompt
    assert prompt == "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"  # not thinking


def test_an_eval_config_template_kwarg_the_rollout_sets_itself_is_named(tmp_path):
    from slime_rollout.generation.eval import eval_datasets

    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n  datasets:\n"
        "    - {name: d, path: d.jsonl, apply_chat_template_kwargs: {add_generation_prompt: false}}\n"
    )
    with pytest.raises(ValueError, match=r"eval.datasets\[0\]: apply_chat_template_kwargs: 'add_generation_prompt' "
                                         r"is an apply_chat_template argument the rollout sets itself"):  # fmt: skip
        eval_datasets(_args(eval_config=str(config)))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("n_samples_per_eval_prompt: 4x", "n_samples_per_eval_prompt must be an integer >= 1, got '4x'"),
        ("n_samples_per_eval_prompt: 0", "n_samples_per_eval_prompt must be an integer >= 1, got 0"),
        ("temperature: hot", r"temperature must be a number >= 0 \(0: greedy\), got 'hot'"),
        ("max_response_len: -5", "max_response_len must be an integer >= 1, got -5"),
        ("top_p: 2", r"top_p must be a number in \(0, 1\], got 2"),
        ("stop_token_ids: [1, x]", r"stop_token_ids must be a list of token ids, got \[1, 'x'\]"),
    ],
)
def test_an_eval_config_value_is_checked_where_the_file_is_read(tmp_path, entry, message):
    # Each was taken as given: "4x" failed in int() at the first eval naming nothing, 0 samples per prompt dropped
    # the dataset as "every prompt was dropped", "hot" and -5 reached the engine (an HTTP 400 mid-eval).
    from slime_rollout.generation.eval import eval_datasets

    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  datasets:\n    - {{name: d, path: d.jsonl, {entry}}}\n")
    with pytest.raises(ValueError, match=rf"^--eval-config {re.escape(str(config))}: eval.datasets\[0\]: {message}$"):
        eval_datasets(_args(eval_config=str(config)))
    config.write_text(f"eval:\n  defaults: {{{entry}}}\n  datasets:\n    - {{name: d, path: d.jsonl}}\n")
    with pytest.raises(ValueError, match=rf"^--eval-config {re.escape(str(config))}: eval.defaults: {message}$"):
        eval_datasets(_args(eval_config=str(config)))


def test_an_omegaconf_interpolation_in_an_eval_config_is_named(tmp_path):
    # The original reads --eval-config with OmegaConf, which resolves `${data_root}`; read as plain YAML here, the
    # path stayed "${data_root}/aime.jsonl" and the run said "file not found" about a path the user never wrote.
    config = tmp_path / "eval.yaml"
    config.write_text("data_root: /data\neval:\n  datasets:\n    - {name: aime, path: '${data_root}/aime.jsonl'}\n")
    with pytest.raises(ValueError) as raised:
        eval_datasets(_args(eval_config=str(config)))
    assert str(raised.value) == (
        f"--eval-config {config}: eval.datasets[0]: path '${{data_root}}/aime.jsonl' holds an OmegaConf "
        "interpolation, which is not resolved here (the original reads --eval-config with OmegaConf); write the "
        "value itself"
    )


def test_a_misspelt_eval_section_key_is_named(tmp_path):
    # `default:` (for `defaults:`) was read by neither version: its temperature and length were left out unsaid.
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+2?", "label": "3"}\n')
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  default: {{temperature: 0.1}}\n  datasets:\n    - {{name: d, path: {data}}}\n")
    with pytest.raises(ValueError) as raised:
        eval_datasets(_args(eval_config=str(config)))
    assert str(raised.value) == (
        f"--eval-config {config}: unknown key(s) ['default'] under eval (known: datasets, defaults)"
    )


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("{video: videos}", r"media type 'video' is not implemented \(supported: image\)"),
        ('{image: ""}', r"'image' must name a dataset column, got ''"),
        ("'[1]'", "expected a JSON object, got list"),
    ],
)
def test_an_eval_config_dataset_multimodal_keys_are_checked_as_the_flag(tmp_path, keys, message):
    # The dataset's own multimodal_keys skipped --multimodal-keys' checks: a video column was dropped without a
    # word (the prompts ran text-only), a JSON string failed with AttributeError at the first eval.
    config = tmp_path / "eval.yaml"
    config.write_text(f"eval:\n  datasets:\n    - {{name: g, path: g.jsonl, multimodal_keys: {keys}}}\n")
    with pytest.raises(ValueError, match=rf"^--eval-config {re.escape(str(config))} dataset 'g' multimodal_keys"):
        eval_datasets(_args(eval_config=str(config), apply_chat_template=True))
    with pytest.raises(ValueError, match=message):
        eval_datasets(_args(eval_config=str(config), apply_chat_template=True))


def test_an_eval_config_dataset_with_images_needs_the_chat_template(tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text(
        'eval:\n  defaults: {multimodal_keys: \'{"image": "images"}\'}\n  datasets:\n    - {name: g, path: g.jsonl}\n'
    )
    with pytest.raises(ValueError, match=r"eval.defaults multimodal_keys needs --apply-chat-template"):
        eval_datasets(_args(eval_config=str(config)))
    (dataset,) = eval_datasets(_args(eval_config=str(config), apply_chat_template=True))
    assert dataset["multimodal_keys"] == {"image": "images"}  # the JSON text, parsed as the flag's is


async def test_an_eval_config_response_length_needs_no_rollout_flag(one_prompt, tmp_path):
    # The original resolves an eval dataset's max_response_len entry → eval.defaults → --eval-max-response-len →
    # --rollout-max-response-len; here the flags were required first, so an eval-only run (--num-rollout 0) whose
    # --eval-config gives the length failed with "--rollout-max-response-len is required (or --eval-max-response-len)".
    data = one_prompt
    config = tmp_path / "eval.yaml"
    config.write_text(
        "eval:\n"
        "  defaults: {max_response_len: 16}\n"
        "  datasets:\n"
        f"    - {{name: by_default, path: {data}}}\n"
        f"    - {{name: by_entry, path: {data}, max_response_len: 4}}\n"
    )
    common = dict(input_key="prompt", num_rollout=0, eval_interval=1,
                  custom_generate_function_path=f"{__name__}.answer_a")  # fmt: skip
    out = await eval_rollout_async(_args(eval_config=str(config), rollout_max_response_len=None, **common), 0)
    assert out.data["by_default"]["samples"][0].metadata["params"]["max_new_tokens"] == 16
    assert out.data["by_entry"]["samples"][0].metadata["params"]["max_new_tokens"] == 4
    # A dataset that no setting gives a length is one error naming it and where the length may come from.
    config.write_text(f"eval:\n  datasets:\n    - {{name: bare, path: {data}}}\n")
    with pytest.raises(ValueError, match=re.escape(
        f"--eval-config {config} dataset 'bare': no response length: set its max_response_len (or eval.defaults'), "
        "--eval-max-response-len or --rollout-max-response-len"
    )):  # fmt: skip
        eval_datasets(_args(eval_config=str(config), rollout_max_response_len=None, **common))


def shaped_reward(args, sample):
    """A shaped reward (0.5) that keeps the unshaped one (1.0) for the training curve, as `metadata["raw_reward"]`."""
    sample.metadata["raw_reward"] = 1.0
    return 0.5


async def test_eval_scores_are_the_rewards_not_the_training_curves_raw_reward(one_prompt):
    # The original's eval reads `sample.reward` (its `--eval-reward-key` entry); `metadata["raw_reward"]` is what
    # its rollout/raw_reward shows for training samples. Here the eval took the metadata's, so eval/<name> showed
    # 1.0 where the original's shows 0.5.
    data = one_prompt
    args = _args(eval_prompt_data=["toy", str(data)], input_key="prompt", custom_rm_path=f"{__name__}.shaped_reward",
                 custom_generate_function_path=f"{__name__}.answer_a")  # fmt: skip
    out = await eval_rollout_async(args, 0)
    assert out.data["toy"]["rewards"] == [0.5] and out.metrics["eval/toy"] == 0.5


def test_an_eval_dataset_name_with_a_slash_is_refused_naming_where_it_came_from(tmp_path):
    # `eval/a/b/response_len/mean` read back as statistic "b/response_len/mean" of a dataset "a" (summary, curve).
    with pytest.raises(ValueError, match=r"^--eval-prompt-data: eval dataset name 'math/gsm8k' contains '/'"):
        eval_datasets(_args(eval_prompt_data=["math/gsm8k", "d.jsonl"]))
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - {name: a/b, path: d.jsonl}\n")
    with pytest.raises(ValueError, match=rf"^--eval-config {re.escape(str(config))}: eval dataset name 'a/b'"):
        eval_datasets(_args(eval_config=str(config)))
    assert [d["name"] for d in eval_datasets(_args(eval_prompt_data=["math-gsm8k", "d.jsonl"]))] == ["math-gsm8k"]
