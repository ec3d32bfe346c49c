"""`--help` lists the registered names of every flag chosen by name (README, "Extending slime")."""

import importlib.metadata

from slime_app.cli import main
from slime_core.config import build_parser

# README's table: flag -> entry-point group.
CHOSEN_BY_NAME = {
    "train_backend": "slime.train_backends",
    "rollout_engine": "slime.rollout_engines",
    "rm_type": "slime.rewards",
    "advantage_estimator": "slime.advantage_estimators",
    "weight_sync": "slime.weight_updaters",
    "env_path": "slime.envs",
}


def test_every_flag_chosen_by_name_lists_its_registry():
    # --env-path's help named neither its entry-point group nor the installed environments.
    help_text = {a.dest: " ".join((a.help or "").split()) for a in build_parser()._actions}
    for dest, group in CHOSEN_BY_NAME.items():
        assert f"(entry-point group {group})." in help_text[dest], dest
    envs = sorted({ep.name for ep in importlib.metadata.entry_points(group="slime.envs")})
    assert envs == ["calculator", "python", "search"]  # slime-envs' pyproject.toml
    assert help_text["env_path"].endswith("Registered: calculator, python, search (entry-point group slime.envs).")


def test_the_apps_help_prints_them(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Registered: calculator, python, search (entry-point group slime.envs)." in out
