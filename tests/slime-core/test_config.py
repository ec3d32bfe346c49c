"""Command-line / YAML parsing of the run config, pass-through flags and serialization."""

import json
import logging
import os
import re
import shlex
import textwrap

import pytest
import yaml

from slime_core.config import MEGATRON_FLAGS, ConfigError, SlimeArgs, build_parser, parse_args, validation
from slime_core.config import base as config_base

# The flag style of the original's scripts/run-qwen3-4B.sh + scripts/models/qwen3-4B.sh (user guide).
QWEN3_4B_SCRIPT = """
--swiglu --num-layers 36 --hidden-size 2560 --ffn-hidden-size 9728 --num-attention-heads 32
--group-query-attention --num-query-groups 8 --use-rotary-position-embeddings --disable-bias-linear
--normalization RMSNorm --norm-epsilon 1e-6 --rotary-base 1000000 --vocab-size 151936 --kv-channels 128 --qk-layernorm
--hf-checkpoint /root/Qwen3-4B --ref-load /root/Qwen3-4B_torch_dist --load /root/Qwen3-4B_slime/
--save /root/Qwen3-4B_slime/ --save-interval 20
--prompt-data /root/dapo-math-17k/dapo-math-17k.jsonl --input-key prompt --label-key label --apply-chat-template
--rollout-shuffle --rm-type deepscaler --num-rollout 3000 --rollout-batch-size 32 --n-samples-per-prompt 8
--rollout-max-response-len 8192 --rollout-temperature 0.8 --global-batch-size 256 --balance-data
--eval-interval 20 --eval-prompt-data aime /root/aime-2024/aime-2024.jsonl --n-samples-per-eval-prompt 16
--eval-max-response-len 16384 --eval-top-p 0.7
--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 1 --context-parallel-size 1
--expert-model-parallel-size 1 --expert-tensor-parallel-size 1
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1
--use-dynamic-batch-size --max-tokens-per-gpu 9216
--advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl --entropy-coef 0.00
--eps-clip 0.2 --eps-clip-high 0.28
--optimizer adam --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer
--use-wandb --wandb-project slime-dev --wandb-group qwen3-4B-test
--rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.7
--attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32
--attention-backend flash
--actor-num-nodes 1 --actor-num-gpus-per-node 8 --colocate
"""

MINIMAL = ["--rollout-batch-size", "4", "--num-rollout", "2"]


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    # warn_once remembers keys per process; each test sees its own warnings.
    monkeypatch.setattr(config_base, "_WARNED", set())


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)


def test_qwen3_4b_launch_script(no_cuda):
    args = parse_args(shlex.split(QWEN3_4B_SCRIPT))
    assert args.train_backend == "megatron"
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.global_batch_size) == (32, 8, 256)
    assert args.num_steps_per_rollout == 1  # 32 * 8 / 256
    assert args.over_sampling_batch_size == 32
    assert args.rollout_temperature == 0.8 and args.rollout_max_response_len == 8192
    assert args.input_key == "prompt" and args.label_key == "label" and args.apply_chat_template
    assert args.rollout_shuffle and args.balance_data and args.use_dynamic_batch_size
    assert args.max_tokens_per_gpu == 9216
    assert args.eval_datasets == [("aime", "/root/aime-2024/aime-2024.jsonl")]
    assert (args.eval_interval, args.n_samples_per_eval_prompt, args.eval_top_p) == (20, 16, 0.7)
    assert args.use_kl_loss and args.kl_loss_coef == 0.0 and args.kl_loss_type == "low_var_kl"
    assert (args.eps_clip, args.eps_clip_high) == (0.2, 0.28)
    assert (args.lr, args.weight_decay, args.adam_beta2, args.optimizer) == (1e-6, 0.1, 0.98, "adam")
    assert args.with_ref
    # --colocate implies both offloads, engines on the actor GPUs and tensor weight sync.
    assert args.colocate and args.offload_train and args.offload_rollout
    assert args.rollout_num_gpus == 8 and args.weight_sync == "tensor"
    assert args.sglang_args == {"mem_fraction_static": "0.7"}
    assert args.router_args == {}
    assert args.megatron_args[:4] == ["--swiglu", "--num-layers", "36", "--hidden-size"]
    assert "--optimizer-cpu-offload" in args.megatron_args and "--lr" not in args.megatron_args
    assert args.tensor_model_parallel_size == 2 and args.context_parallel_size == 1
    assert args.megatron_flag("--normalization") == "RMSNorm"
    assert args.megatron_flag("--sequence-parallel") is True
    assert args.megatron_flag("--not-given", 7) == 7


