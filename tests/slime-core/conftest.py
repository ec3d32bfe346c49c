"""Fixtures of the slime-core tests."""

import pytest


@pytest.fixture
def fresh_config_state(monkeypatch):
    """The config's validation as a fresh process on a machine without CUDA sees it: no warning said yet
    (`base._WARNED`, warn-once), and `_cuda_available` False (the engine and placement derivations read it)."""
    from slime_core.config import base as config_base
    from slime_core.config import validation

    monkeypatch.setattr(config_base, "_WARNED", set())
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)
