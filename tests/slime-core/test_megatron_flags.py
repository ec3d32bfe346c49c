"""Megatron flags: every accepted flag has a rule per backend, and validation applies it (no silent ignores)."""

import logging

import pytest

from slime_core.config import ConfigError, SlimeArgs, parse_args
from slime_core.config import base as config_base
from slime_core.config.megatron_checks import megatron_flag_values
from slime_core.config.megatron_flags import MEGATRON_FLAG_RULES, MEGATRON_FLAGS

MINIMAL = ["--rollout-batch-size", "4", "--num-rollout", "2"]
FSDP = ["--train-backend", "fsdp", *MINIMAL]
MEGATRON = ["--train-backend", "megatron", *MINIMAL]


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once remembers keys per process


def test_every_rule_is_well_formed():
    megatron_kinds = {"check", "read", "same", "neutral", "noop", "error"}
    fsdp_kinds = megatron_kinds | {"recompute"}
    for flag, rule in MEGATRON_FLAG_RULES.items():
        assert flag.startswith("--") and flag == flag.lower(), flag
        assert rule.megatron in megatron_kinds and rule.fsdp in fsdp_kinds, flag
        if flag != "--spec":  # a layer spec describes the Megatron model only (FSDP runs the HF model)
            assert (rule.megatron == "check") == (rule.fsdp == "check"), flag  # a description is one for both
        if "neutral" in (rule.megatron, rule.fsdp):
            assert rule.neutral is not None, flag
        if "error" in (rule.megatron, rule.fsdp) or "noop" in (rule.megatron, rule.fsdp):
            assert rule.note, flag  # says why, or what to use instead
    assert MEGATRON_FLAGS == frozenset(MEGATRON_FLAG_RULES)


def test_flag_values_parse_like_argparse():
    tokens = ["--num-layers", "36", "--swiglu", "--x=1", "--cuda-bs", "1", "2", "--num-layers", "28"]
    assert megatron_flag_values(tokens) == {"--num-layers": "28", "--swiglu": True, "--x": "1", "--cuda-bs": ["1", "2"]}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tensor-model-parallel-size", "2"], r"--tensor-model-parallel-size 2 is not implemented with "
         r"--train-backend fsdp, only 1 \(FSDP shards parameters over all trainer ranks: use --train-backend megatron"),
        (["--optimizer-cpu-offload"], r"--optimizer-cpu-offload is not implemented with --train-backend fsdp \(use "
         r"--fsdp-cpu-offload"),
        (["--moe-aux-loss-coeff", "1e-3"], r"--moe-aux-loss-coeff 1e-3 is not implemented with --train-backend fsdp, "
         r"only 0"),
        (["--moe-router-dtype", "fp32"], r"--moe-router-dtype is not implemented with --train-backend fsdp"),
        (["--recompute-granularity", "selective"], r"--recompute-granularity selective is not implemented with "
         r"--train-backend fsdp \(FSDP recomputes whole layers only"),
        (["--fp8-format", "e4m3"], r"--fp8-format is not implemented with --train-backend fsdp \(no FP8 training"),
    ],
)  # fmt: skip
def test_fsdp_rejects_what_it_does_not_implement_in_one_line(flags, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_args([*FSDP, *flags])
    assert "\n" not in str(info.value)


def test_fsdp_accepts_neutral_values_and_maps_full_recompute(caplog):
    flags = ["--tensor-model-parallel-size", "1", "--moe-aux-loss-coeff", "0.0", "--sequence-parallel",
             "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
             "--accumulate-allreduce-grads-in-fp32", "--attention-backend", "flash", "--moe-token-drop-policy", "probs",
             "--use-distributed-optimizer"]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        # Groups of two: GRPO on one-sample groups warns that its advantages are all 0 (not this test's warning).
        args = parse_args([*FSDP, "--n-samples-per-prompt", "2", *flags])
        SlimeArgs.from_dict(args.to_dict())  # re-validated in a worker: same result, no second warning
    assert args.gradient_checkpointing is True  # Megatron's full per-layer recompute = HF gradient checkpointing
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "--train-backend fsdp: Megatron flags with no effect on math or memory here (kernel choices, Megatron's "
        "pretraining loop; MIGRATION.md): --attention-backend --sequence-parallel"
    ]
    assert not parse_args([*FSDP, "--recompute-method", "uniform"]).gradient_checkpointing  # no granularity: inert


def test_megatron_rejects_what_its_backend_does_not_implement():
    with pytest.raises(ConfigError, match=r"--fp8-format is not implemented with --train-backend megatron"):
        parse_args([*MEGATRON, "--fp8-format", "e4m3"])
    # --spec is compared with config.json by preflight (tests/slime-core/test_architecture.py), not rejected here.
    assert parse_args([*MEGATRON, "--spec", "slime_plugins.models.glm4", "get_glm_spec"]).megatron_args[0] == "--spec"
    # The vocabulary padding is the Megatron backend's (MegatronSettings); FSDP never pads, so it is a no-op there.
    assert parse_args([*MEGATRON, "--make-vocab-size-divisible-by", "16"]).make_vocab_size_divisible_by == 16
    assert parse_args([*FSDP, "--make-vocab-size-divisible-by", "64"]).megatron_args[-1] == "64"
    args = parse_args([*MEGATRON, "--optimizer-cpu-offload", "--moe-router-dtype", "fp32", "--moe-permute-fusion"])
    assert args.megatron_args == ["--optimizer-cpu-offload", "--moe-router-dtype", "fp32", "--moe-permute-fusion"]
    # The same flags under FSDP: --spec is a no-op (the HF model is the architecture).
    assert parse_args([*FSDP, "--spec", "slime_plugins.models.glm4", "get_glm_spec"]).megatron_args[0] == "--spec"


def test_original_unknown_flags_of_the_scripts_now_parse():
    # Stopped the original scripts before (issue 15): now each has a rule.
    flags = ("--moe-token-drop-policy", "--post-self-attn-layernorm", "--post-mlp-layernorm", "--attention-output-gate",
             "--use-gated-attention", "--moe-shared-expert-gate", "--no-position-embedding", "--enable-experimental",
             "--no-check-for-nan-in-loss-and-grad")  # fmt: skip
    assert set(flags) <= MEGATRON_FLAGS


def test_raw_megatron_args_outside_the_table():
    # A raw `megatron_args` list (YAML or code) may hold flags the table lacks: Megatron's own parser judges them
    # (slime's --fp32 extension is one); under FSDP they are an error, not silently dropped.
    raw = {"rollout_batch_size": 1, "num_rollout": 1, "megatron_args": ["--fp32"]}
    assert SlimeArgs.from_dict({**raw, "train_backend": "megatron"}).megatron_args == ["--fp32"]
    with pytest.raises(ConfigError, match=r"megatron_args: --fp32 is not a Megatron flag slime knows"):
        SlimeArgs.from_dict({**raw, "train_backend": "fsdp"})