def test_defaults_follow_the_original(no_cuda):
    args = parse_args(MINIMAL)
    assert args.n_samples_per_prompt == 1
    assert (args.global_batch_size, args.num_steps_per_rollout, args.over_sampling_batch_size) == (4, 1, 4)
    assert (args.lr, args.seed, args.clip_grad, args.eps_clip, args.eps_clip_high) == (1e-6, 1234, 1.0, 0.2, 0.2)
    assert (args.rollout_temperature, args.rollout_top_p, args.rollout_top_k, args.rollout_seed) == (1.0, 1.0, -1, 42)
    assert (args.input_key, args.metadata_key, args.tool_key) == ("input", "metadata", "tools")
    assert args.advantage_estimator == "grpo" and args.kl_loss_type == "k1" and args.loss_type == "policy_loss"
    assert args.sglang_server_concurrency == 512 and args.update_weight_buffer_size == 512 * 1024**2
    assert args.colocate is False and args.offload_train is False and args.offload_rollout is False
    # n_samples_per_prompt == 1: a single-sample group has std 0, so std normalization is switched off.
    assert args.disable_grpo_std_normalization is True
    assert not args.with_ref and not args.use_critic
    assert args.sglang_args == {} and args.router_args == {} and args.megatron_args == []


def test_engine_defaults_depend_on_cuda(monkeypatch):
    import sys

    monkeypatch.setattr(validation, "_cuda_available", lambda: True)
    gpu = parse_args(MINIMAL)
    assert (gpu.rollout_engine, gpu.weight_sync) == ("sglang", "distributed")
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)
    cpu = parse_args(MINIMAL)
    assert (cpu.rollout_engine, cpu.weight_sync) == ("reference", "disk")
    assert cpu.engine_python == sys.executable
    explicit = parse_args([*MINIMAL, "--rollout-engine", "sglang", "--engine-python", "/opt/py/bin/python"])
    assert explicit.rollout_engine == "sglang" and explicit.engine_python == "/opt/py/bin/python"


def test_boolean_flags():
    assert parse_args([*MINIMAL, "--partial-rollout"]).partial_rollout is True
    # Tri-state offload flags: --colocate implies them unless turned off (the original's semantics).
    args = parse_args([*MINIMAL, "--colocate", "--no-offload-rollout"])
    assert args.offload_train is True and args.offload_rollout is False
    args = parse_args([*MINIMAL, "--colocate", "--no-offload-train"])
    assert args.offload_train is False and args.offload_rollout is True
    with pytest.raises(ConfigError, match=re.escape("--offload-train (or --offload) without --colocate")):
        parse_args([*MINIMAL, "--offload"])
    # Accepted and ignored before (the loop releases engine memory only when colocated): now one line.
    with pytest.raises(ConfigError) as err:
        parse_args([*MINIMAL, "--offload-rollout"])
    assert str(err.value) == (
        "--offload-rollout without --colocate is not implemented: the engines release accelerator memory only "
        "when they share GPUs with the trainer; drop it or add --colocate"
    )
    assert parse_args([*MINIMAL, "--no-offload-rollout"]).offload_rollout is False
    assert parse_args([*MINIMAL, "--no-use-tensorboard"]).use_tensorboard is False
    assert parse_args([*MINIMAL, "--async"]).async_train is True  # alias of --async-train
    assert parse_args([*MINIMAL, "--async-train"]).async_train is True
    assert parse_args(MINIMAL).async_train is False
    with pytest.raises(ConfigError, match="--partial-rollout"):
        parse_args([*MINIMAL, "--partial-rollout", "yes"])


