"""Fixtures of the slime-core tests.

`_objective_args.py` (the objective tests' run config) is importable as module `slime_core_objective_args`:
registered here, before any test module is imported (pytest runs with `--import-mode=importlib`, so this folder is
not on `sys.path`).
"""

import importlib.util
import pathlib
import sys

import pytest

_spec = importlib.util.spec_from_file_location(
    "slime_core_objective_args", pathlib.Path(__file__).with_name("_objective_args.py")
)
sys.modules["slime_core_objective_args"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["slime_core_objective_args"])


@pytest.fixture
def fresh_config_state(monkeypatch):
    """The config's validation as a fresh process on a machine without CUDA sees it: no warning said yet
    (`base._WARNED`, warn-once), and `_cuda_available` False (the engine and placement derivations read it)."""
    from slime_core.config import base as config_base
    from slime_core.config import validation

    monkeypatch.setattr(config_base, "_WARNED", set())
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)
