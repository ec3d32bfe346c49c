"""No `--sglang-*` pass-through flag may reach an SGLang option slime sets itself (slime_core.config.sglang_flags)."""

import pytest

from slime_core.config import ConfigError, PluginArgs, SlimeArgs, parse_args, validation
from slime_core.config import base as config_base
from slime_core.config.sglang_flags import managed_sglang_field


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    monkeypatch.setattr(config_base, "_WARNED", set())
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sglang-tp-size", "4"], "--sglang-tp-size: SGLang's --tp-size, which slime sets itself for every engine"),
        (["--sglang-tensor-parallel-size", "4"], "--sglang-tensor-parallel-size: an alias of --tp-size, which slime"),
        (["--sglang-tp", "4"], "--sglang-tp: an abbreviation of --tp-size, which slime sets itself"),
        (["--sglang-model", "m"], "--sglang-model: an alias of --model-path"),
        (["--sglang-nccl-init-addr", "h:1"], "--sglang-nccl-init-addr: an alias of --dist-init-addr"),
        (["--sglang-base-gpu", "1"], "--sglang-base-gpu: an abbreviation of --base-gpu-id"),
        (["--sglang-enable-memory-saver"], "--sglang-enable-memory-saver: SGLang's --enable-memory-saver"),
    ],
)
def test_flags_slime_sets_are_refused_by_name_alias_and_abbreviation(flags, message):
    argv = ["--rollout-batch-size", "4", "--num-rollout", "1", "--rollout-num-gpus", "2"]
    argv += ["--rollout-num-gpus-per-engine", "2", *flags]
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_the_same_rule_applies_to_a_config_file_dict():
    with pytest.raises(ConfigError, match="--sglang-tp-size: SGLang's --tp-size"):
        SlimeArgs.from_dict({"rollout_batch_size": 4, "num_rollout": 1, "sglang_args": {"tp_size": "4"}})


@pytest.mark.parametrize(
    "name", ["mem_fraction_static", "dp_size", "pp_size", "ep", "model_loader_extra_config", "port_", "tp_sizes"]
)
def test_other_sglang_flags_pass(name):
    assert managed_sglang_field(name) is None


def test_mem_fraction_passes_validation():
    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 4, "num_rollout": 1, "sglang_args": {"mem_fraction_static": "0.5"}}
    )
    assert cfg.sglang_args == {"mem_fraction_static": "0.5"}


def test_pass_through_keys_are_read_by_their_server_field_however_spelled():
    from slime_core.config.sglang_flags import sglang_field, sglang_fields

    assert sglang_field("sglang-context-length") == sglang_field("context_length") == "context_length"
    assert sglang_fields({"context-length": "40", "sglang_dtype": "bfloat16"}) == {
        "context_length": "40",
        "dtype": "bfloat16",
    }
    assert sglang_fields(None) == {}


def test_plugins_read_given_engine_flags_as_the_originals_sglang_attributes():
    # The original's coding-agent example reads `getattr(args, "sglang_tool_call_parser", None)`: with the flag given,
    # it got None here (no such attribute) and its adapter parsed no tool call.
    import copy
    import pickle

    from slime_core.config import PluginArgs

    argv = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
            "--sglang-tool-call-parser", "qwen25", "--sglang-reasoning-parser", "qwen3",
            "--sglang-enable-deterministic-inference", "--sglang-mem-fraction-static", "0.7",
            "--sglang-max-running-requests", "64"]  # fmt: skip
    config = parse_args(argv)
    args = PluginArgs.from_config(config)
    assert getattr(args, "sglang_tool_call_parser", None) == "qwen25"
    assert getattr(args, "sglang_reasoning_parser", None) == "qwen3"
    assert getattr(args, "sglang_enable_deterministic_inference", False) is True
    assert args.sglang_mem_fraction_static == 0.7 and args.sglang_max_running_requests == 64  # numbers, as SGLang's
    # A flag not given has no value here (SGLang's defaults are not known): the caller's default applies.
    assert getattr(args, "sglang_dp_size", None) is None and not hasattr(args, "sglang_context_length")
    with pytest.raises(AttributeError, match="sglang_context_length"):
        args.sglang_context_length  # noqa: B018
    # Fields keep their own values, and the view survives the copies plugins make of it (multi_agent deep-copies).
    assert args.sglang_server_concurrency == config.sglang_server_concurrency and args.sglang_router_ip is None
    assert copy.deepcopy(args).sglang_tool_call_parser == pickle.loads(pickle.dumps(args)).sglang_tool_call_parser


def _config_file_args(tmp_path, engine_flags: str) -> list[str]:
    path = tmp_path / "run.yaml"
    path.write_text(f"rollout_batch_size: 4\nnum_rollout: 1\nsglang_args:\n{engine_flags}")
    return ["--config", str(path)]


