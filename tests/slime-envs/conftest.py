"""Fixtures of the slime-envs tests.

`_sandbox_hostile.py` (the hostile suites' attack prelude and process probe) is importable as module
`slime_sandbox_hostile`: registered here, before any test module is imported (pytest runs with
`--import-mode=importlib`, so this folder is not on `sys.path`).
"""

import importlib.util
import pathlib
import sys

import pytest

_HOSTILE = importlib.util.spec_from_file_location(
    "slime_sandbox_hostile", pathlib.Path(__file__).with_name("_sandbox_hostile.py")
)
sys.modules[_HOSTILE.name] = importlib.util.module_from_spec(_HOSTILE)
_HOSTILE.loader.exec_module(sys.modules[_HOSTILE.name])


@pytest.fixture
def host_survives_and_nothing_leaks(monkeypatch):
    """The hostile suites' frame: a canary secret in the host's environment, and no sandbox process left after."""
    from slime_sandbox_hostile import CANARY, sandbox_pids

    monkeypatch.setenv("SLIME_SANDBOX_CANARY", CANARY)
    yield
    assert sandbox_pids() == []
