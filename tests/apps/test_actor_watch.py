"""`slime_app.actor_watch`: a wait on a Ray actor ends when its process stays stopped; /proc state parsing.

Real processes throughout: a `sleep` child for the /proc reads, a real Ray actor (local node) for the waits.
"""

import logging
import os
import pathlib
import signal
import subprocess
import sys
import time
import types

import pytest
import ray
from ray.exceptions import GetTimeoutError

from slime_app import actor_watch
from slime_app.actor_watch import ActorStopped, ActorWatch, ProcState, Watched, parse_proc_stat, wait_watched

# A /proc/<pid>/stat line as Linux writes it (proc(5)): 52 fields; field 22 (start time) is 987654.
_TAIL = "1 4242 4242 0 -1 4194560 1200 0 0 0 3 1 0 0 20 0 1 0 987654 12345678 900 18446744073709551615"
_TAIL += " 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0"


@pytest.mark.parametrize(
    ("comm", "state"),
    [
        ("ray::TrainActor", "S"),
        ("python3", "T"),
        ("a b c", "t"),  # spaces
        ("x) (y z", "T"),  # a ")" followed by what looks like the next fields
        ("((", "R"),
        (") T 1 2 (", "S"),  # a name that ends like a stopped line: the last ")" is the one that counts
    ],
)
def test_the_state_and_start_time_are_read_after_the_last_parenthesis(comm, state):
    parsed = parse_proc_stat(f"4242 ({comm}) {state} {_TAIL}\n")
    assert parsed == ProcState(state=state, start_ticks=987654)
    assert parsed.stopped is (state in "Tt")


@pytest.mark.parametrize("text", ["", "4242 (python3) S 1 2 3", "4242 python3 S " + _TAIL, "4242 (p) S " + " x" * 49])
def test_a_line_not_in_procs_format_is_refused(text):
    with pytest.raises(ValueError, match="not a /proc/<pid>/stat line"):
        parse_proc_stat(text)


def test_a_stopped_process_with_spaces_and_parentheses_in_its_name_reads_as_stopped(tmp_path):
    # The kernel's command name is the executable's file name (up to 15 bytes): "x) (y z" here.
    link = tmp_path / "x) (y z"
    link.symlink_to("/bin/sleep")
    child = subprocess.Popen([str(link), "60"])
    try:
        _until(lambda: pathlib.Path(f"/proc/{child.pid}/comm").read_text() == "x) (y z\n")  # once it has exec'd
        first = actor_watch.read_proc_state(child.pid)
        assert first is not None and first.state in "RS" and not first.stopped
        os.kill(child.pid, signal.SIGSTOP)
        _until(lambda: actor_watch.read_proc_state(child.pid).state == "T")
        assert actor_watch.read_proc_state(child.pid) == ProcState(state="T", start_ticks=first.start_ticks)
        os.kill(child.pid, signal.SIGCONT)
        _until(lambda: not actor_watch.read_proc_state(child.pid).stopped)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert actor_watch.read_proc_state(child.pid) is None  # reaped: gone


def _until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# ---- waits on a real Ray actor ---------------------------------------------------------------------------------------


class Worker:
    def pid(self) -> int:
        return os.getpid()

    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"


@pytest.fixture(scope="module")
def local_ray():
    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "RAY_ADDRESS")}
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"  # workers run in this venv (as `slime_app.cluster` sets)
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        yield
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def worker(local_ray):
    actor = ray.remote(num_cpus=0)(Worker).remote()
    pid = ray.get(actor.pid.remote(), timeout=120)
    yield actor, pid
    try:
        os.kill(pid, signal.SIGKILL)  # never leave a stopped process behind
    except ProcessLookupError:
        pass
    ray.kill(actor)


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    _until(lambda: actor_watch.read_proc_state(pid).stopped)


def test_a_stopped_actor_ends_the_wait_with_one_line_naming_it(worker):
    actor, pid = worker
    watched = Watched("trainer rank 1", actor)
    ref = actor.slow.remote(2.0)
    _stop(pid)
    begun = time.monotonic()
    with pytest.raises(ActorStopped) as raised:
        wait_watched(ref, [watched], what="its train call", stopped_timeout_s=2.0,
                     resume_hint="resume from the last checkpoint with --load /ckpt")  # fmt: skip
    waited = time.monotonic() - begun
    # Not before the timeout; within a few slices after it (a loaded machine reads the state late, never early).
    assert 2.0 <= waited < 2.0 + 10 * actor_watch.SLICE_S, waited
    host = ray.util.get_node_ip_address()
    assert watched.pid == pid and watched.host == host and watched.local
    assert str(raised.value) == (
        f"trainer rank 1 (pid {pid} on {host}) has been stopped for 2 s (SIGSTOP, a debugger or job control) while the "
        f"driver waited on its train call; the run ends after --actor-stopped-timeout-secs 2 (`kill -CONT {pid}` "
        "resumes a process stopped by mistake; 0 waits for ever); resume from the last checkpoint with --load /ckpt"
    )
    # The teardown's kill: a stopped process ignores everything else.
    assert actor_watch.kill_stopped([watched]) == [watched]
    _until(lambda: actor_watch.read_proc_state(pid) is None or actor_watch.read_proc_state(pid).state == "Z")


