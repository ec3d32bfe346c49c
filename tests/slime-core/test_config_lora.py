"""LoRA flags as the original's launch scripts spell them: honoured, or refused in one line naming the flag.

The original's FSDP LoRA (THUDM/slime before #370) took `--target-modules all-linear` or `q_proj,v_proj` and
`--exclude-modules`; its Megatron-Bridge LoRA `--enable-lora` and `--lora-dropout`. Here `--lora-target-modules` is
resolved at parse time to the HF module names the trainer's peft wraps and SGLang adapts.
"""

import pytest

from slime_core.config import ConfigError, SlimeArgs, parse_args

BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--train-backend", "fsdp"]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _targets(*flags: str) -> list[str]:
    return parse_args([*BASE, "--lora-rank", "8", *flags]).lora_target_modules


def test_the_originals_target_modules_spellings_resolve_to_module_names():
    # peft read a list entry "all-linear" as a module name: no module matched and the trainer stopped after the
    # engines started; "q_proj,v_proj" matched nothing either.
    assert _targets("--target-modules", "all-linear") == ALL
    assert _targets("--lora-target-modules", "all") == ALL  # SGLang's spelling
    assert _targets("--target-modules", "v_proj,q_proj") == ["q_proj", "v_proj"]
    assert _targets("--lora-target-modules", "down_proj", "q_proj,v_proj") == ["q_proj", "v_proj", "down_proj"]
    assert _targets("--target-modules", "all-linear", "--exclude-modules", "o_proj,down_proj") == [
        "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"]  # fmt: skip
    assert _targets("--exclude-modules", "gate_proj", "up_proj") == ["q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "down_proj"]  # fmt: skip
    # One quoted value holding several names (a shell variable, a YAML string) was one unknown name "q_proj v_proj".
    assert _targets("--target-modules", "v_proj q_proj") == ["q_proj", "v_proj"]
    assert _targets("--target-modules", " q_proj,\tv_proj ", "--exclude-modules", "v_proj o_proj") == ["q_proj"]


def test_a_target_module_no_engine_or_trainer_adapts_is_refused_naming_the_flag():
    # `q_proj foo_proj` adapted q_proj and dropped foo_proj without a word; Megatron names matched nothing.
    with pytest.raises(ConfigError) as e:
        _targets("--lora-target-modules", "q_proj", "foo_proj")
    assert str(e.value) == (
        "--lora-target-modules foo_proj: not a module an adapter can target; use q_proj, k_proj, v_proj, o_proj, "
        "gate_proj, up_proj, down_proj or all-linear (the HF names, which SGLang adapts too)"
    )
    with pytest.raises(ConfigError, match="^--lora-target-modules linear_qkv: not a module"):
        _targets("--lora-target-modules", "linear_qkv")
    with pytest.raises(ConfigError, match="^--exclude-modules o_prj: not a module"):
        _targets("--exclude-modules", "o_prj")
    with pytest.raises(ConfigError, match="^--lora-target-modules: no module left to adapt"):
        _targets("--target-modules", "q_proj", "--exclude-modules", "q_proj")


def test_resolved_targets_survive_a_second_validation():
    cfg = parse_args([*BASE, "--lora-rank", "8", "--target-modules", "all-linear", "--exclude-modules", "o_proj"])
    again = SlimeArgs.from_dict(cfg.model_dump())
    assert again.lora_target_modules == cfg.lora_target_modules == [m for m in ALL if m != "o_proj"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--lora-dropout", "0.1"],
            "--lora-dropout is not implemented in this version (adapters train without "
            "dropout (peft lora_dropout 0), as the engines serve them); remove it",
        ),
        (
            ["--enable-lora"],
            "--enable-lora is not implemented in this version (no Megatron-Bridge LoRA; LoRA is "
            "--lora-rank R --lora-alpha A [--lora-target-modules ...] with --train-backend fsdp); "
            "remove it",
        ),
        (
            ["--lora-adapter-path", "/ckpt/adapter"],
            "--lora-adapter-path is not implemented in this version (no adapter "
            "loading; LoRA trains a fresh adapter and resumes from --load "
            "(--lora-rank R)); remove it",
        ),
    ],
    ids=["dropout", "enable-lora", "adapter-path"],
)
def test_the_originals_other_lora_flags_are_refused_in_one_line(flags, message):
    # They were "unknown flag --lora-dropout; did you mean --offload-rollout?" (--enable-mtp-training, --lora-alpha).
    with pytest.raises(ConfigError) as e:
        parse_args([*BASE, "--lora-rank", "8", *flags])
    assert str(e.value) == message


def test_a_zero_lora_dropout_is_what_runs():
    assert parse_args([*BASE, "--lora-rank", "8", "--lora-dropout", "0"]).lora_dropout == 0.0
