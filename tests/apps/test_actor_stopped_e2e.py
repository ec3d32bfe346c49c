"""A trainer rank or the rollout manager stopped by `SIGSTOP` mid-run, in end-to-end runs of `apps/train` on CPU
(Ray, reference engine, FSDP on gloo, --colocate).

Issue 27 (silent hangs): a stopped process keeps its sockets, so Ray saw it alive and the driver's `ray.get` of its
next call waited for ever (the original code, rank stopped at rollout 1's start: "train 1: still running after 180 s"
and no end). Now the run ends with one line naming the process, its pid and host after
`--actor-stopped-timeout-secs`, exit 1, and leaves no process behind; a rank continued (`SIGCONT`) before then lets
the run finish. One run checks both (a trainer rank continued in time, then the rollout manager stopped for good);
it waits on what it prints (the rollout's start, the driver's warning that it saw the stop), never on a sleep: the
machine it runs on is a loaded 2-core one.
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

from slime_app.actor_watch import read_proc_state
from slime_app.reaper import descendants
from slime_core.checkpoint_dirs import tracker_step

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"
RANK_LINE = re.compile(r"trainer rank 0: pid (\d+) on ")
OWN_PIDS = re.compile(r"started engine pid (\d+)|\((?:RolloutManager|TrainActor|EngineHost) pid=(\d+)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _argv(model: pathlib.Path, out: pathlib.Path, stopped_timeout_s: float, num_rollout: int = 2) -> list[str]:
    return [
        sys.executable, str(REPO / "apps" / "train"),
        "--train-backend", "fsdp", "--hf-checkpoint", str(model),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--rm-type", "math", "--advantage-estimator", "grpo",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
        "--rollout-max-response-len", "16", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
        "--colocate", "--num-rollout", str(num_rollout), "--output-dir", str(out), "--save", str(out / "ckpt"),
        "--save-interval", "1",
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
        self.tree: dict[int, int] = {}  # pid -> start time of every process seen under the driver (`wait`)
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
        """Waits for the driver to exit, recording every process under it meanwhile (`tree`)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            self.tree.update(descendants(self.proc.pid))  # Ray's processes, the actors, engines, reward workers
            if time.monotonic() > deadline:
                pytest.fail(f"the run did not end within {timeout} s (a hang):\n{self.output[-6000:]}")
            time.sleep(0.5)
        self.thread.join(timeout=30)
        return self.proc.returncode

    def own_pids(self) -> set[int]:
        """The pids of the run's trainer rank, rollout manager, engine host and engines it printed."""
        return {int(a or b) for a, b in OWN_PIDS.findall(self.output)}

    def close(self, stopped: int | None) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)
        state = read_proc_state(stopped) if stopped is not None else None
        if state is not None and state.stopped:  # never leave a stopped process behind
            os.kill(stopped, signal.SIGKILL)


def _left_behind(tree: dict[int, int], timeout: float = 60) -> list[str]:
    """The processes of `tree` (pid -> start time) still running after `timeout` (a process that reused a pid is not).

    Ray's workers exit on their own once the raylet is gone, and a reward worker once its parent is: give them time.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for pid, start in tree.items():
            state = read_proc_state(pid)
            if state is not None and state.start_ticks == start and state.state != "Z":
                cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160]
                left.append(f"{pid} ({state.state}): {cmdline.decode(errors='replace')}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _check_error_line(output: str, name: str, pid: int, waited_on: str, timeout_s: int, out: pathlib.Path) -> None:
    errors = [line for line in output.splitlines() if line.startswith("slime: error:")]
    assert len(errors) == 1, output[-6000:]
    stopped = re.fullmatch(
        rf"slime: error: {name} \(pid {pid} on [\d.]+\) has been stopped for (\d+) s \(SIGSTOP, a debugger or job "
        rf"control\) while the driver waited on {waited_on}; the run ends after --actor-stopped-timeout-secs "
        rf"{timeout_s} \(`kill -CONT {pid}` resumes a process stopped by mistake; 0 waits for ever\); resume from the "
        rf"last checkpoint with --load {re.escape(str(out / 'ckpt'))}",
        errors[0],
    )
    assert stopped, errors[0]
    # timed from the stop the driver saw, not far past it
    assert timeout_s <= int(stopped.group(1)) <= timeout_s + 25, errors[0]
    assert "Traceback" not in output, output[-6000:]
    assert re.search(rf"{name} \(pid {pid} on [\d.]+\) is stopped \(process state T\)", output), output[-6000:]


def test_a_trainer_rank_continued_in_time_goes_on_and_a_stopped_rollout_manager_ends_the_run(tiny_qwen3, tmp_path):
    """One run for what two runs checked (each run costs about a minute of CPU in CI), which keeps both names:

    - `test_a_trainer_rank_continued_in_time_goes_on_and_stopped_for_good_ends_the_run`: the trainer rank, stopped
      at rollout 1's start and continued once the driver saw it, lets the run go on (rollout 1 trains and saves).
      Rollout 0 trained and its weights pushed: the rank sleeps (colocated) until the driver wakes it to train, so
      the driver waits on its wake_up call. (Its second stop, for good, ended the run with the same line as below
      naming the trainer rank; that line's wording for a trainer rank is test_actor_watch.py's.)
    - `test_a_stopped_rollout_manager_ends_the_run_in_one_line_and_leaves_no_process`: the rollout manager, stopped
      while rollout 2 generates (that test stopped it in rollout 1), ends the run after the timeout in one line,
      exit 1, and no process of the run is left (the stopped one killed by the teardown, the other actors, the
      engines, Ray's own processes).
    """
    ray_tmp = tempfile.mkdtemp(prefix="ray-stopped-")
    out = tmp_path / "run"
    run = _Run(_argv(tiny_qwen3, out, 20, num_rollout=3), ray_tmp)
    rank = manager = None
    try:
        manager = int(run.until(r"\(RolloutManager pid=(\d+)").group(1))
        rank = int(run.until(RANK_LINE.pattern).group(1))
        run.until(r"rollout 1: started$")
        os.kill(rank, signal.SIGSTOP)
        run.until(rf"trainer rank 0 \(pid {rank} on [\d.]+\) is stopped")  # the driver waits on it, and saw the stop
        os.kill(rank, signal.SIGCONT)
        run.until(rf"trainer rank 0 \(pid {rank} on [\d.]+\) resumed after \d+ s stopped")
        run.until(r"rollout 2: started$")
        assert tracker_step(out / "ckpt") == 2  # rollout 1 trained after the SIGCONT, and its checkpoint committed
        os.kill(manager, signal.SIGSTOP)  # rollout 2 generating
        status = run.wait()
    finally:
        run.close(manager)
        if rank is not None and (state := read_proc_state(rank)) is not None and state.stopped:
            os.kill(rank, signal.SIGKILL)  # never leave a stopped process behind
    output = run.output
    assert status == 1, output[-6000:]
    _check_error_line(output, "the rollout manager", manager, "the rollout manager's generation of rollout 2", 20, out)
    assert {rank, manager} <= set(run.tree) and run.own_pids() <= set(run.tree), (rank, manager, run.tree)
    assert not _left_behind(run.tree), _left_behind(run.tree)
