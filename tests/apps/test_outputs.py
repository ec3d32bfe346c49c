"""Where the run writes (`slime_app.outputs`): unwritable folders fail before anything starts, a failed save in one
line naming the flag, the cause, the free space and the last complete checkpoint.

Found by fault injection: a demo run with `--save` on a 2 MiB tmpfs ended after its first rollout in a 60-line
traceback whose last line was `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598`
(exit 1); with `--save` on a read-only mount it failed only at that first save, after the engines and a rollout.
"""

import errno
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest
import ray.exceptions
from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from slime_app import loop
from slime_app.outputs import SaveFailed, check_writable, output_dirs, root_cause, save_failed
from slime_core.config import SlimeArgs

BASE = {"rollout_batch_size": 1, "num_rollout": 1}


def _cfg(tmp_path, **fields) -> SlimeArgs:
    return SlimeArgs.from_dict({**BASE, "output_dir": str(tmp_path / "out"), **fields})


def test_every_output_folder_is_created_and_probed(tmp_path):
    cfg = _cfg(tmp_path, save=str(tmp_path / "ckpt"), save_hf=str(tmp_path / "hf" / "iter_{rollout_id}"))
    assert [(flag, str(path)) for flag, path in output_dirs(cfg)] == [
        ("--output-dir", str(tmp_path / "out")),
        ("--save", str(tmp_path / "ckpt")),
        ("--save-hf", str(tmp_path / "hf")),
    ]
    check_writable(cfg)
    for folder in ("out", "ckpt", "hf"):
        assert os.listdir(tmp_path / folder) == []  # created, and the probe file removed


def test_a_folder_under_a_file_names_its_flag(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OSError, match=rf"^--save {re.escape(str(tmp_path / 'a-file' / 'ckpt'))} is not writable: "):
        check_writable(_cfg(tmp_path, save=str(tmp_path / "a-file" / "ckpt")))


def test_a_read_only_folder_names_its_flag(tmp_path, monkeypatch):
    # Root ignores file modes; the probe's open failing as on a read-only mount stands in for one.
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("tempfile.NamedTemporaryFile", read_only)
    hf = tmp_path / "hf" / "{rollout_id}"
    with pytest.raises(OSError, match=r"^--output-dir .* is not writable: Read-only file system$"):
        check_writable(_cfg(tmp_path, save_hf=str(hf)))


def test_the_cli_refuses_an_unwritable_save_before_ray_starts(tmp_path):
    (tmp_path / "a-file").write_text("x")
    from slime_app.demo import default_demo_argv

    argv = [*default_demo_argv(tmp_path / "run"), "--save", str(tmp_path / "a-file" / "ckpt")]
    script = "import sys, ray\nray.init = None  # any start of Ray fails the test\nfrom slime_app.cli import main\n"
    script += "sys.exit(main(sys.argv[1:]))\n"
    out = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
        env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1] == (
        f"slime: error: --save {tmp_path / 'a-file' / 'ckpt'} is not writable: Not a directory"
    )
    assert "Traceback" not in out.stderr


def _disk_full_from_rank_0() -> BaseException:
    """What the driver gets when rank 0's DCP write meets a full disk: Ray's task error around DCP's collection."""
    full = OSError(errno.ENOSPC, "No space left on device")
    collected = CheckpointException("write", {0: _wrap_exception(full)})
    return ray.exceptions.RayTaskError("TrainActor.save", "Traceback ...", collected).as_instanceof_cause()


def test_root_cause_sees_through_ray_and_dcp():
    cause = root_cause(_disk_full_from_rank_0())
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    plain = ValueError("x")
    assert root_cause(plain) is plain


def test_a_failed_save_is_one_line_naming_the_flag_the_cause_and_the_last_checkpoint(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("3\n")
    line = str(save_failed("the checkpoint of rollout 4", "--save", save, _disk_full_from_rank_0()))
    assert re.fullmatch(
        rf"saving the checkpoint of rollout 4 to --save {re.escape(str(save))} failed: OSError: \[Errno 28\] No space "
        rf"left on device \([0-9.]+ (B|KiB|MiB|GiB|TiB) free there\); the last complete checkpoint there \(iteration "
        rf"3\) is intact: resume with --load {re.escape(str(save))}",
        line,
    ), line
    fresh = save_failed("the checkpoint of rollout 0", "--save", tmp_path / "new" / "ckpt", RuntimeError("boom"))
    assert re.search(r"failed: RuntimeError: boom \([0-9.]+ \w+ free there\); no complete checkpoint there yet$",
                     str(fresh))  # fmt: skip
    hf = save_failed("the HF export of rollout 2", "--save-hf", tmp_path / "hf" / "2", RuntimeError("boom"))
    assert "checkpoint there" not in str(hf) and str(hf).startswith("saving the HF export of rollout 2 to --save-hf ")


def test_run_save_raises_save_failed_from_the_trainers_error(tmp_path, monkeypatch):
    save = tmp_path / "ckpt"

    class Trainer:
        def save(self, rollout_id):
            raise _disk_full_from_rank_0()

    manager = types.SimpleNamespace(save=types.SimpleNamespace(remote=lambda rollout_id: ("cursor", rollout_id)))
    run = types.SimpleNamespace(cfg=_cfg(tmp_path, save=str(save)), manager=manager, trainer=Trainer())
    monkeypatch.setattr(loop.ray, "get", lambda ref: ref)
    with pytest.raises(SaveFailed, match=r"^saving the checkpoint of rollout 7 to --save .* No space left on device"):
        loop.Run.save(run, 7)


def test_the_save_failure_reaches_the_cli_as_exit_5(tmp_path):
    # The real CLI with a Run whose save fails as a full disk makes it: one line, exit 5, no traceback.
    script = f"""
import sys
from slime_app import loop, outputs
class Run:
    def __init__(self, cfg):
        self.cfg = cfg
    def run(self):
        raise outputs.save_failed("the checkpoint of rollout 0", "--save", {str(tmp_path / "ckpt")!r},
                                  OSError(28, "No space left on device"))
    def close(self):
        print("closed", flush=True)
loop.Run = Run
from slime_app.cli import main
sys.exit(main(sys.argv[1:]))
"""
    argv = ["--rollout-batch-size", "1", "--num-rollout", "1", "--output-dir", str(tmp_path / "out"),
            "--rollout-engine", "reference", "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1"]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    assert out.returncode == 5, out.stderr[-3000:]
    assert out.stdout == "closed\n"
    assert out.stderr.splitlines()[-1].startswith(
        f"slime: error: saving the checkpoint of rollout 0 to --save {tmp_path / 'ckpt'} failed: OSError: [Errno 28] "
    )
    assert "Traceback" not in out.stderr


def test_output_dirs_of_a_relative_save_hf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flags = dict(output_dirs(_cfg(tmp_path, save_hf="exports/{rollout_id}")))
    assert flags["--save-hf"] == pathlib.Path(tmp_path / "exports")
