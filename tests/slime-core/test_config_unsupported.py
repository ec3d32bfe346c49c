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
