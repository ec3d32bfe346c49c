"""YAML config files (`--config`, `--custom-config-path`): what a file says is what the run gets, or one error."""

import pytest

from slime_core.config import ConfigError, parse_args

MINIMAL = ["--rollout-batch-size", "4", "--num-rollout", "2"]


def test_custom_config_overrides_one_engine_or_megatron_setting_not_all_of_them(tmp_path):
    # The original's --custom-config-path sets each key as one attribute. Here a file naming one SGLang and one
    # Megatron flag replaced every --sglang-* and Megatron flag of the command line: mem_fraction_static and
    # --hidden-size were dropped without a word.
    path = tmp_path / "custom.yaml"
    path.write_text("sglang-context-length: 4096\nnum-layers: 4\nrouter-policy: round_robin\n")
    args = parse_args(
        [
            *MINIMAL,
            "--sglang-mem-fraction-static", "0.7",
            "--sglang-context-length", "2048",
            "--router-balance-abs-threshold", "4",
            "--hidden-size", "64",
            "--num-layers", "2",
            "--custom-config-path", str(path),
        ]
    )  # fmt: skip
    assert args.sglang_args == {"mem_fraction_static": "0.7", "context_length": "4096"}  # was {"context_length": ...}
    assert args.router_args == {"balance_abs_threshold": "4", "policy": "round_robin"}
    # Megatron's parser keeps a flag's last value: the file's --num-layers 4 comes after the command line's 2.
    assert args.megatron_args == ["--hidden-size", "64", "--num-layers", "2", "--num-layers", "4"]


def test_custom_config_still_overrides_plain_fields(tmp_path):
    path = tmp_path / "custom.yaml"
    path.write_text("rollout-temperature: 0.6\n")
    args = parse_args([*MINIMAL, "--rollout-temperature", "0.9", "--custom-config-path", str(path)])
    assert args.rollout_temperature == 0.6


@pytest.mark.parametrize("flag", ["--config", "--custom-config-path"])
@pytest.mark.parametrize(
    ("text", "second", "first"),
    [
        ("rollout-temperature: 0.5\nrollout-top-p: 0.9\nrollout-temperature: 1.0\n", "'rollout-temperature'", 1),
        ("rollout_seed: 1\nrollout-seed: 2\n", "'rollout-seed'", 1),  # one field, two spellings
    ],
)
def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path, flag, text, second, first):
    # PyYAML keeps the last of two equal keys and drops the other: a run with `rollout-temperature` twice trained
    # at 1.0 while the file's first line said 0.5.
    path = tmp_path / "run.yaml"
    path.write_text(text)
    line = text.count("\n")
    with pytest.raises(ConfigError, match=rf"^{flag} {path}:{line}: key {second} is given twice .*line {first}\)"):
        parse_args([*MINIMAL, flag, str(path)])


@pytest.mark.parametrize("flag", ["--config", "--custom-config-path"])
@pytest.mark.parametrize(
    ("line", "dashed"),
    [
        ("num-layers: {a: 1}", "--num-layers"),  # was passed to Megatron as --num-layers "{'a': 1}"
        ("sglang-cuda-graph-bs: [1, [2, 4]]", "--sglang-cuda-graph-bs"),  # was "--cuda-graph-bs 1 [2, 4]"
        ("router-policy: {name: x}", "--router-policy"),
    ],
)
def test_a_pass_through_flag_holding_a_mapping_is_an_error_naming_the_line(tmp_path, flag, line, dashed):
    path = tmp_path / "run.yaml"
    path.write_text(f"rollout-temperature: 0.5\n{line}\n")
    with pytest.raises(ConfigError, match=rf"^{flag} {path}:2: {dashed} is passed through as a command-line flag"):
        parse_args([*MINIMAL, flag, str(path)])


def test_pass_through_lists_and_bare_flags_still_pass(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("sglang-cuda-graph-bs: [1, 2, 4]\nuse-flash-attn: null\nnum-layers: 2\n")
    args = parse_args([*MINIMAL, "--config", str(path)])
    assert args.sglang_args == {"cuda_graph_bs": ["1", "2", "4"]}
    assert args.megatron_args == ["--use-flash-attn", "--num-layers", "2"]
