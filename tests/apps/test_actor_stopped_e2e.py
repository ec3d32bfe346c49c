"""A trainer rank stopped by `SIGSTOP` mid-run, in end-to-end runs of `apps/train` on CPU (Ray, reference engine,
FSDP on gloo, --colocate).

Issue 27 (silent hangs): a stopped process keeps its sockets, so Ray saw the rank alive and the driver's `ray.get`
of its next call waited for ever. Now the run ends with one line naming the rank, its pid and host after
`--actor-stopped-timeout-secs`, and leaves no process behind; a rank continued (`SIGCONT`) before then lets the run
finish. Each run waits on what it prints (the rollout's start, the driver's warning that it saw the stop), never on
a sleep: the machine these run on is a loaded 2-core one.
"""

import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from slime_core.checkpoint_dirs import tracker_step

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"
RANK_LINE = re.compile(r"trainer rank 0: pid (\d+) on ")
OWN_PIDS = re.compile(r"started engine pid (\d+)|\((?:RolloutManager|TrainActor|EngineHost) pid=(\d+)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _argv(model: pathlib.Path, out: pathlib.Path, stopped_timeout_s: float) -> list[str]:
    return [
        sys.executable, str(REPO / "apps" / "train"),
        "--train-backend", "fsdp", "--hf-checkpoint", str(model),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--rm-type", "math", "--advantage-estimator", "grpo",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
        "--rollout-max-response-len", "16", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
        "--colocate", "--num-rollout", "2", "--output-dir", str(out), "--save", str(out / "ckpt"),
        "--actor-stopped-timeout-secs", str(stopped_timeout_s),
    ]  # fmt: skip


class _Run:
    """The driver as a subprocess, its merged output read by a thread; `until(pattern)` waits for a line."""

    def __init__(self, argv: list[str], ray_tmp: str):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO", "RAY_ADDRESS": "",
               "RAY_TMPDIR": ray_tmp, "SLIME_ENGINE_BASE_PORT": str(random.randint(30000, 59000))}  # fmt: skip
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=REPO)  # fmt: skip
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def until(self, pattern: str, timeout: float = 600) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            assert self.proc.poll() is None, f"the run ended before {pattern!r}:\n{self.output[-6000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n{self.output[-6000:]}"
            time.sleep(0.1)

    def wait(self, timeout: float = 300) -> int:
        try:
            status = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout} s (a hang):\n{self.output[-6000:]}")
        self.thread.join(timeout=30)
        return status

    def own_pids(self) -> set[int]:
        """The pids of the run's trainer rank, rollout manager, engine host and engines it printed."""
        return {int(a or b) for a, b in OWN_PIDS.findall(self.output)}

    def close(self, stopped: int | None) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
        if stopped is not None and _state(stopped) == "T":  # never leave a stopped process behind
            os.kill(stopped, signal.SIGKILL)


def _state(pid: int) -> str | None:
    """The process's state letter (proc(5)); None when it is gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rfind(")") + 2]


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


def _processes_under(ray_tmp: str) -> list[str]:
    """Command lines of live processes that name the run's Ray folder (Ray's GCS, raylet, agents and workers)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ray_tmp in cmdline and _alive(int(entry.name)):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def _until_gone(pids: set[int], ray_tmp: str, timeout: float = 60) -> tuple[list[int], list[str]]:
    """Waits for the run's processes to go (the raylet's workers exit once it is gone); what is left after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left, tree = [p for p in pids if _alive(p)], _processes_under(ray_tmp)
        if (not left and not tree) or time.monotonic() > deadline:
            return left, tree
        time.sleep(0.5)


# (which process, the line that gives its pid, what the driver waits on when it is stopped at rollout 1's start)
_STOPPED = {
    # Rollout 0 trained and its weights pushed: the rank sleeps (colocated) until the driver wakes it to train.
    "trainer rank 0": (RANK_LINE.pattern, "the trainer ranks' wake_up call"),
    # Rollout 1 generating: the driver waits on it; the engines (children of its engine hosts) must go with it.
    "the rollout manager": (r"\(RolloutManager pid=(\d+)", "the rollout manager's generation of rollout 1"),
}


@pytest.mark.parametrize("name", list(_STOPPED))
def test_a_stopped_process_ends_the_run_in_one_line_and_leaves_no_process(tiny_qwen3, tmp_path, name):
    pid_line, waited_on = _STOPPED[name]
    ray_tmp = tempfile.mkdtemp(prefix="ray-stopped-")
    out = tmp_path / "run"
    run = _Run(_argv(tiny_qwen3, out, 5), ray_tmp)
    pid = None
    try:
        pid = int(run.until(pid_line).group(1))
        run.until(r"rollout 1: started$")
        os.kill(pid, signal.SIGSTOP)
        status = run.wait()
    finally:
        run.close(pid)
    output = run.output
    assert status == 1, output[-6000:]
    errors = [line for line in output.splitlines() if line.startswith("slime: error:")]
    assert len(errors) == 1, output[-6000:]
    stopped = re.fullmatch(
        rf"slime: error: {name} \(pid {pid} on [\d.]+\) has been stopped for (\d+) s \(SIGSTOP, a debugger or job "
        rf"control\) while the driver waited on {waited_on}; the run ends after --actor-stopped-timeout-secs 5 "
        rf"\(`kill -CONT {pid}` resumes a process stopped by mistake; 0 waits for ever\); resume from the last "
        rf"checkpoint with --load {re.escape(str(out / 'ckpt'))}",
        errors[0],
    )
    assert stopped, errors[0]
    assert 5 <= int(stopped.group(1)) <= 30, errors[0]  # timed from the stop the driver saw, not far past it
    assert "Traceback" not in output, output[-6000:]
    assert re.search(rf"{name} \(pid {pid} on [\d.]+\) is stopped \(process state T\)", output), output[-6000:]
    # No orphan: the stopped process (killed by the teardown), the others, the engines and Ray's own processes.
    pids = run.own_pids()
    assert pid in pids and len(pids) >= 3, pids
    left, tree = _until_gone(pids, ray_tmp)
    assert not left and not tree, (left, tree)


def test_a_trainer_rank_continued_before_the_timeout_lets_the_run_finish(tiny_qwen3, tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="ray-continued-")
    out = tmp_path / "run"
    run = _Run(_argv(tiny_qwen3, out, 120), ray_tmp)
    pid = None
    try:
        pid = int(run.until(RANK_LINE.pattern).group(1))
        run.until(r"rollout 1: started$")
        os.kill(pid, signal.SIGSTOP)
        run.until(rf"trainer rank 0 \(pid {pid} on [\d.]+\) is stopped")  # the driver waits on it, and saw the stop
        os.kill(pid, signal.SIGCONT)
        status = run.wait()
    finally:
        run.close(pid)
    output = run.output
    assert status == 0, output[-6000:]
    assert re.search(rf"trainer rank 0 \(pid {pid} on [\d.]+\) resumed after \d+ s stopped", output), output[-6000:]
    assert "slime: error" not in output
    assert tracker_step(out / "ckpt") == 2  # the checkpoint after the last rollout (1) was committed
