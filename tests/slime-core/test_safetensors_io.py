"""`slime_core.safetensors_io`: safetensors files get the mode `open()` would give them, not safetensors' 0600.

safetensors >= 0.8 writes 0600 whatever the umask (safetensors/safetensors#782): an HF export's weights were then
readable by their owner only, next to a 0644 `config.json`. The umask is process state, so each test sets it and
puts the previous one back.
"""

import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from slime_core.hf_checkpoint import write_hf_checkpoint
from slime_core.safetensors_io import new_file_mode, save_safetensors


@pytest.fixture
def umask():
    """Sets the process umask for one test and restores the previous one."""
    previous = os.umask(0o022)
    try:
        yield lambda mask: os.umask(mask)
    finally:
        os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize(("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_the_file_gets_what_open_gives(umask, tmp_path, mask, expected):
    umask(mask)
    assert new_file_mode() == expected
    path = tmp_path / "w.safetensors"
    save_safetensors({"a": torch.arange(3.0)}, path, metadata={"format": "pt"})
    (tmp_path / "plain.json").write_text("{}")
    assert _mode(path) == _mode(tmp_path / "plain.json") == expected
    assert load_file(str(path))["a"].tolist() == [0.0, 1.0, 2.0]


def test_an_hf_export_is_readable_like_its_config(umask, tmp_path):
    umask(0o022)
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    write_hf_checkpoint([("w", torch.ones(2))], tmp_path / "out", source_dir=src, is_writer=True)
    assert _mode(tmp_path / "out" / "model.safetensors") == _mode(tmp_path / "out" / "config.json") == 0o644