def test_list_and_json_flags():
    args = parse_args(
        [
            *MINIMAL,
            "--rollout-stop",
            "</answer>",
            "</search>",
            "--rollout-stop-token-ids",
            "151645",
            "151643",
            "--rollout-sample-hook-path",
            "a.hook",
            "--rollout-sample-hook-path",
            "b.hook",
            "--train-env-vars",
            '{"NCCL_DEBUG": "INFO"}',
            "--apply-chat-template-kwargs",
            '{"enable_thinking": false}',
        ]
    )
    assert args.rollout_stop == ["</answer>", "</search>"]
    assert args.rollout_stop_token_ids == [151645, 151643]
    assert args.rollout_sample_hook_path == ["a.hook", "b.hook"]  # repeatable, like the original's append
    assert args.train_env_vars == {"NCCL_DEBUG": "INFO"}
    assert args.apply_chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match="--train-env-vars: not valid JSON"):
        parse_args([*MINIMAL, "--train-env-vars", "{NCCL_DEBUG: 1"])
    with pytest.raises(ConfigError, match="--apply-chat-template-kwargs: expected a JSON object"):
        parse_args([*MINIMAL, "--apply-chat-template-kwargs", "[1, 2]"])


def test_value_errors_name_the_flag():
    with pytest.raises(ConfigError, match="--rollout-batch-size: invalid int value: 'four'"):
        parse_args(["--rollout-batch-size", "four", "--num-rollout", "1"])
    with pytest.raises(ConfigError, match="--advantage-estimator: unknown advantage estimator 'grpo2'"):
        parse_args([*MINIMAL, "--advantage-estimator", "grpo2"])
    with pytest.raises(ConfigError, match="--rollout-batch-size is required"):
        parse_args(["--num-rollout", "1"])
    with pytest.raises(ConfigError, match=r"--rollout-batch-size: Input should be greater than or equal to 1"):
        parse_args(["--rollout-batch-size", "0", "--num-rollout", "1"])
    with pytest.raises(ConfigError, match="--n-samples-per-prompt: expected one argument"):
        parse_args([*MINIMAL, "--n-samples-per-prompt"])
    with pytest.raises(ConfigError, match="--rollout-batch-size: invalid int value: '4x'"):
        parse_args(["--rollout-batch-size=4x", "--num-rollout", "1"])
    assert parse_args(["--rollout-batch-size=4", "--num-rollout=1"]).rollout_batch_size == 4


def test_unknown_flags_get_a_suggestion():
    with pytest.raises(ConfigError, match=r"unknown flag --rollout-batch-sise; did you mean --rollout-batch-size\?"):
        parse_args(["--rollout-batch-sise", "4", "--num-rollout", "1"])
    with pytest.raises(ConfigError, match=r"unknown flag --tensor-model-paralel-size; did you mean "):
        parse_args([*MINIMAL, "--tensor-model-paralel-size", "2"])
    with pytest.raises(ConfigError, match=r"^unknown flag --zzz-qqq$"):
        parse_args([*MINIMAL, "--zzz-qqq"])
    with pytest.raises(ConfigError, match="unexpected value 'stray'"):
        parse_args(["stray", *MINIMAL])


def test_sglang_and_router_pass_through():
    args = parse_args(
        [
            *MINIMAL,
            "--sglang-mem-fraction-static",
            "0.7",
            "--sglang-enable-deterministic-inference",
            "--sglang-cuda-graph-bs",
            "1",
            "2",
            "4",
            "--sglang-attention-backend=flashinfer",
            "--sglang-random-offset",
            "-1",
            "--router-policy",
            "consistent_hashing",
            "--router-balance-abs-threshold",
            "10",
            "--sglang-server-concurrency",
            "64",
        ]
    )
    assert args.sglang_args == {
        "mem_fraction_static": "0.7",
        "enable_deterministic_inference": True,
        "cuda_graph_bs": ["1", "2", "4"],
        "attention_backend": "flashinfer",
        "random_offset": "-1",  # a negative number is a value, not a flag
    }
    assert args.router_args == {"policy": "consistent_hashing", "balance_abs_threshold": "10"}
    # slime's own --sglang-* fields are parsed, not passed through.
    assert args.sglang_server_concurrency == 64


