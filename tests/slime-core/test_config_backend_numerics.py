"""Optimizer and precision flags a backend does not implement are refused in one line, not trained around.

Both trainers build AdamW whatever `--optimizer` says (FSDP: `slime_train_fsdp.trainer_parts.build_optimizer`,
Megatron: `OptimizerConfig(optimizer="adam")`), and FSDP computes in bf16 on GPU / fp32 on CPU whatever `--fp16`
says; before the fix both flags were accepted and ignored (issue 27).
"""

import importlib.util

import pytest

from slime_core.config import ConfigError, SlimeArgs, parse_args

BASE = ["--rollout-batch-size", "1", "--num-rollout", "1"]


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_optimizer_sgd_is_refused_naming_the_flag_and_backend(backend):
    with pytest.raises(ConfigError) as err:
        parse_args([*BASE, "--train-backend", backend, "--optimizer", "sgd"])
    assert str(err.value) == (
        f"--optimizer sgd is not implemented with --train-backend {backend}; use --optimizer adam"
    )
    assert parse_args([*BASE, "--train-backend", backend, "--optimizer", "adam"]).optimizer == "adam"


def test_fp16_is_refused_by_fsdp():
    with pytest.raises(ConfigError) as err:
        parse_args([*BASE, "--train-backend", "fsdp", "--fp16"])
    assert str(err.value) == (
        "--fp16 is not implemented with --train-backend fsdp (no float16 training with loss scaling); use --bf16, "
        "or --train-backend megatron"
    )
    assert parse_args([*BASE, "--train-backend", "fsdp", "--bf16"]).bf16


def test_fp16_is_accepted_by_megatron_which_trains_in_float16():
    from slime_train_megatron.settings import MegatronSettings

    args = parse_args([*BASE, "--train-backend", "megatron", "--fp16"])
    settings = MegatronSettings.from_config(args)
    assert settings.fp16 and not settings.bf16 and settings.params_dtype_name == "float16"


def test_max_tokens_per_gpu_without_dynamic_batch_size_warns_that_it_does_nothing(monkeypatch, caplog):
    # Packing reads --max-tokens-per-gpu only with --use-dynamic-batch-size (as the original); before, the memory
    # budget a user set was dropped without a word.
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once remembers keys per process
    with caplog.at_level("WARNING", logger="slime_core.config.base"):
        parse_args([*BASE, "--max-tokens-per-gpu", "4096", "--micro-batch-size", "1"])
    assert [r.getMessage() for r in caplog.records if "--max-tokens-per-gpu" in r.getMessage()] == [
        "--max-tokens-per-gpu has no effect without --use-dynamic-batch-size: micro-batches hold --micro-batch-size "
        "1 samples"
    ]
    caplog.clear()
    monkeypatch.setattr(config_base, "_WARNED", set())
    with caplog.at_level("WARNING", logger="slime_core.config.base"):
        parse_args([*BASE, "--max-tokens-per-gpu", "4096", "--use-dynamic-batch-size"])
    assert not [r for r in caplog.records if "--max-tokens-per-gpu" in r.getMessage()]


def test_micro_batch_size_with_dynamic_batch_size_warns_that_the_token_budget_wins(monkeypatch, caplog):
    # Both flags set: packing follows --max-tokens-per-gpu (the original's precedence); the ignored sample count
    # is named instead of being dropped without a note.
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())
    argv = [*BASE, "--n-samples-per-prompt", "4", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "64"]
    with caplog.at_level("WARNING", logger="slime_core.config.base"):
        args = parse_args([*argv, "--micro-batch-size", "2"])
    assert args.micro_batch_size == 2
    assert [r.getMessage() for r in caplog.records if "--micro-batch-size" in r.getMessage()] == [
        "--micro-batch-size 2 has no effect with --use-dynamic-batch-size: micro-batches are packed up to "
        "--max-tokens-per-gpu"
    ]


def test_attn_implementation_is_checked_when_the_config_is_read(monkeypatch):
    # Was: any string passed --dry-run and reached transformers only on the GPU node, after the engines started
    # (the original geo3k recipe's flash_attention_3, which the GPU image does not carry); with Megatron it was
    # accepted and never read.
    for attn in ("auto", "slime_varlen", "slime_flex", "sdpa", "eager"):
        assert parse_args([*BASE, "--train-backend", "fsdp", "--attn-implementation", attn]).attn_implementation == attn
    choices = "'auto', 'slime_varlen', 'slime_flex', 'sdpa', 'eager', 'flash_attention_2', 'flash_attention_3'"
    with pytest.raises(ConfigError) as e:  # a Literal of the config: the allowed values named, for either backend
        parse_args([*BASE, "--train-backend", "megatron", "--attn-implementation", "flash"])
    assert str(e.value) == f"argument --attn-implementation: invalid choice: 'flash' (choose from {choices})"
    with pytest.raises(ConfigError) as e:  # a config file or dict
        SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "attn_implementation": "flash"})
    assert str(e.value) == (
        "--attn-implementation: Input should be 'auto', 'slime_varlen', 'slime_flex', 'sdpa', 'eager', "
        "'flash_attention_2' or 'flash_attention_3' (got 'flash')"
    )
    with pytest.raises(ConfigError, match=r"^--attn-implementation sdpa is an FSDP flag, not read by --train-backend"):
        parse_args([*BASE, "--train-backend", "megatron", "--attn-implementation", "sdpa"])
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn_interface" else
                        found(name, *a))  # fmt: skip
    with pytest.raises(ConfigError, match=r"flash_attention_3 needs the flash_attn_interface package, which is not"):
        parse_args([*BASE, "--train-backend", "fsdp", "--attn-implementation", "flash_attention_3"])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn_interface" else
                        found(name, *a))  # fmt: skip
    args = parse_args([*BASE, "--train-backend", "fsdp", "--attn-implementation", "flash_attention_3"])
    assert args.attn_implementation == "flash_attention_3"


@pytest.mark.parametrize(
    ("flag", "instead"),
    [
        (
            "--gradient-checkpointing",
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
        ),
        ("--fsdp-cpu-offload", "--optimizer-cpu-offload (optimizer states on CPU)"),
    ],
)
def test_fsdp_memory_flags_are_refused_by_megatron(flag, instead):
    # Was: accepted with --train-backend megatron and never read (no HF model, no FSDP2 wrapper): the run kept every
    # activation and every optimizer state on the GPU although the flag asked otherwise.
    with pytest.raises(ConfigError) as err:
        parse_args([*BASE, "--train-backend", "megatron", flag])
    assert str(err.value) == f"{flag} is an FSDP flag, not read by --train-backend megatron; use {instead}"
    field = flag[2:].replace("-", "_")
    assert getattr(parse_args([*BASE, "--train-backend", "fsdp", flag]), field) is True


def test_fsdp_compile_layers_with_megatron_says_it_has_no_effect(caplog, monkeypatch):
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())
    with caplog.at_level("WARNING", logger="slime_core.config.base"):
        parse_args([*BASE, "--train-backend", "megatron", "--fsdp-compile-layers"])
    assert "--fsdp-compile-layers has no effect with --train-backend megatron (use --megatron-compile-layers)" in [
        r.getMessage() for r in caplog.records
    ]