def test_a_process_continued_before_the_timeout_lets_the_wait_finish(worker, caplog):
    actor, pid = worker
    watched = Watched("the rollout manager", actor)
    ref = actor.slow.remote(1.0)
    _stop(pid)
    resumed = []

    def resume_once_seen_stopped():  # an observable event: the driver's warning, not a sleep
        if watched.stopped_since is not None and not resumed:
            os.kill(pid, signal.SIGCONT)
            resumed.append(time.monotonic())

    with caplog.at_level(logging.WARNING, logger="slime_app.actor_watch"):
        value = wait_watched(ref, [watched], what="x", stopped_timeout_s=60.0, every_slice=resume_once_seen_stopped)
    assert value == "done" and resumed
    messages = [r.getMessage() for r in caplog.records if r.name == "slime_app.actor_watch"]
    assert messages[0] == f"the rollout manager (pid {pid} on {watched.host}) is stopped (process state T); the " \
        "driver waits for it"  # fmt: skip
    assert any(m.startswith(f"the rollout manager (pid {pid} on {watched.host}) resumed after ") for m in messages)
    assert watched.stopped_since is None
    assert actor_watch.kill_stopped([watched]) == []  # running: left alone


def test_a_stop_is_timed_across_waits(worker):
    # Several short waits (the loop's control calls) while it stays stopped: timed from when it was first seen.
    actor, pid = worker
    watched = Watched("trainer rank 0", actor)
    _stop(pid)
    ref = actor.slow.remote(0.0)
    with pytest.raises(GetTimeoutError):
        wait_watched(ref, [watched], what="x", stopped_timeout_s=30.0, timeout=2.5)
    since = watched.stopped_since
    assert since is not None
    with pytest.raises(ActorStopped, match=r"has been stopped for \d+ s"):
        wait_watched(ref, [watched], what="y", stopped_timeout_s=time.monotonic() - since + 1.5)
    assert watched.stopped_since == since


def test_zero_never_ends_the_wait_and_a_running_actor_is_never_taken_for_stopped(worker):
    actor, pid = worker
    assert wait_watched(actor.slow.remote(2.5), [Watched("w", actor)], what="x", stopped_timeout_s=0.5) == "done"
    _stop(pid)
    with pytest.raises(GetTimeoutError):  # 0: only the wait's own timeout ends it
        wait_watched(actor.slow.remote(0.0), [Watched("w", actor)], what="x", stopped_timeout_s=0, timeout=3)


def test_a_bare_pid_and_a_list_of_refs(worker):
    actor, pid = worker
    refs = [actor.slow.remote(0.1), actor.slow.remote(0.1)]
    assert wait_watched(refs, [pid], what="x", stopped_timeout_s=5) == ["done", "done"]
    _stop(pid)
    with pytest.raises(ActorStopped, match=rf"^process {pid} \(pid {pid} on this host\) has been stopped"):
        wait_watched(actor.slow.remote(0.0), [pid], what="x", stopped_timeout_s=1.0)


def test_on_another_node_the_state_is_read_by_a_task_pinned_there(worker):
    # One node here: the watched actor is taken for a remote one, so its state comes from the pinned task.
    actor, pid = worker
    watched = Watched("trainer rank 3", actor)
    assert watched.resolve()
    watched.local = False
    _stop(pid)
    with pytest.raises(ActorStopped, match=rf"^trainer rank 3 \(pid {pid} on [\d.]+\) has been stopped"):
        wait_watched(actor.slow.remote(0.0), [watched], what="x", stopped_timeout_s=1.0, timeout=120)


def test_a_failed_call_raises_at_once_while_another_still_runs(worker):
    actor, _ = worker

    def fail():
        raise ValueError("rank 1 broke")

    failing = ray.remote(num_cpus=0)(fail).remote()
    begun = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 broke"):
        wait_watched([actor.slow.remote(30.0), failing], [Watched("w", actor)], what="x", stopped_timeout_s=5)
    assert time.monotonic() - begun < 20


def test_a_negative_timeout_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--actor-stopped-timeout-secs -1"):
        ActorWatch(-1)


# ---- how the run reports it ------------------------------------------------------------------------------------------

STOPPED_LINE = (
    "trainer rank 0 (pid 4242 on 10.0.0.7) has been stopped for 120 s (SIGSTOP, a debugger or job control) while the "
    "driver waited on the trainer ranks' save call; the run ends after --actor-stopped-timeout-secs 120"
)


def test_a_stop_during_a_save_is_not_reported_as_a_failed_save():
    # The save wrapper turns any error into SaveFailed ("saving ... to --save failed", exit 5, the disk's free space):
    # a rank stopped during the save keeps its own line.
    from slime_app import loop

    run = loop.Run.__new__(loop.Run)
    run.cfg = types.SimpleNamespace(save="/ckpt")
    with pytest.raises(ActorStopped, match="^trainer rank 0"):
        with run._save_errors(3, "save"):
            raise ActorStopped(STOPPED_LINE)


def test_the_cli_ends_with_the_line_and_exit_1(tmp_path):
    from slime_app.demo import MODEL_DIR

    script = (
        "import sys\nfrom slime_app import loop\nfrom slime_app.actor_watch import ActorStopped\n"
        "class Run:\n    def __init__(self, cfg):\n        self.tracker = None\n"
        f"    def run(self):\n        raise ActorStopped({STOPPED_LINE!r})\n"
        "    def close(self):\n        pass\n"
        "loop.Run = Run\nfrom slime_app.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "--hf-checkpoint", str(MODEL_DIR), "--rollout-batch-size", "2",
         "--n-samples-per-prompt", "2", "--num-rollout", "1", "--rollout-max-response-len", "8", "--output-dir",
         str(tmp_path), "--rollout-engine", "reference", "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-3000:]
    assert [line for line in out.stderr.splitlines() if line.startswith("slime:")] == [f"slime: error: {STOPPED_LINE}"]
    assert "Traceback" not in out.stderr
