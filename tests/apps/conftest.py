"""Fixtures shared by the end-to-end tests of the apps: the tiny Qwen3 they train and a TensorBoard scalar reader.

`_loop_fakes.py` (the training loop's test doubles) is importable as module `slime_app_loop_fakes`: registered here,
before any test module is imported (pytest runs with `--import-mode=importlib`, so this folder is not on `sys.path`).
"""

import importlib.util
import json
import pathlib
import sys
from collections.abc import Callable

import pytest

_FAKES = pathlib.Path(__file__).with_name("_loop_fakes.py")
_spec = importlib.util.spec_from_file_location("slime_app_loop_fakes", _FAKES)
sys.modules["slime_app_loop_fakes"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sys.modules["slime_app_loop_fakes"])


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory, make_tiny_qwen3) -> pathlib.Path:
    """A tiny random Qwen3 (2 layers, hidden 32, 4 heads / 2 KV heads of 8, fp32, seed 0, the real Qwen3 tokenizer).

    Written once per test process; runs only read it (`--hf-checkpoint`), and write their outputs elsewhere.
    """
    return make_tiny_qwen3(
        tmp_path_factory.mktemp("tiny-qwen3"), hidden_size=32, intermediate_size=64, head_dim=8,
        max_position_embeddings=1024,
    )  # fmt: skip


def _read_scalars(tb_dir: pathlib.Path, key: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    steps = [e.step for e in acc.Scalars(key)]
    # As a dict, two points at one step (which TensorBoard draws both of) kept the last silently.
    assert len(set(steps)) == len(steps), f"{key}: two points at one step in {tb_dir}: steps {steps}"
    return {e.step: e.value for e in acc.Scalars(key)}


@pytest.fixture(scope="session")
def tb_scalars() -> Callable[[pathlib.Path, str], dict[int, float]]:
    """`tb_scalars(tb_dir, key) -> {step: value}`: one scalar series of a run's TensorBoard logs.

    `tb_dir` is the run's `<--output-dir>/tensorboard`; an unknown `key` raises KeyError (TensorBoard's), a series
    with two points at one step an AssertionError.
    """
    return _read_scalars


def _cli_without_ray(argv: list[str]):
    import os
    import subprocess
    import sys

    script = "import sys, ray\nray.init = None  # any start of Ray fails the test\nfrom slime_app.cli import main\n"
    script += "sys.exit(main(sys.argv[1:]))\n"
    return subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip


@pytest.fixture(scope="session")
def cli_without_ray() -> Callable:
    """`cli_without_ray(argv) -> CompletedProcess`: `slime_app.cli.main(argv)` in a fresh process where any start of
    Ray raises, so a test shows that a refusal came before Ray (text output, 300 s timeout, `RAY_ADDRESS` unset)."""
    return _cli_without_ray


_FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def qwen3_4b_stub(tmp_path, stub_weights) -> pathlib.Path:
    """A Qwen3-4B checkpoint folder with the real config.json and tokenizer and stub weights (`--dry-run` tests)."""
    out = tmp_path / "Qwen3-4B"
    out.mkdir()
    stub_weights(out)
    config = json.loads((_FIXTURES / "hf-configs" / "Qwen3-4B.json").read_text())
    # As the released checkpoint's config.json (4.51.0): without it transformers takes a local tokenizer for a
    # possible Mistral one and warns on stderr when the prompt-length limit loads it.
    config.setdefault("transformers_version", "4.51.0")
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((_FIXTURES / "qwen3-tokenizer" / name).read_bytes())
    return out
