"""`--sglang-ep-size` against each engine's tensor-parallel size (slime_core.config.sglang_ep), at parse time.

Each refused case was accepted before and stopped every SGLang 0.5.16 engine in its start-up: in
`initialize_model_parallel` (an EP that does not divide TP leaves ranks outside every expert group) or on a bare
assert of `ServerArgs.__post_init__`.
"""

import logging

import pytest

from slime_core.config import ConfigError, parse_args, validation
from slime_core.config import base as config_base


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    monkeypatch.setattr(config_base, "_WARNED", set())
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)


def _argv(per_engine: int, *flags: str) -> list[str]:
    return ["--rollout-batch-size", "4", "--num-rollout", "1", "--rollout-num-gpus-per-engine", str(per_engine), *flags]


@pytest.mark.parametrize(
    ("per_engine", "flags", "message"),
    [
        (4, ["--sglang-ep-size", "3"], "--sglang-ep-size 3 must divide each engine's tensor-parallel size 4 "
         "(--rollout-num-gpus-per-engine 4 / --sglang-pp-size 1): SGLang splits an engine's TP ranks into "
         "expert-parallel groups of that size"),
        (2, ["--sglang-ep-size", "4"], "--sglang-ep-size 4 must divide each engine's tensor-parallel size 2 "
         "(--rollout-num-gpus-per-engine 2 / --sglang-pp-size 1): SGLang splits"),
        (8, ["--sglang-pp-size", "2", "--sglang-expert-parallel-size", "8"], "--sglang-expert-parallel-size 8 must "
         "divide each engine's tensor-parallel size 4 (--rollout-num-gpus-per-engine 8 / --sglang-pp-size 2)"),
        (1, ["--sglang-ep", "2"], "--sglang-ep 2 must divide each engine's tensor-parallel size 1"),
        (4, ["--sglang-moe-dp-size", "3"], "--sglang-moe-dp-size 3 must divide each engine's tensor-parallel size 4"),
        (8, ["--sglang-pp-size", "2", "--sglang-moe-dp-size", "2"], "--sglang-moe-dp-size 2 needs --sglang-pp-size "
         "1, got 2 (SGLang asserts it)"),
        (8, ["--sglang-ep-size", "2", "--sglang-moe-dp-size", "2"], "--sglang-ep-size 2 × --sglang-moe-dp-size 2 "
         "must equal each engine's tensor-parallel size 8 (--rollout-num-gpus-per-engine 8 / --sglang-pp-size 1)"),
        (8, ["--sglang-ep-size", "2", "--sglang-moe-runner-backend", "flashinfer_cutlass"], "--sglang-ep-size 2 with "
         "--sglang-moe-runner-backend flashinfer_cutlass: SGLang runs that backend only with an expert-parallel size "
         "of 1 or each engine's tensor-parallel size 8"),
        (4, ["--sglang-enable-eplb"], "--sglang-enable-eplb needs --sglang-ep-size > 1"),
        (4, ["--sglang-ep-size", "0"], "--sglang-ep-size: expected a positive integer, got '0'"),
    ],
)  # fmt: skip
def test_expert_parallel_sizes_sglang_stops_on_are_refused_naming_the_flags(per_engine, flags, message):
    with pytest.raises(ConfigError) as caught:
        parse_args(_argv(per_engine, *flags))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("per_engine", "flags"),
    [
        (4, ["--sglang-ep-size", "4"]),
        (4, ["--sglang-ep-size", "2"]),  # two expert groups of 2 ranks, each expert shard on TP 2
        (4, ["--sglang-ep-size", "1"]),
        (8, ["--sglang-pp-size", "2", "--sglang-ep-size", "4"]),
        (8, ["--sglang-ep-size", "4", "--sglang-moe-dp-size", "2"]),
        (8, ["--sglang-moe-dp-size", "4"]),
        (8, ["--sglang-ep-size", "8", "--sglang-moe-runner-backend", "flashinfer_cutedsl"]),
        (4, ["--sglang-ep-size", "2", "--sglang-enable-eplb"]),
    ],
)
def test_expert_parallel_sizes_sglang_runs_are_accepted(per_engine, flags):
    parse_args(_argv(per_engine, *flags))


def test_an_all_to_all_backend_spanning_the_engine_replaces_the_ep_size_with_a_warning(caplog):
    # SGLang sets ep_size = tp_size for DeepEP whatever was given: accepted (the original's scripts run so), said once.
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        args = parse_args(_argv(8, "--sglang-ep-size", "3", "--sglang-moe-a2a-backend", "deepep"))
    assert args.sglang_args["ep_size"] == "3"
    warned = [r.getMessage() for r in caplog.records if "--sglang-ep-size" in r.getMessage()]
    assert warned == [
        "--sglang-ep-size 3 is not used: with --sglang-moe-a2a-backend deepep SGLang sets the expert-parallel size "
        "to each engine's tensor-parallel size 8 (--rollout-num-gpus-per-engine 8 / --sglang-pp-size 1)"
    ]