def test_megatron_flags_with_fsdp_warn_once(caplog):
    # Neutral values and no-op flags pass with one warning; what FSDP cannot do is an error (test_megatron_flags.py).
    argv = ["--train-backend", "fsdp", *MINIMAL, "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size",
            "1", "--attention-backend", "flash", "--moe-grouped-gemm"]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        args = parse_args(argv)
        SlimeArgs.from_dict(args.to_dict())  # re-validation (e.g. in a Ray worker) does not warn again
    warnings = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert warnings == [
        "--train-backend fsdp: Megatron flags with no effect on math or memory here (kernel choices, Megatron's "
        "pretraining loop; MIGRATION.md): --attention-backend --moe-grouped-gemm"
    ]
    assert args.megatron_args[:2] == ["--tensor-model-parallel-size", "1"]
    assert args.tensor_model_parallel_size == 1 and args.pipeline_model_parallel_size == 1  # FSDP: no TP/PP
    with pytest.raises(
        ConfigError, match="--tensor-model-parallel-size 2 is not implemented with --train-backend fsdp, only 1"
    ):
        parse_args(["--train-backend", "fsdp", *MINIMAL, "--tensor-model-parallel-size", "2"])
    with pytest.raises(ConfigError, match="--context-parallel-size: expected an integer, got 'two'"):
        parse_args([*MINIMAL, "--context-parallel-size", "two"])


def test_fsdp_context_parallel_size_is_honoured_and_checked(caplog):
    fsdp = ["--train-backend", "fsdp", *MINIMAL]
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        args = parse_args([*fsdp, "--actor-num-gpus-per-node", "4", "--context-parallel-size", "2"])
    assert args.context_parallel_size == 2
    assert not [r for r in caplog.records if "no effect" in r.getMessage()]
    with pytest.raises(ConfigError, match="--context-parallel-size 2 must divide the trainer's ranks"):
        parse_args([*fsdp, "--actor-num-gpus-per-node", "3", "--context-parallel-size", "2"])
    with pytest.raises(ConfigError, match="needs --attn-implementation slime_varlen or slime_flex, got sdpa"):
        parse_args([*fsdp, "--actor-num-gpus-per-node", "2", "--context-parallel-size", "2",
                    "--attn-implementation", "sdpa"])  # fmt: skip


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_yaml_config_and_command_line_override(tmp_path):
    path = _write(
        tmp_path,
        "run.yaml",
        """
        rollout-batch-size: 16
        n_samples_per_prompt: 4
        num-rollout: 10
        rollout_stop: ["</answer>"]
        train-backend: fsdp
        eval-prompt-data: [gsm8k, /data/gsm8k.jsonl]
        sglang-mem-fraction-static: 0.6
        sglang-enable-dp-attention: true
        router-policy: cache_aware
        """,
    )
    args = parse_args(["--config", str(path), "--n-samples-per-prompt", "8", "--sglang-mem-fraction-static", "0.8"])
    assert args.rollout_batch_size == 16 and args.num_rollout == 10
    assert args.n_samples_per_prompt == 8  # the command line wins over YAML
    assert args.global_batch_size == 16 * 8
    assert args.train_backend == "fsdp" and args.rollout_stop == ["</answer>"]
    assert args.eval_datasets == [("gsm8k", "/data/gsm8k.jsonl")]
    assert args.sglang_args == {"mem_fraction_static": "0.8", "enable_dp_attention": True}
    assert args.router_args == {"policy": "cache_aware"}


def test_yaml_megatron_keys(tmp_path):
    path = _write(
        tmp_path, "m.yaml", "rollout-batch-size: 2\nnum-rollout: 1\nnum-layers: 4\nswiglu: true\nqk-layernorm: false\n"
    )
    args = parse_args(["--config", str(path), "--hidden-size", "64"])
    assert args.megatron_args == ["--num-layers", "4", "--swiglu", "--hidden-size", "64"]


