"""A Megatron-LM flag slime does not carry is named as one (with what to use instead), not as an "unknown flag".

The original slime hands its command line to Megatron-LM's parser, so a launch script may carry any Megatron-LM flag;
before, `--decoupled-lr 1e-5` was "unknown flag --decoupled-lr; did you mean --critic-lr?", the words a typo gets.
"""

import importlib.resources
import re

import pytest

from slime_core.config import MEGATRON_FLAGS, ConfigError, build_parser, parse_args
from slime_core.config.megatron_lm_flags import MEGATRON_LM_EQUIVALENTS, megatron_lm_flags
from slime_core.config.unsupported import UNSUPPORTED_FLAGS

BASE = ["--rollout-batch-size", "1", "--num-rollout", "1"]


def _data_lines() -> list[str]:
    return importlib.resources.files("slime_core.config").joinpath("megatron_lm_flags.txt").read_text().splitlines()


def test_the_flag_list_says_where_it_came_from_and_is_sorted_and_unique():
    lines = _data_lines()
    header = [line for line in lines if line.startswith("#")]
    flags = lines[len(header) :]
    assert lines[: len(header)] == header  # the header first, then only flags
    assert "NVIDIA/Megatron-LM 1dcf0dafa884ad52ffb243625717a3471643e087" in " ".join(header)
    assert "packages/slime-core/scripts/megatron_lm_flags.py" in " ".join(header)
    assert flags == sorted(set(flags)), "sorted and unique: regenerate with packages/slime-core/scripts"
    assert [f for f in flags if not re.fullmatch(r"--[a-z0-9][a-z0-9_-]*", f)] == []
    assert frozenset(flags) == megatron_lm_flags()
    # Spot checks against Megatron-LM at that commit: a hand-written flag, flags its config dataclasses generate
    # (SchedulerConfig), and the one the original's megatron.patch adds.
    spot = ["--decoupled-lr", "--train-samples", "--lr-wsd-decay-samples", "--lr-wsd-decay-style",
            "--override-opt-param-scheduler", "--use-gated-attention", "--tensor-model-parallel-size"]  # fmt: skip
    assert [flag for flag in spot if flag not in megatron_lm_flags()] == []


def test_every_equivalent_is_a_megatron_lm_flag_slime_does_not_carry_and_names_a_slime_flag():
    carried = set(build_parser()._option_string_actions) | MEGATRON_FLAGS | set(UNSUPPORTED_FLAGS)
    assert [f for f in MEGATRON_LM_EQUIVALENTS if f not in megatron_lm_flags() or f in carried] == []
    accepted = (set(build_parser()._option_string_actions) - set(UNSUPPORTED_FLAGS)) | MEGATRON_FLAGS
    named = {f for note in MEGATRON_LM_EQUIVALENTS.values() for f in re.findall(r"--[a-z][a-z0-9-]*", note)}
    assert sorted(named - accepted) == []  # each flag an equivalent names is one parse_args accepts


def test_a_megatron_lm_flag_without_an_equivalent_is_named_as_one():
    with pytest.raises(ConfigError) as e:
        parse_args([*BASE, "--decoupled-lr", "1e-5"])
    assert str(e.value) == (
        "--decoupled-lr is a Megatron-LM flag that this version does not support (the Megatron-LM flags it accepts "
        "are listed in MIGRATION.md); remove it"
    )


@pytest.mark.parametrize(
    "given, instead",
    [
        (["--train-samples", "640"], "use --num-rollout (the run's length in rollouts)"),
        (["--lr-wsd-decay-samples=64"], "use --lr-wsd-decay-iters (counted in optimizer steps, as every length here "
                                        "(the original counts them in samples for Megatron))"),
        (["--override-opt-param-scheduler"], "a resumed run continues the checkpoint's schedule and refuses other "
                                             "values; --no-load-optim starts the optimizer and its schedule afresh"),
        (["--start-weight-decay", "0.01"], "use --weight-decay (the weight decay is constant, as under Megatron-LM's "
                                           "defaults)"),
    ],
)  # fmt: skip
def test_a_megatron_lm_flag_with_an_equivalent_says_what_to_use(given, instead):
    with pytest.raises(ConfigError) as e:
        parse_args([*BASE, *given])
    flag = given[0].split("=")[0]
    assert str(e.value) == f"{flag} is a Megatron-LM flag that this version does not support; {instead}"


def test_a_typo_still_gets_the_closest_flag_and_megatron_flags_slime_carries_still_pass():
    with pytest.raises(ConfigError) as e:
        parse_args([*BASE, "--rollout-batch-sise", "2"])
    assert str(e.value) == "unknown flag --rollout-batch-sise; did you mean --rollout-batch-size?"
    assert parse_args([*BASE, "--tensor-model-parallel-size", "1"]).megatron_args == [
        "--tensor-model-parallel-size", "1"
    ]  # fmt: skip


def test_a_megatron_lm_key_in_a_yaml_config_is_named_as_one(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("rollout_batch_size: 1\nnum_rollout: 1\ntrain_samples: 640\n")
    with pytest.raises(ConfigError) as e:
        parse_args(["--config", str(config)])
    assert str(e.value) == (
        f"--config {config}:3: --train-samples is a Megatron-LM flag that this version does not support; use "
        "--num-rollout (the run's length in rollouts)"
    )
