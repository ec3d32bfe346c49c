"""The on-policy-distillation demo: its run config (valid, no training reward, a math-graded eval, the teacher
flags) and the teacher engine it starts, which never outlives it.
"""

import os
import signal
import time

import pytest
import yaml

from slime_app.demo import EVAL_DATA, MODEL_DIR
from slime_app.demo.opd import opd_argv, teacher_engine
from slime_core.config import parse_args


def test_sglang_and_fsdp_teacher_configs(tmp_path):
    sglang = parse_args(opd_argv(tmp_path / "s", ["--opd-type", "sglang", "--rm-url", "http://t:1/generate"], 40))
    assert sglang.use_opd and sglang.opd_type == "sglang" and sglang.rm_type is None  # no task reward
    assert sglang.num_rollout == 40 and sglang.colocate and sglang.hf_checkpoint == str(MODEL_DIR)
    (dataset,) = yaml.safe_load((tmp_path / "s" / "eval.yaml").read_text())["eval"]["datasets"]
    assert dataset == {"name": "demo", "path": str(EVAL_DATA), "rm_type": "math"}  # eval keeps the task reward
    fsdp = parse_args(opd_argv(tmp_path / "f", ["--opd-type", "fsdp", "--opd-teacher-load", str(MODEL_DIR)], 8))
    assert fsdp.opd_type == "fsdp" and fsdp.opd_teacher_load == str(MODEL_DIR) and fsdp.rm_url is None


def _children_running(module: str) -> list[int]:
    """Pids of this process's children whose command line runs `module` (zombies left out)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if int(ppid) == os.getpid() and state != "Z" and module.encode() in argv:
            found.append(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_frozen_teacher_engine_is_killed_when_the_demo_ends(tmp_path):
    # Issue 27: a teacher engine frozen with SIGSTOP was sent SIGTERM (pending while stopped) and waited on for
    # 60 s; the wait then raised TimeoutExpired out of the demo and left the engine stopped, an orphan.
    module = "slime_rollout.engines.reference"
    with teacher_engine(MODEL_DIR, tmp_path / "teacher.log"):
        (pid,) = _children_running(module)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
    try:
        assert time.monotonic() - t0 < 30 and not _children_running(module)
    finally:
        for left in _children_running(module):
            os.kill(left, signal.SIGKILL)
