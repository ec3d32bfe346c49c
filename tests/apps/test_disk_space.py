"""Free space for one save, checked before the engines start (issue 27): a full disk failed at the first save."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from slime_app import disk_space
from slime_app.disk_space import check_free_space, min_save_bytes
from slime_core.config import parse_args


def _model(folder, dtype, size):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "dtype": dtype}))
    (folder / "model.safetensors").write_bytes(b"\0" * size)
    return folder


def _cfg(tmp_path, model, *extra):
    return parse_args(["--rollout-batch-size", "1", "--num-rollout", "2", "--hf-checkpoint", str(model),
                       "--save", str(tmp_path / "ckpt"), *extra])  # fmt: skip


def _free(monkeypatch, free):
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda path: usage._replace(free=free))


def test_min_save_bytes_counts_parameters_in_16_bits(tmp_path):
    assert min_save_bytes(_model(tmp_path / "fp32", "float32", 4000)) == 2000  # 1000 parameters
    assert min_save_bytes(_model(tmp_path / "bf16", "bfloat16", 4000)) == 4000  # 2000 parameters
    (tmp_path / "empty").mkdir()
    assert min_save_bytes(tmp_path / "empty") == 0


def test_a_save_that_cannot_fit_is_refused(tmp_path, monkeypatch):
    model = _model(tmp_path / "m", "bfloat16", 4000)
    _free(monkeypatch, 3999)
    with pytest.raises(OSError, match=rf"^--save {tmp_path}: one save needs at least 0.00 GiB .* only 0.00 GiB free"):
        check_free_space(_cfg(tmp_path, model))
    _free(monkeypatch, 4000)
    check_free_space(_cfg(tmp_path, model))
    # --save and --save-hf on one filesystem: both saves must fit.
    with pytest.raises(OSError, match=r"^--save .* and --save-hf .*: one save needs at least"):
        check_free_space(_cfg(tmp_path, model, "--save-hf", str(tmp_path / "hf" / "{rollout_id}")))
    _free(monkeypatch, 1)
    check_free_space(_cfg(tmp_path, model, "--lora-rank", "4", "--train-backend", "fsdp"))  # adapters only: not checked


def test_the_cli_refuses_a_full_disk_before_ray_starts(tmp_path):
    from slime_app.demo import default_demo_argv

    # A full disk: disk_usage reports 1 free byte. Any start of Ray fails the test.
    script = (
        "import shutil, sys, ray\nray.init = None\nusage = shutil.disk_usage('/')\n"
        "shutil.disk_usage = lambda path: usage._replace(free=1)\n"
        "from slime_app.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, *default_demo_argv(tmp_path / "run")], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.splitlines()[-1]
    assert last.startswith(f"slime: error: --save {tmp_path / 'run' / 'checkpoints'} and --save-hf ")
    assert "free there; free space or save elsewhere" in last
