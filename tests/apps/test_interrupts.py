"""SIGTERM and SIGINT end the driver cleanly (issue 27 follow-up; `slime_app.interrupts`).

A SIGTERM to `uv run apps/train` printed Ray's C++ stack ("*** SIGTERM received ***", `logging.cc`) and exited 15
or 134. Now: one line naming the signal, the run torn down (engines, actors, Ray, the TensorBoard writer flushed),
exit status 128 + the signal's number. The first tests drive the handler in a small program (no Ray); the slow ones
run the real demo under Ray and signal it while a generation of its third rollout is in flight (one run per signal).
"""

import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# A driver in miniature: the handler installed, a "run" that waits until interrupted, then a "teardown" that waits
# for the test's go (stdin) so that signals can be sent while it runs.
PROGRAM = r"""
import sys, time
from slime_app import interrupts
interrupts.install()
try:
    print("running", flush=True)
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print(interrupts.interrupted_line(), flush=True)
    print("tearing down", flush=True)
    sys.stdin.readline()  # a signal sent before the go interrupts this read: its handler has run by the next line
    print(f"teardown done after {len(interrupts._received)} signal(s)", flush=True)
    sys.exit(interrupts.exit_status())
"""


def _start(program: str = PROGRAM) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO,
    )  # fmt: skip
    assert proc.stdout.readline() == "running\n"
    return proc


def _wait_for(proc: subprocess.Popen, line: str) -> None:
    got = proc.stdout.readline()
    assert got == line, f"expected {line!r}, got {got!r}; stderr: {proc.stderr.read()}"


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_interrupts_the_run_and_the_teardown_runs(sig, status):
    proc = _start()
    proc.send_signal(sig)
    _wait_for(proc, f"slime: interrupted by {sig.name}, shutting down\n")
    _wait_for(proc, "tearing down\n")
    out, err = proc.communicate("go\n", timeout=60)
    assert (proc.returncode, out, err) == (status, "teardown done after 1 signal(s)\n", "")


def test_the_copy_uv_forwards_is_ignored_and_another_signal_exits_at_once():
    proc = _start()
    proc.send_signal(signal.SIGINT)
    _wait_for(proc, "slime: interrupted by SIGINT, shutting down\n")
    _wait_for(proc, "tearing down\n")
    proc.send_signal(signal.SIGINT)  # what `uv run` forwards of one Ctrl-C: the teardown goes on
    proc.send_signal(signal.SIGTERM)  # a second request: out at once, with the first signal's status
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out == ""
    assert err == "slime: SIGTERM during the shutdown: exiting at once (the reaper stops what is left)\n"


def test_the_ignored_copy_leaves_the_teardown_to_finish():
    proc = _start()
    proc.send_signal(signal.SIGTERM)
    _wait_for(proc, "slime: interrupted by SIGTERM, shutting down\n")
    _wait_for(proc, "tearing down\n")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate("go\n", timeout=60)
    assert (proc.returncode, out, err) == (143, "teardown done after 2 signal(s)\n", "")


def test_reclaim_takes_the_signals_back_only_after_install():
    program = r"""
import signal
from slime_app import interrupts
def other(signum, frame):
    pass
signal.signal(signal.SIGTERM, other)
interrupts.reclaim()  # not installed: a library caller of init_ray keeps its handlers
print(signal.getsignal(signal.SIGTERM) is other)
interrupts.install()
signal.signal(signal.SIGTERM, other)  # what ray.init does
interrupts.reclaim()
print([signal.getsignal(s) is interrupts._handler for s in (signal.SIGTERM, signal.SIGINT)])
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout == "True\n[True, True]\n"


# ---- the real driver under Ray --------------------------------------------------------------------------------------

RAY_STACK = re.compile(r"SIGTERM received|logging\.cc|core dumped|Traceback|\(unknown\)")

# The demo's rollouts 0 and 1 as usual (the data source numbers samples across rollouts: 0..127 at 8 prompts x 8
# samples); rollout 2's generations never end: a long response, a slow environment.
SLOW_FROM_ROLLOUT_2 = """
import asyncio

