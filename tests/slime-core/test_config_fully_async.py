"""Fully-async rollout rules (`slime_core.config.validation_fully_async`)."""

import pytest

from slime_core.config import ConfigError, SlimeArgs, parse_args
from slime_core.config.validation_fully_async import is_fully_async

BASE = {"rollout_batch_size": 4, "num_rollout": 1, "train_backend": "fsdp"}
ORIGINAL_PATH = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"


def make(**overrides):
    return SlimeArgs.from_dict({**BASE, **overrides})


def test_original_launch_flags_parse_with_a_staleness_bound():
    args = parse_args(["--rollout-batch-size", "4", "--num-rollout", "1", "--async", "--rollout-function-path",
                       ORIGINAL_PATH, "--max-weight-staleness", "2", "--partial-rollout"])  # fmt: skip
    assert is_fully_async(args) and args.max_weight_staleness == 2 and args.async_train
    ours = "slime_rollout.generation.fully_async.generate_rollout_fully_async"
    assert is_fully_async(make(rollout_function_path=ours))
    assert not is_fully_async(make())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_weight_staleness": 1}, "--max-weight-staleness bounds the fully-async rollout only"),
        ({"rollout_function_path": ORIGINAL_PATH, "colocate": True}, "cannot swap one GPU's memory between them"),
        (
            {"rollout_function_path": ORIGINAL_PATH, "colocate": True, "offload_train": False},
            "--no-offload-train --no-offload-rollout",
        ),
        ({"async_train": True, "colocate": True}, "--async overlaps rollout and training"),
        ({"async_train": True, "colocate": True, "offload_rollout": False}, "--no-offload-train --no-offload-rollout"),
        # Bounds no group can meet: the take would drop every group and wait forever.
        (
            {"rollout_function_path": ORIGINAL_PATH, "max_weight_staleness": 0, "async_train": True},
            "--max-weight-staleness 0 with --async and --update-weights-interval 1: --async generates rollout r while",
        ),
        (
            {
                "rollout_function_path": ORIGINAL_PATH,
                "max_weight_staleness": 1,
                "async_train": True,
                "update_weights_interval": 2,
            },
            "use --max-weight-staleness >= 2, or drop --async",
        ),
        (
            {"rollout_function_path": ORIGINAL_PATH, "max_weight_staleness": 3, "debug_rollout_only": True},
            "--max-weight-staleness 3 with --debug-rollout-only: no trainer pushes weights",
        ),
        (
            {"rollout_function_path": ORIGINAL_PATH, "max_weight_staleness": -1},
            "--max-weight-staleness: Input should be greater than or equal to 0",
        ),
    ],
)
def test_broken_rules_are_one_line_errors_naming_the_flags(overrides, message):
    with pytest.raises(ConfigError) as err:
        make(**overrides)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_weight_staleness": 1, "async_train": True},  # the weights of the previous push: 1 behind
        {"max_weight_staleness": 2, "async_train": True, "update_weights_interval": 2},
        {"max_weight_staleness": 0},  # the sync loop pushes before each rollout: bound 0 is met
        {"debug_rollout_only": True},  # no bound: a debug rollout takes any group
    ],
)
def test_bounds_some_group_can_meet_are_accepted(overrides):
    args = make(rollout_function_path=ORIGINAL_PATH, **overrides)
    assert args.max_weight_staleness == overrides.get("max_weight_staleness")


@pytest.mark.parametrize("overrides", [{"rollout_function_path": ORIGINAL_PATH}, {"async_train": True}])
def test_colocated_overlap_is_allowed_when_both_sides_stay_resident(overrides):
    """One GPU (or set) shared by a resident trainer and resident engines: generation runs while it trains."""
    args = make(colocate=True, offload_train=False, offload_rollout=False, **overrides)
    assert args.colocate and not args.offload_train and not args.offload_rollout


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        ({}, True),
        ({"sglang_args": {"mem_fraction_static": "0.4"}}, False),  # sized by the user
        ({"offload_rollout": True, "offload_train": True}, False),  # released while the trainer trains
    ],
)
def test_resident_colocated_engines_without_a_memory_fraction_warn(monkeypatch, caplog, overrides, warned):
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once remembers keys per process
    fields = {"colocate": True, "offload_train": False, "offload_rollout": False, "rollout_engine": "sglang"}
    with caplog.at_level("WARNING"):
        make(**{**fields, **overrides})
    assert ("give --sglang-mem-fraction-static so that the trainer fits" in caplog.text) is warned
