"""Flags parsed for compatibility but not implemented fail loudly when set, and only then."""

import pytest

from slime_core.config import ConfigError, parse_args, unsupported

BASE = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1"]


def test_unsupported_flag_set_is_an_error_naming_it(monkeypatch):
    monkeypatch.setitem(unsupported.UNSUPPORTED, "wandb_team", "no team support; use --wandb-project")
    with pytest.raises(ConfigError) as err:
        parse_args([*BASE, "--wandb-team", "mine"])
    assert str(err.value) == (
        "--wandb-team is not implemented in this version (no team support; use --wandb-project); remove it"
    )


def test_unsupported_flag_left_at_default_is_accepted(monkeypatch):
    monkeypatch.setitem(unsupported.UNSUPPORTED, "wandb_team", "no team support")
    args = parse_args(BASE)
    assert args.wandb_team is None


def test_every_unsupported_entry_is_a_real_field():
    from slime_core.config import SlimeArgs

    assert set(unsupported.UNSUPPORTED) <= set(SlimeArgs.model_fields)


def test_help_marks_unsupported_flags(monkeypatch, capsys):
    from slime_core.config import cli

    monkeypatch.setitem(unsupported.UNSUPPORTED, "wandb_team", "no team support")
    cli.build_parser.cache_clear()  # the parser is built once per process
    try:
        with pytest.raises(SystemExit):
            parse_args(["--help"])
    finally:
        cli.build_parser.cache_clear()
    out = " ".join(capsys.readouterr().out.split())
    assert "--wandb-team WANDB_TEAM NOT IMPLEMENTED (no team support). W&B entity." in out


def test_help_lists_original_flags_that_are_not_fields(capsys):
    # README: flags not implemented are "still parsed, marked NOT IMPLEMENTED in --help"; the 27 original flags that
    # are no config field (e.g. --warmup-ratio, --wandb-run-name) were refused when given but absent from --help.
    from slime_core.config.unsupported import UNSUPPORTED_FLAGS, unsupported_flag_note

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert len(UNSUPPORTED_FLAGS) >= 25  # 27, less --lr-wsd-decay-iters/-style (built since)
    for flag in UNSUPPORTED_FLAGS:
        note = " ".join(unsupported_flag_note(flag).split())
        # argparse may break a line inside a hyphenated word ("--wandb- group"): compare with hyphen breaks undone.
        assert f"{flag} [VALUE] NOT IMPLEMENTED ({note})." in out.replace("- ", "-"), flag


def test_original_flags_that_are_not_fields_are_one_line_errors():
    from slime_core.config.unsupported import UNSUPPORTED_FLAGS, unsupported_flag_note

    for flag in UNSUPPORTED_FLAGS:
        with pytest.raises(ConfigError) as info:
            parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", flag, "1"])
        assert (
            str(info.value) == f"{flag} is not implemented in this version ({unsupported_flag_note(flag)}); remove it"
        )
    # The accepted default is named once, from UNSUPPORTED_FLAG_DEFAULTS.
    assert unsupported_flag_note("--memory-recorder") == (
        "no built-in memory profiler; use torch.cuda.memory._record_memory_history (torch, the original's default, "
        "is accepted)"
    )
    assert unsupported_flag_note("--warmup-ratio") == UNSUPPORTED_FLAGS["--warmup-ratio"] == "use --lr-warmup-fraction"


@pytest.mark.parametrize(
    "given", [["--rollout-data-transport", "object-store"], ["--rollout-data-transport=object-store"],
              ["--memory-recorder", "torch"]],
)  # fmt: skip
def test_original_flags_that_are_not_fields_are_accepted_at_the_originals_default(given):
    # Was refused ("--rollout-data-transport is not implemented ...; remove it") although object-store is the
    # original's default and what this version does: a script spelling the default out failed.
    args = parse_args([*BASE, *given])
    assert args.rollout_batch_size == 2
    with pytest.raises(ConfigError, match=f"^{given[0].split('=')[0]} is not implemented in this version"):
        parse_args([*BASE, given[0].split("=")[0], {"--memory-recorder": "memray"}.get(given[0], "nixl")])


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
def test_wsd_runs_on_both_backends_with_its_anneal_length(backend):
    # Was refused on both ("--lr-decay-style WSD is not implemented with --train-backend X", and --lr-wsd-decay-iters
    # / --lr-wsd-decay-style "not implemented in this version").
    run = ["--rollout-batch-size", "1", "--num-rollout", "1", "--train-backend", backend, "--lr-decay-style", "WSD"]
    args = parse_args([*run, "--lr-wsd-decay-iters", "3", "--lr-wsd-decay-style", "minus_sqrt"])
    assert (args.lr_decay_style, args.lr_wsd_decay_iters, args.lr_wsd_decay_style) == ("WSD", 3, "minus_sqrt")
    assert parse_args([*run, "--lr-wsd-decay-iters", "3"]).lr_wsd_decay_style == "exponential"  # Megatron-LM's
    # megatron-core asserts an anneal length when the trainer builds its scheduler, after the engines started.
    with pytest.raises(ConfigError) as e:
        parse_args(run)
    assert str(e.value) == (
        "--lr-decay-style WSD needs --lr-wsd-decay-iters N: the optimizer steps of the anneal from --lr to --min-lr, "
        "which ends at --lr-decay-iters (or the run's last step)"
    )
    with pytest.raises(ConfigError, match="--lr-wsd-decay-style: invalid choice: 'square'"):
        parse_args([*run, "--lr-wsd-decay-iters", "3", "--lr-wsd-decay-style", "square"])
    for style in ("inverse-square-root", "cosine"):  # both backends have every style of megatron-core
        parse_args([*run[:-1], style])


def test_wsd_flags_under_another_style_warn_that_they_do_nothing(monkeypatch, caplog):
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once remembers keys per process
    with caplog.at_level("WARNING", logger="slime_core.config.base"):
        parse_args([*BASE, "--lr-decay-style", "cosine", "--lr-wsd-decay-iters", "3", "--lr-wsd-decay-style", "linear"])
    assert [r.getMessage() for r in caplog.records if "--lr-wsd" in r.getMessage()] == [
        "--lr-wsd-decay-iters and --lr-wsd-decay-style have no effect with --lr-decay-style cosine (they shape the "
        "anneal of --lr-decay-style WSD)"
    ]


def test_use_critic_of_the_originals_ppo_docs_says_what_turns_the_critic_on():
    # The original's PPO docs (docs/en/advanced/megatron-config.md) pass --use-critic, which its parser ignores (it
    # derives use_critic from --advantage-estimator ppo); here it was "unknown flag --use-critic; did you mean
    # --use-tis?", which pointed at an unrelated flag.
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--advantage-estimator", "ppo", "--use-critic"])
    assert str(info.value) == (
        "--use-critic is not implemented in this version (the PPO critic is on exactly with --advantage-estimator ppo, "
        "as in the original, which derives it); remove it"
    )
