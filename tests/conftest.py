"""Shared test configuration: fixture paths and CPU-only defaults.

Kept free of package imports so each package's tests can run in isolation
(`uv run --exact --package <pkg> --group dev pytest tests/<pkg>`).
"""

import os
import pathlib

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

# No hub access in tests: everything is built from config or read from tests/fixtures.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
    """Path of tests/fixtures."""
    return FIXTURES


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> pathlib.Path:
    """Directory with the real Qwen3 tokenizer (tokenizer.json + tokenizer_config.json)."""
    return FIXTURES / "qwen3-tokenizer"
