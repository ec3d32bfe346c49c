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
