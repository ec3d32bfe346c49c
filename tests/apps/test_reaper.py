"""The run's processes die with the driver (`slime_app.reaper`), also when its whole process group is killed."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from slime_app.reaper import descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
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
        a.kill(); b.kill()
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
    time.sleep(0.5)
    assert not _alive(reapers[0])  # it left when told "done"
