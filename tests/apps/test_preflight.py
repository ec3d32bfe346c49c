"""Bad config or data fails before anything starts, with one line naming the flag, file and row.

The row, label, image and --sglang-*/--router-* checks are slime-rollout's own (tests/slime-rollout/test_preflight.py);
here the app runs them and raises their errors with their exception class.
"""

import json
import pathlib
import re

import pytest

from slime_app.demo import MODEL_DIR as MODEL
from slime_app.preflight import PLUGIN_FIELDS, preflight
from slime_core.config import SlimeArgs, parse_args

REPO = pathlib.Path(__file__).resolve().parents[2]


def _args(data: pathlib.Path, *extra: str, model: pathlib.Path | None = MODEL):
    return parse_args(
        ["--train-backend", "fsdp", *(["--hf-checkpoint", str(model)] if model else []), "--prompt-data", str(data),
         "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2",
         "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "1",
         "--rollout-max-response-len", "8", "--actor-num-gpus-per-node", "1", *extra]
    )  # fmt: skip


def test_missing_files_name_the_flag(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    preflight(_args(data))  # valid
    with pytest.raises(FileNotFoundError, match="--prompt-data: file not found"):
        preflight(_args(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match="--eval-prompt-data: file not found"):
        preflight(_args(data, "--eval-prompt-data", "e", str(tmp_path / "nope.jsonl")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"--prompt-data: .*bad\.jsonl:2: invalid JSON"):
        preflight(_args(bad))
    with pytest.raises(ValueError, match=r"--eval-prompt-data: .*bad\.jsonl:2: invalid JSON"):
        preflight(_args(data, "--eval-prompt-data", "e", str(bad)))
    with pytest.raises(FileNotFoundError, match=r"not a directory: Qwen/Qwen3-4B \(a Hugging Face Hub id\? "):
        preflight(_args(data, "--hf-checkpoint", "Qwen/Qwen3-4B"))


def test_a_run_without_hf_checkpoint_fails_before_it_starts(tmp_path):
    # Issue 27: without --hf-checkpoint the dry run passed and the run started Ray and the trainer, then died with
    # the engine host's traceback ("launching engines needs --hf-checkpoint").
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    with pytest.raises(ValueError) as e:
        preflight(_args(data, model=None), hardware=False)
    assert str(e.value) == (
        "--hf-checkpoint is required (the engines slime starts serve it and the trainer builds the model and "
        "tokenizer from it): a local Hugging Face model directory"
    )
    with pytest.raises(ValueError, match=r"^--hf-checkpoint is required \(the engines slime starts serve it\):"):
        preflight(_args(data, "--debug-rollout-only", model=None), hardware=False)
    with pytest.raises(ValueError, match=r"^--hf-checkpoint is required \(the trainer builds the model and"):
        preflight(_args(data, "--rollout-engine-urls", "http://127.0.0.1:1", model=None), hardware=False)


def test_trainer_side_opd_teacher_of_another_architecture_is_one_line(tmp_path, make_tiny_qwen3):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    teacher = make_tiny_qwen3(tmp_path / "teacher")  # the real Qwen3 vocabulary; the demo model's is tiny
    opd = ("--use-opd", "--opd-type", "fsdp", "--opd-kl-coef", "1.0")
    with pytest.raises(ValueError, match=r"--opd-teacher-load .*teacher: the trainer-side teacher must have the "
                       r"student's .*vocab_size: teacher 151936 vs student \d+"):  # fmt: skip
        preflight(_args(data, *opd, "--opd-teacher-load", str(teacher)))
    preflight(_args(data, *opd, "--opd-teacher-load", str(MODEL)))  # the same architecture


def test_megatron_without_cuda_is_a_one_line_error(tmp_path, monkeypatch):
    import torch

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    args = _args(data).model_copy(update={"train_backend": "megatron"})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--train-backend megatron needs CUDA GPUs.*--train-backend fsdp"):
        preflight(args)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    preflight(args)  # on a GPU machine the same config passes
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    preflight(args)  # a remote cluster: its GPUs are not visible from the driver


def _plugin_module(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_plugin_paths_resolve_before_anything_starts(tmp_path, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    _plugin_module(tmp_path, monkeypatch, "pf_plugins", "def reward_func(args, sample, **kw):\n    return 1.0\n")
    preflight(_args(data, "--custom-rm-path", "pf_plugins.reward_func"))  # resolves
    with pytest.raises(ImportError, match="--custom-rm-path: module 'pf_plugins' has no attribute 'reward_fn'"):
        preflight(_args(data, "--custom-rm-path", "pf_plugins.reward_fn"))
    with pytest.raises(ImportError, match="--dynamic-sampling-filter-path: module 'pf_nope' not found"):
        preflight(_args(data, "--dynamic-sampling-filter-path", "pf_nope.keep"))


def test_an_eval_config_dataset_s_own_plugins_resolve_before_anything_starts(tmp_path, monkeypatch):
    # Reproducer: a dataset's `custom_rm_path: nope_mod.rm` passed the dry run; the run stopped at its first eval
    # (with --skip-eval-before-train, after --eval-interval rollouts of training).
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    _plugin_module(tmp_path, monkeypatch, "pf_eval", "async def gen(args, sample):\n    pass\n")
    config = tmp_path / "eval.yaml"

    def eval_config(**paths):
        entry = {"name": "toy", "path": str(data), "input_key": "prompt", "label_key": "label", **paths}
        config.write_text(json.dumps({"eval": {"datasets": [entry]}}))  # JSON is YAML
        return _args(data, "--eval-config", str(config), "--rm-type", "math")

    where = f"--eval-config {config} dataset 'toy'"
    with pytest.raises(ImportError, match=re.escape(f"{where} custom_rm_path: module 'nope_mod' not found")):
        preflight(eval_config(custom_rm_path="nope_mod.rm"))
    with pytest.raises(ImportError, match=re.escape(
        f"{where} custom_generate_function_path pf_eval.gen: its signature (args, sample) cannot take the run's call"
    )):  # fmt: skip
        preflight(eval_config(custom_generate_function_path="pf_eval.gen"))


@pytest.mark.parametrize(
    ("flag", "body", "message"),
    [
        (
            "--custom-generate-function-path",
            "async def gen(args, sample):\n    pass\n",
            r"--custom-generate-function-path pf_sig\.gen: its signature \(args, sample\) cannot take the run's call "
            r"\(args, sample, sampling_params\) \(too many positional arguments\)",
        ),
        (
            "--custom-rm-path",
            "async def gen(sample, **kwargs):\n    pass\n",
            r"--custom-rm-path pf_sig\.gen: its signature \(sample, \*\*kwargs\) cannot take .*too many positional",
        ),
        (
            "--rollout-function-path",
            "def gen(args, rollout_id, data_source):\n    pass\n",
            r"--rollout-function-path pf_sig\.gen: .*unexpected keyword argument 'evaluation'",
        ),
        ("--custom-tis-function-path", "def gen(args, pg_loss, **kw):\n    pass\n", None),
        ("--buffer-filter-path", "def gen(args, rollout_id, buffer, num_samples, extra=1):\n    pass\n", None),
        # The original passes a hook only the keywords it declares: (args, sample) is a valid hook (was refused).
        ("--rollout-sample-hook-path", "def gen(args, sample):\n    pass\n", None),
        # Keywords the run passes when declared, keyword-only and required here: refused although the run passes
        # them (slime_core.algorithms.drgrpo, which the run trained with, was refused as `--dry-run`'s one error).
        ("--custom-pg-loss-reducer-function-path", "from slime_core.algorithms import drgrpo as gen\n", None),
        (
            "--custom-generate-function-path",
            "async def gen(args, sample, sampling_params, *, evaluation):\n    pass\n",
            None,
        ),
        ("--rollout-sample-hook-path", "def gen(args, sample, *, rollout_id):\n    pass\n", None),
        (
            "--custom-pg-loss-reducer-function-path",
            "def gen(total_lengths, response_lengths, loss_masks, per_token, *, cfg):\n    pass\n",
            r"cannot take the run's call .*missing a required keyword-only argument: 'cfg'",
        ),
    ],
)
def test_plugin_signatures_are_checked_against_the_runs_call(tmp_path, monkeypatch, flag, body, message):
    # The call would otherwise fail mid-run as a TypeError in a Ray worker, without naming the flag.
    import sys

    from slime_core.plugins import forget_loaded_plugins

    sys.modules.pop("pf_sig", None)
    forget_loaded_plugins()  # loads are cached per (path, flag): several cases give one flag pf_sig.gen
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    _plugin_module(tmp_path, monkeypatch, "pf_sig", body)
    extra = ("--use-tis",) if "tis" in flag else ()
    if message is None:
        preflight(_args(data, flag, "pf_sig.gen", *extra))
    else:
        with pytest.raises(ImportError, match=message):
            preflight(_args(data, flag, "pf_sig.gen", *extra))


@pytest.mark.parametrize(
    ("flag", "body"),
    [
        ("--custom-advantage-function-path", "async def gen(args, rollout_data):\n    pass\n"),
        ("--custom-reward-post-process-path", "async def gen(args, samples):\n    return [], []\n"),
        ("--custom-loss-function-path", "async def gen(args, batch, logits, sum_of_sample_mean):\n    pass\n"),
        ("--custom-tis-function-path", "async def gen(args, pg_loss, **kw):\n    pass\n"),
        ("--custom-pg-loss-reducer-function-path", "async def gen(a, b, c, d):\n    pass\n"),
        ("--buffer-filter-path", "async def gen(args, rollout_id, buffer, num_samples):\n    pass\n"),
    ],
)
def test_an_async_plugin_the_run_calls_synchronously_is_one_line(tmp_path, monkeypatch, flag, body):
    # Reproducer: an `async def` advantage function passed preflight; the first train step failed with
    # "did not set rollout_data['advantages']" (its coroutine never ran) and a "never awaited" warning.
    import sys

    from slime_core.plugins import forget_loaded_plugins

    sys.modules.pop("pf_async", None)
    forget_loaded_plugins()
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    _plugin_module(tmp_path, monkeypatch, "pf_async", body)
    extra = ("--use-tis",) if "tis" in flag else ("--loss-type", "custom_loss") if "loss-function" in flag else ()
    with pytest.raises(ImportError, match=re.escape(
        f"{flag} pf_async.gen: it is an async def, but the run calls it synchronously and uses its value at once (as "
        "the original does): make it a plain def"
    )):  # fmt: skip
        preflight(_args(data, flag, "pf_async.gen", *extra))


def test_async_plugins_the_run_awaits_pass(tmp_path, monkeypatch):
    import sys

    from slime_core.plugins import forget_loaded_plugins

    sys.modules.pop("pf_awaited", None)
    forget_loaded_plugins()
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    body = "async def filt(args, samples):\n    return True\nasync def log(rollout_id, args, s, m, t):\n    pass\n"
    _plugin_module(tmp_path, monkeypatch, "pf_awaited", body)
    preflight(_args(data, "--dynamic-sampling-filter-path", "pf_awaited.filt", "--rollout-sample-filter-path",
                    "pf_awaited.filt", "--custom-rollout-log-function-path", "pf_awaited.log"))  # fmt: skip


@pytest.mark.parametrize("reducer", ["slime_core.algorithms.drgrpo", "slime_core.algorithms.reducers.drgrpo"])
def test_the_drgrpo_reducer_is_checked_against_the_flags_before_the_run(tmp_path, reducer):
    # Its factory raises at the first train step with --calculate-per-token-loss (after Ray, the engines and a
    # rollout); --dry-run passed it. Without the flag it is accepted: the run trains with it.
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    preflight(_args(data, "--custom-pg-loss-reducer-function-path", reducer))
    with pytest.raises(ValueError, match=re.escape(
        f"--custom-pg-loss-reducer-function-path {reducer}: Dr.GRPO divides by the constant "
        "--rollout-max-response-len, and --calculate-per-token-loss would divide by the token count as well: drop "
        "--calculate-per-token-loss"
    )):  # fmt: skip
        preflight(_args(data, "--custom-pg-loss-reducer-function-path", reducer, "--calculate-per-token-loss"))


def test_every_plugin_field_has_a_call_shape_and_the_defaults_bind():
    from slime_app.preflight import PLUGIN_CALLS, check_plugin_call
    from slime_rollout.plugins import load_function

    assert set(PLUGIN_CALLS) == set(PLUGIN_FIELDS)
    defaults = SlimeArgs(hf_checkpoint="unused", rollout_batch_size=1, num_rollout=1)
    for field in PLUGIN_FIELDS:
        path = getattr(defaults, field)
        if isinstance(path, str) and path:
            check_plugin_call(load_function(path), field, field, path)  # raises on a mismatch


def test_plugin_whose_dependency_is_missing_fails_here_unless_the_cluster_is_remote(tmp_path, monkeypatch, caplog):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    body = "import pf_gpu_only_dep\n\ndef gen(args, sample, p):\n    pass\n"
    _plugin_module(tmp_path, monkeypatch, "pf_gpu_plugin", body)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # A local run's workers share this environment: the import error is one line here, not 200 s into the run.
    expected = (
        r"--custom-generate-function-path: importing module 'pf_gpu_plugin' failed at .*pf_gpu_plugin.py:1: "
        r"No module named 'pf_gpu_only_dep' \(install it in this environment"
    )
    with pytest.raises(ImportError, match=expected):
        preflight(_args(data, "--custom-generate-function-path", "pf_gpu_plugin.gen"))
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    with caplog.at_level("WARNING"):
        preflight(_args(data, "--custom-generate-function-path", "pf_gpu_plugin.gen"))
    assert "left to the workers" in caplog.text and "pf_gpu_plugin" in caplog.text


def test_original_slime_paths_resolve_through_the_runs_mapping(tmp_path, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    original = [
        "--dynamic-sampling-filter-path", "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        "--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout",
        "--custom-rm-path", "slime.rollout.rm_hub.async_rm",
        "--rollout-sample-hook-path", "slime.rollout.rm_hub.async_rm",
    ]  # fmt: skip
    preflight(_args(data, *original))
    # Without the slime-compat package the run's alias table still resolves them: preflight uses the same loader.
    import slime_rollout.plugins as run_loader
    from slime_core.plugins import load_function as core_load

    for path in run_loader.ORIGINAL_PATH_ALIASES:
        assert run_loader.load_function(path, flag="x") is core_load(run_loader.ORIGINAL_PATH_ALIASES[path], flag="x")


def test_plugin_importing_the_originals_training_stack_is_one_line(tmp_path, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    body = "from slime.agent.sandbox import Sandbox\n\nasync def gen(args, sample, p):\n    pass\n"
    _plugin_module(tmp_path, monkeypatch, "pf_agent_plugin", body)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # even for a remote cluster
    # slime.agent holds only the OpenAI adapter (slime_rollout.agent); the sandbox is the original's own.
    with pytest.raises(
        ImportError, match=r"No module named 'slime.agent.sandbox'.*not slime.agent.sandbox \(MIGRATION.md"
    ):
        preflight(_args(data, "--custom-generate-function-path", "pf_agent_plugin.gen"))


def test_chat_template_flag_needs_a_template(tmp_path, stub_weights):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    with pytest.raises(ValueError, match=r"--apply-chat-template: the tokenizer of --hf-checkpoint .*model has no"):
        preflight(_args(data, "--apply-chat-template"))  # the demo model has no template
    qwen3 = tmp_path / "qwen3"
    qwen3.mkdir()
    (qwen3 / "config.json").write_text((MODEL / "config.json").read_text())
    tok = REPO / "tests" / "fixtures" / "qwen3-tokenizer" / "tokenizer_config.json"
    (qwen3 / "tokenizer_config.json").write_text(tok.read_text())
    stub_weights(qwen3)
    preflight(_args(data, "--apply-chat-template", "--hf-checkpoint", str(qwen3)))


def test_plugin_fields_are_config_fields():
    # preflight reads each of them as `getattr(cfg, name)`, with no default.
    assert set(PLUGIN_FIELDS) <= set(SlimeArgs.model_fields)


def _vlm_dir(tmp_path) -> pathlib.Path:
    """Config, chat template and image processor config (what preflight looks at) of a vision-language model."""
    model = tmp_path / "vlm"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (model / "chat_template.jinja").write_text("{{ messages }}")
    (model / "processor_config.json").write_text(json.dumps({"image_processor": {"patch_size": 14}}))
    return model


def test_multimodal_keys_need_an_image_processor(tmp_path):
    model = _vlm_dir(tmp_path)
    (model / "processor_config.json").unlink()
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "x", "label": "2"}) + "\n")
    with pytest.raises(FileNotFoundError, match="--multimodal-keys: --hf-checkpoint .* has no preprocessor_config"):
        preflight(_args(data, "--hf-checkpoint", str(model), "--apply-chat-template",
                        "--multimodal-keys", '{"image": "images"}'))  # fmt: skip


def _copy_of_demo_model(folder: pathlib.Path, *weights: str) -> pathlib.Path:
    """The demo model's config and tokenizer files, with only the given weight files (copied from the demo's)."""
    folder.mkdir()
    for f in MODEL.iterdir():
        if not f.name.endswith((".safetensors", ".bin")):
            (folder / f.name).write_bytes(f.read_bytes())
    for name in weights:
        source = next(MODEL.glob("*.safetensors"))
        if name.endswith(".safetensors"):
            (folder / name).write_bytes(source.read_bytes())
        else:  # any bytes: only the file name is looked at
            (folder / name).write_bytes(b"\0")
    return folder


def test_hf_checkpoint_without_weights_fails_before_the_run(tmp_path):
    # Issue 27 leftover: a folder with config.json and the tokenizer but no weights passed --dry-run and preflight;
    # the run then died when the engine (from_pretrained) or the trainer (read_hf_state_dict) loaded it.
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    config_only = _copy_of_demo_model(tmp_path / "config-only")
    with pytest.raises(FileNotFoundError) as e:
        preflight(_args(data, "--hf-checkpoint", str(config_only)))
    message = str(e.value)
    assert message.startswith(f"--hf-checkpoint {config_only}: no weight files, only config.json")
    assert "engines load them at start and the --train-backend fsdp trainer loads its *.safetensors" in message
    # PyTorch .bin files: an engine reads them, the trainers read safetensors only.
    bin_only = _copy_of_demo_model(tmp_path / "bin-only", "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"bin-only: only PyTorch \*\.bin/\*\.pt weights, no \*\.safetensors"):
        preflight(_args(data, "--hf-checkpoint", str(bin_only)))
    preflight(_args(data, "--hf-checkpoint", str(bin_only), "--debug-rollout-only"))  # engines only: fine
    # Neither engines nor the trainer read them: engines outside, and no trainer.
    preflight(_args(data, "--hf-checkpoint", str(config_only), "--debug-rollout-only",
                    "--rollout-engine-urls", "http://127.0.0.1:1"))  # fmt: skip
    preflight(_args(data, "--hf-checkpoint", str(_copy_of_demo_model(tmp_path / "sharded", "model-1.safetensors"))))


def test_a_truncated_json_file_of_the_model_is_named(tmp_path):
    # A partial copy said only "Expecting ',' delimiter: line 2 column 1 (char 23)", naming no flag or file.
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    model = _copy_of_demo_model(tmp_path / "model", "model.safetensors")
    (model / "tokenizer_config.json").write_text('{"model_type": "qwen3"\n')
    with pytest.raises(ValueError) as e:
        preflight(_args(data, "--hf-checkpoint", str(model)))
    assert str(e.value) == (
        f"--hf-checkpoint {model}: tokenizer_config.json is not valid JSON (line 2 column 1: Expecting ',' delimiter); "
        "a partial download or copy?"
    )


@pytest.mark.parametrize(
    ("shard", "why"),
    [
        ("../outside.safetensors", "leads out of the folder ('..')"),
        ("sub/../../outside.safetensors", "leads out of the folder ('..')"),
        ("..\\outside.safetensors", "leads out of the folder ('..')"),
        ("/etc/passwd", "is not a file name inside the folder"),
        ("C:\\weights\\model.safetensors", "is not a file name inside the folder"),
        ("", "is not a file name inside the folder"),
    ],
)
def test_a_shard_index_naming_a_file_outside_the_model_folder_is_refused(tmp_path, shard, why):
    # Issue 27: transformers, the engines and the converter joined the folder with the index's names as given.
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    model = _copy_of_demo_model(tmp_path / "model", "model.safetensors")
    weight_map = {"model.norm.weight": "model.safetensors", "lm_head.weight": shard}
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(ValueError) as e:
        preflight(_args(data, "--hf-checkpoint", str(model)))
    index = model / "model.safetensors.index.json"
    assert str(e.value) == f"--hf-checkpoint: {index}: weight_map['lm_head.weight'] = {shard!r} {why}"


def test_the_default_plugins_are_not_imported_by_the_driver(tmp_path, monkeypatch):
    # They are ours and bound above; a user's plugin is still loaded and checked.
    import slime_rollout.plugins

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    _plugin_module(tmp_path, monkeypatch, "pf_default_skip", "def rm(args, sample):\n    return 1.0\n")
    loaded = []
    real = slime_rollout.plugins.load_function
    monkeypatch.setattr(
        slime_rollout.plugins, "load_function", lambda path, **kw: loaded.append(path) or real(path, **kw)
    )
    preflight(_args(data, "--custom-rm-path", "pf_default_skip.rm"))
    assert loaded == ["pf_default_skip.rm"]


def test_trainer_side_opd_teacher_with_another_vocabulary_of_the_same_size_is_refused(tmp_path, caplog):
    # Pass 48: a teacher whose config.json matches but whose tokenizer maps tokens to other ids passed, and the
    # teacher then scored every sampled id as another token.
    import shutil

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    teacher = tmp_path / "teacher"
    shutil.copytree(MODEL, teacher)
    spec = json.loads((teacher / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    (a, ia), (b, ib) = sorted(vocab.items(), key=lambda kv: kv[1])[-2:]  # two ordinary tokens' ids swapped
    vocab[a], vocab[b] = ib, ia
    (teacher / "tokenizer.json").write_text(json.dumps(spec))
    opd = ("--use-opd", "--opd-type", "fsdp", "--opd-kl-coef", "1.0")
    with pytest.raises(ValueError) as e:
        preflight(_args(data, *opd, "--opd-teacher-load", str(teacher)))
    assert str(e.value) == (
        f"--opd-teacher-load {teacher}: its tokenizer is not the student's (--hf-checkpoint {MODEL}): the same 32 "
        "tokens mapped to other ids; the teacher scores the student's token ids, so it needs the same vocabulary "
        "(a teacher of another tokenizer cannot distil token by token)"
    )
    # Without tokenizer files (a converted checkpoint) it cannot be checked from files: said, not silent.
    (teacher / "tokenizer.json").unlink()
    (teacher / "tokenizer_config.json").unlink()
    preflight(_args(data, *opd, "--opd-teacher-load", str(teacher)))
    assert any("has no tokenizer files" in r.getMessage() and str(teacher) in r.getMessage() for r in caplog.records)
