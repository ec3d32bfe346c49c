"""The run's processes die with the driver (`slime_app.reaper`), also when its whole process group is killed."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from slime_app.demo import MODEL_DIR
from slime_app.reaper import descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

DRIVER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from slime_app.reaper import start_reaper
    reaper = start_reaper()
    # Like Ray's daemons and the engines: children in their own sessions, and a grandchild.
    a = subprocess.Popen(["sleep", "300"], start_new_session=True)
    child = "import subprocess, time; subprocess.Popen(['sleep', '301']); time.sleep(300)"
    b = subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
    print("ready", flush=True)
    if sys.argv[1] == "release":
        time.sleep(2)
        reaper.release()
        a.kill(); os.killpg(b.pid, 9)  # b and its sleep 301 (which b.kill() left running with ppid 1)
        sys.exit(0)
    time.sleep(300)
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline") as f:
        return f.read().replace("\0", " ")


def _start(tmp_path: pathlib.Path, mode: str) -> tuple[subprocess.Popen, dict[int, str]]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.Popen(
        [sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.5)  # the reaper's first snapshot
    tree = {pid: _cmdline(pid) for pid in descendants(proc.pid)}
    return proc, tree


def test_killing_the_drivers_process_group_kills_every_process_of_its_tree(tmp_path):
    proc, tree = _start(tmp_path, "kill")
    sleeps = [pid for pid, cmd in tree.items() if cmd.startswith("sleep")]
    assert len(sleeps) == 2 and len(tree) >= 4  # reaper, sleep 300, the python child and its sleep 301
    os.killpg(proc.pid, signal.SIGKILL)  # the driver's group: its children in other sessions survive that
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in sleeps) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in sleeps if _alive(p)]


def test_a_driver_that_exits_normally_releases_the_reaper_without_kills(tmp_path):
    proc, tree = _start(tmp_path, "release")
    assert proc.wait(timeout=30) == 0
    reapers = [pid for pid, cmd in tree.items() if "slime_app.reaper" in cmd]
    assert len(reapers) == 1
    assert _wait_dead(reapers[0])  # it left when told "done" (within 10 s: 0.5 s was a race on a loaded machine)


# Like Ray's raylet and its agents: a child that starts a process in its own session, lives a while (the watchdog
# records its tree every second), then dies, which leaves that process running with ppid 1.
ORPHAN = (
    "import subprocess, sys, time; p = subprocess.Popen(['sleep', '302'], start_new_session=True); "
    "print(p.pid, flush=True); time.sleep(2.5)"
)


def _orphan_pid(path: pathlib.Path) -> int:
    deadline = time.monotonic() + 30
    while not path.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    return int(path.read_text())


def _wait_dead(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def test_an_interrupted_ray_start_leaves_no_orphan(tmp_path):
    # A Ctrl-C during ray.init reaches the raylet and the GCS (the terminal's process group) but not Ray's dashboard
    # and runtime-env agents: they were left running with ppid 1 (64 s and counting, measured), since ray.shutdown()
    # had no node to stop and the driver released its watchdog. Here ray.init starts such an orphan, then is
    # interrupted; a process the driver had before the run (a test's, say) is not the run's and is left alone.
    pid_file = tmp_path / "orphan.pid"
    pid_file.write_text("")
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time, ray
        before = subprocess.Popen(["sleep", "303"])
        def init(**kwargs):
            with open({str(pid_file)!r}, "w") as out:
                subprocess.run([sys.executable, "-c", {ORPHAN!r}], stdout=out, check=True)
            raise KeyboardInterrupt
        ray.init = init
        from slime_app.cli import main
        code = main(sys.argv[1:])
        survived = before.poll() is None
        before.kill()
        sys.exit(code if survived else 99)
        """
    )
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "w") as stderr:  # a file, not a pipe: the orphan holds the driver's stderr too
        proc = subprocess.Popen(
            [sys.executable, "-c", script, "--hf-checkpoint", str(MODEL_DIR),
             "--rollout-batch-size", "1", "--num-rollout", "1",
             "--rollout-max-response-len", "8", "--output-dir",
             str(tmp_path / "run"), "--rollout-engine", "reference", "--train-backend", "fsdp",
             "--actor-num-gpus-per-node", "1"],
            stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "RAY_ADDRESS": ""},
        )  # fmt: skip
    try:
        proc.wait(timeout=300)
        err = err_file.read_text()
        orphan = _orphan_pid(pid_file)
        assert proc.returncode == 130, err[-3000:]  # 99: the process the driver had before the run was killed
        assert "slime: interrupted by SIGINT" in err
        assert _wait_dead(orphan), f"orphan {orphan} still runs"  # was alive: the watchdog was told "done"
        assert "slime reaper: killed 1 process(es) the run's start left behind" in err
    finally:
        text = pid_file.read_text().strip()
        if text and _alive(int(text)):
            os.kill(int(text), signal.SIGKILL)