def test_yaml_errors_name_file_and_line(tmp_path):
    path = _write(tmp_path, "bad.yaml", "rollout-batch-size: 2\nnum-rollout: 1\nrollout-tempreature: 0.5\n")
    with pytest.raises(
        ConfigError, match=rf"--config {path}:3: unknown key 'rollout-tempreature'; did you mean rollout-temperature\?"
    ):
        parse_args(["--config", str(path)])
    broken = _write(tmp_path, "broken.yaml", "rollout-batch-size: 2\nnum-rollout: [1\n")
    with pytest.raises(ConfigError, match=rf"--config {broken}:3: invalid YAML"):
        parse_args(["--config", str(broken)])
    with pytest.raises(ConfigError, match="--config .*missing.yaml: cannot read file"):
        parse_args(["--config", str(tmp_path / "missing.yaml")])
    not_mapping = _write(tmp_path, "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match=rf"{not_mapping}:1: expected a mapping"):
        parse_args(["--config", str(not_mapping)])
    bad_value = _write(tmp_path, "value.yaml", "rollout-batch-size: 2\nnum-rollout: 1\nrollout-temperature: hot\n")
    with pytest.raises(
        ConfigError, match=rf"--rollout-temperature: Input should be a valid number.* \[{bad_value}:3\]$"
    ):
        parse_args(["--config", str(bad_value)])
    # A command-line value that overrides the file is not blamed on the file.
    with pytest.raises(ConfigError, match=r"--rollout-temperature: Input should be greater than 0 \(got -1.0\)$"):
        parse_args(["--config", str(bad_value), "--rollout-temperature", "-1"])


def test_custom_config_path_overrides_and_keeps_plugin_settings(tmp_path):
    path = _write(tmp_path, "custom.yaml", "rollout-temperature: 0.6\nmy_plugin_threshold: 3\n")
    args = parse_args([*MINIMAL, "--rollout-temperature", "0.9", "--custom-config-path", str(path)])
    assert args.rollout_temperature == 0.6  # the original semantics: this file overrides any attribute
    assert args.custom_config == {"my_plugin_threshold": 3}


def test_to_dict_round_trip_and_yaml(tmp_path, no_cuda):
    args = parse_args(shlex.split(QWEN3_4B_SCRIPT) + ["--router-policy", "consistent_hashing"])
    data = args.to_dict()
    json.dumps(data)  # JSON-compatible for Ray transport
    assert "with_ref" not in data and data["global_batch_size"] == 256
    again = SlimeArgs.from_dict(data)
    assert again == args and again.to_dict() == data
    out = tmp_path / "ckpt" / "args.yaml"
    args.to_yaml(out)
    assert sorted(os.listdir(out.parent)) == ["args.yaml"]  # the temp file was renamed, nothing left behind
    assert yaml.safe_load(out.read_text()) == data
    assert parse_args(["--config", str(out)]) == args


def test_from_dict_errors_are_config_errors():
    with pytest.raises(ConfigError, match="unknown option --rollout-batch"):
        SlimeArgs.from_dict({"rollout_batch": 4, "rollout_batch_size": 4, "num_rollout": 1})
    with pytest.raises(ConfigError) as info:
        SlimeArgs.from_dict({"rollout_batch_size": 4, "num_rollout": 1, "rollout_temperature": 0, "lr": -1})
    message = str(info.value)
    assert "\n" not in message
    assert "--rollout-temperature: Input should be greater than 0 (got 0)" in message
    assert "--lr: Input should be greater than 0 (got -1)" in message


def test_every_field_is_described_and_every_flag_generated():
    parser = build_parser()
    flags = set(parser._option_string_actions)
    for name, field in SlimeArgs.model_fields.items():
        assert field.description, name
        if name not in ("sglang_args", "router_args", "megatron_args", "custom_config"):
            assert "--" + name.replace("_", "-") in flags, name
    assert "--sglang-args" not in flags and "--megatron-args" not in flags
    # A Megatron flag that is also a slime field would be silently swallowed by one of the two.
    assert not (MEGATRON_FLAGS & flags)
    for flag in ("--lr", "--seed", "--micro-batch-size", "--bf16", "--optimizer", "--clip-grad"):
        assert flag in flags and flag not in MEGATRON_FLAGS


def test_help_lists_flags(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--rollout-batch-size" in out and "--eval-prompt-data" in out and "--no-offload-train" in out
    # A one-line usage, not argparse's list of every flag; the flags come once, in their groups.
    assert out.splitlines()[0] == "usage: slime [--config RUN.yaml] [FLAG VALUE ...]"
    assert out.count("--rollout-batch-size ROLLOUT_BATCH_SIZE") == 1


def test_user_guide_examples(caplog, no_cuda):
    dapo = parse_args(
        shlex.split(
            "--over-sampling-batch-size 64 --rollout-batch-size 32 --n-samples-per-prompt 8 --num-rollout 10 "
            "--dynamic-sampling-filter-path slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
        )
    )
    assert (dapo.over_sampling_batch_size, dapo.rollout_batch_size, dapo.global_batch_size) == (64, 32, 256)
    assert dapo.dynamic_sampling_filter_path.endswith("check_reward_nonzero_std")
    disaggregated = parse_args(
        [*MINIMAL, "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4"]
    )
    assert disaggregated.rollout_num_gpus == 4 and not disaggregated.colocate and not disaggregated.offload_train
    multi_turn = parse_args(
        [*MINIMAL, "--custom-generate-function-path", "my_module.generate", "--custom-rm-path", "my_module.reward_func"]
        + ["--metadata-key", "metadata", "--max-turns", "4", "--tool-key", "tools"]
    )
    assert multi_turn.custom_generate_function_path == "my_module.generate" and multi_turn.max_turns == 4
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        fsdp = parse_args(
            [*MINIMAL, "--train-backend", "fsdp", "--hf-checkpoint", "/root/Qwen3-4B", "--gradient-checkpointing"]
            + ["--context-parallel-size", "2"]
        )
    # FSDP honours the guide's --context-parallel-size (Ulysses all-to-all; issue 22), no "ignored" warning.
    assert fsdp.gradient_checkpointing and fsdp.context_parallel_size == 2
    assert not any("--context-parallel-size" in r.getMessage() for r in caplog.records)


def test_validated_config_is_frozen_and_plugins_get_a_writable_view_with_engine_addresses():
    import pydantic

    from slime_core.config import PluginArgs, SlimeArgs

    cfg = SlimeArgs.from_dict({"rollout_batch_size": 2, "num_rollout": 1, "lr": 1e-5})
    with pytest.raises(pydantic.ValidationError):
        cfg.lr = 3.0
    view = PluginArgs.from_config(cfg, engine_urls=["http://127.0.0.1:15000"], router_url="http://10.0.0.1:30000")
    assert (view.sglang_router_ip, view.sglang_router_port) == ("10.0.0.1", 30000)
    assert view.rollout_engine_urls == ["http://127.0.0.1:15000"]
    view.my_plugin_state = {"calls": 1}  # original plugins may stash state on args
    view.lr = 2.0
    assert view.lr == 2.0 and cfg.lr == 1e-5 and cfg.rollout_engine_urls is None
    assert view.global_batch_size == cfg.global_batch_size == 2
    with pytest.raises(ValueError, match="http://host:port"):
        PluginArgs.from_config(cfg, router_url="10.0.0.1")


def test_plugin_view_holds_the_originals_defaults_for_sample_hooks_and_the_eval_function():
    from slime_core.config import PluginArgs, SlimeArgs

    # Before: None and None; the original's parser gives `[]` (action="append") and copies the rollout function path.
    path = "my_pkg.rollout.generate"
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 2, "num_rollout": 1, "rollout_function_path": path})
    view = PluginArgs.from_config(cfg)
    assert view.rollout_sample_hook_path == [] and view.eval_function_path == path
    assert cfg.rollout_sample_hook_path is None and cfg.eval_function_path is None  # the config is unchanged
    given = SlimeArgs.from_dict(
        {"rollout_batch_size": 2, "num_rollout": 1, "rollout_sample_hook_path": ["a.h"], "eval_function_path": "b.e"}
    )
    view = PluginArgs.from_config(given)
    assert view.rollout_sample_hook_path == ["a.h"] and view.eval_function_path == "b.e"


def test_disk_weight_sync_dir_defaults_under_output_dir():
    from slime_core.config import SlimeArgs

    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 2, "num_rollout": 1, "weight_sync": "disk", "output_dir": "/tmp/run"}
    )
    assert cfg.update_weight_disk_dir == "/tmp/run/weight_sync"
    assert SlimeArgs.from_dict(cfg.to_dict()) == cfg


def test_a_yaml_config_that_is_not_utf8_names_the_flag_file_and_line(tmp_path):
    # It said only "'utf-8' codec can't decode byte 0xff in position 23: invalid start byte".
    path = tmp_path / "latin1.yaml"
    path.write_bytes("rollout-batch-size: 2\nwandb-group: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as e:
        parse_args(["--config", str(path)])
    assert str(e.value) == f"--config {path}:2: not UTF-8 (byte 0xe9); re-encode it"
    with pytest.raises(ConfigError, match=rf"^--custom-config-path {path}:2: not UTF-8 \(byte 0xe9\)"):
        parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--custom-config-path", str(path)])