from slime.rollout.sglang_rollout import generate as default_generate

SLOW_FROM = {slow_from}


async def generate(args, sample, sampling_params):
    if sample.index < SLOW_FROM:
        return await default_generate(args, sample, sampling_params)
    if sample.index == SLOW_FROM:
        print("slow generation in flight", flush=True)  # reaches the driver's output (log_to_driver)
    await asyncio.sleep(3600)
    return sample
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_demo_driver_stops_cleanly_on_a_signal_during_a_long_generation(tmp_path, tb_scalars, sig):
    """The demo under Ray, signalled in its third rollout while a generation that never ends is in flight.

    One run per signal checks what two runs checked before (the second ran `--debug-rollout-only` with every
    generation slow; the trainer changes nothing in how the driver stops the rollout side):
    - the driver exits with 128 + the signal's number, says so in one line, prints no Ray stack, stops the engines
      with the run (not left to the reaper), and the metrics of the finished rollouts reach TensorBoard.
    - issue 27: the rollout manager's `dispose` queued behind the generation in flight (one thread per actor), so a
      signal mid-rollout waited out the driver's 60 s limit on it, logged "rollout manager did not shut down
      cleanly" with a GetTimeoutError traceback, and left the engines to die with Ray. Now `dispose` runs beside the
      generation and stops the engines at once.
    """
    from slime_app.demo import DEMO_HPARAMS, default_demo_argv

    # 8 of the demo's 64 prompts per rollout (one optimizer step of 64 samples, as the demo's of 512): what is checked
    # is how the driver stops, not what the rollouts learn, and two 512-sample rollouts trained before the signal
    # were most of the run's CPU.
    prompts = 8
    per_rollout = prompts * int(DEMO_HPARAMS["n-samples-per-prompt"])
    (tmp_path / "slow_generate.py").write_text(SLOW_FROM_ROLLOUT_2.format(slow_from=2 * per_rollout))
    # No evaluation before rollout 0 (the demo's 128 prompts x 8 samples): the signal comes in rollout 2 either way.
    argv = [sys.executable, str(REPO / "apps" / "train"), *default_demo_argv(tmp_path / "run"), "--num-rollout", "50",
            "--rollout-batch-size", str(prompts), "--global-batch-size", str(per_rollout), "--micro-batch-size",
            str(per_rollout), "--skip-eval-before-train",
            "--custom-generate-function-path", "slow_generate.generate"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO", "PYTHONPATH": str(tmp_path),
           "RAY_ADDRESS": ""}  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "slow generation in flight" in line:  # rollouts 0 and 1 trained, engines and trainer up
                break
        else:
            pytest.fail("the demo ended before its third rollout's generation:\n" + "".join(lines[-30:]))
        assert "rollout 2: started" in "".join(lines)
        proc.send_signal(sig)
        rest = proc.stdout.read()
        status = proc.wait(timeout=240)
    finally:
        proc.kill()
    output = "".join(lines) + rest
    assert status == 128 + sig, rest[-3000:]
    assert rest.count(f"slime: interrupted by {sig.name}, shutting down\n") == 1
    assert not RAY_STACK.search(rest), rest[-3000:]
    assert "did not shut down cleanly" not in rest, rest[-3000:]
    # The engines were stopped with the run (not left to the reaper: the driver exited normally).
    engine_pids = [int(p) for p in re.findall(r"started engine pid (\d+)", output)]
    assert engine_pids and not any(os.path.exists(f"/proc/{pid}") for pid in engine_pids)
    # The metrics of the finished rollouts reached TensorBoard (the writer was flushed and closed).
    assert set(tb_scalars(tmp_path / "run" / "tensorboard", "rollout/raw_reward")) >= {0, 1}


def test_main_puts_the_handlers_back_for_a_program_that_calls_it():
    from slime_app.cli import main

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    assert main(["--no-such-flag"]) == 2  # in this process: pytest's own Ctrl-C handling must survive it
    assert {sig: signal.getsignal(sig) for sig in before} == before