def test_a_config_files_dashed_engine_keys_are_validated_under_their_field(tmp_path):
    # Before: `sglang-dp-size: "2"` was kept as that key, so `sglang_args.get("dp_size")` saw 1 and the missing
    # --sglang-enable-dp-attention passed validation (and preflight/placement sized dp and pp as 1).
    with pytest.raises(ConfigError, match="--sglang-dp-size > 1 requires --sglang-enable-dp-attention"):
        parse_args(_config_file_args(tmp_path, '  sglang-dp-size: "2"\n'))
    with pytest.raises(ConfigError, match="--rollout-num-gpus-per-engine 1 must be divisible by --sglang-pp-size 2"):
        parse_args(_config_file_args(tmp_path, '  pp-size: "2"\n'))
    engine = ["--rollout-num-gpus-per-engine", "2"]  # DP attention of 2 splits an engine of 2 GPUs
    args = parse_args([*_config_file_args(tmp_path, '  sglang-dp-size: "2"\n  enable-dp-attention: true\n'), *engine])
    assert args.sglang_args == {"dp_size": "2", "enable_dp_attention": True}


@pytest.mark.parametrize(("per_engine", "pp", "dp", "tp"), [(4, 1, 3, 4), (1, 1, 2, 1), (8, 2, 8, 4)])
def test_dp_attention_that_does_not_divide_the_engines_tensor_parallel_size_is_refused(per_engine, pp, dp, tp):
    # Issue 27 pass 87: accepted (the original passes them on too), then SGLang's start-up stopped on a bare
    # `assert self.tp_size % self.dp_size == 0`, naming no flag.
    argv = ["--rollout-batch-size", "4", "--num-rollout", "1", "--rollout-num-gpus-per-engine", str(per_engine)]
    argv += ["--sglang-pp-size", str(pp), "--sglang-dp-size", str(dp), "--sglang-enable-dp-attention"]
    with pytest.raises(ConfigError) as caught:
        parse_args(argv)
    assert str(caught.value) == (
        f"--sglang-dp-size {dp} must divide each engine's tensor-parallel size {tp} (--rollout-num-gpus-per-engine "
        f"{per_engine} / --sglang-pp-size {pp}): DP attention splits an engine's TP ranks into that many groups"
    )
    argv[argv.index("--sglang-dp-size") + 1] = str(tp)  # DP attention over all the engine's TP ranks
    assert parse_args(argv).sglang_args["dp_size"] == str(tp)


def test_one_engine_field_given_twice_with_different_values_is_refused():
    with pytest.raises(ConfigError, match=r"--sglang-dp-size: given twice with different values, as 'dp_size'"):
        SlimeArgs.from_dict(
            {"rollout_batch_size": 4, "num_rollout": 1, "sglang_args": {"dp_size": "2", "dp-size": "4"}}
        )


def test_a_config_files_numeric_and_boolean_engine_values_are_taken_as_the_command_line_gives_them(tmp_path):
    # Before: `dp-size: 2` (a YAML int) was a three-part pydantic error ("Input should be a valid string ... boolean
    # ... list"); the CLI's `--sglang-dp-size 2` holds the text "2", which the launcher renders as `--dp-size 2`.
    yaml = "  dp-size: 2\n  enable-dp-attention: true\n  mem-fraction-static: 0.85\n  cuda-graph-bs: [1, 2, 4]\n"
    args = parse_args([*_config_file_args(tmp_path, yaml), "--rollout-num-gpus-per-engine", "2"])
    assert args.sglang_args == {"dp_size": "2", "enable_dp_attention": True, "mem_fraction_static": "0.85",
                                "cuda_graph_bs": ["1", "2", "4"]}  # fmt: skip
    plugin_args = PluginArgs.from_config(args)
    assert plugin_args.sglang_dp_size == 2 and plugin_args.sglang_mem_fraction_static == 0.85  # numbers, as SGLang's
    with pytest.raises(ConfigError, match="--sglang-dp-size > 1 requires --sglang-enable-dp-attention"):
        parse_args(_config_file_args(tmp_path, "  dp-size: 2\n"))  # validated as the CLI's value is


@pytest.mark.parametrize(("yaml", "shown"), [
    ("  json-model-override-args: {a: 1}\n", "--sglang-json-model-override-args: dict {'a': 1}"),
    ("  sglang-log-level:\n", "--sglang-log-level: NoneType None"),
])  # fmt: skip
def test_an_engine_value_of_another_type_is_one_line_naming_the_key_and_the_types_taken(tmp_path, yaml, shown):
    with pytest.raises(ConfigError) as e:
        parse_args(_config_file_args(tmp_path, yaml))
    assert str(e.value) == (
        f"{shown} is not a flag value; give a number, a string, true/false (a switch) or a list of numbers/strings "
        f"(several values), as on the command line [{tmp_path / 'run.yaml'}:3]"
    )


def test_a_config_files_numeric_router_values_are_taken_as_text(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rollout_batch_size: 4\nnum_rollout: 1\nrouter_args:\n  balance-abs-threshold: 32\n")
    assert parse_args(["--config", str(path)]).router_args == {"balance-abs-threshold": "32"}
