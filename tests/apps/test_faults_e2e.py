"""Engine faults in end-to-end runs of `apps/train` on CPU (Ray, reference engines, FSDP on gloo, --colocate).

A test watches the run's output; once rollout 0 is done it waits until an engine has requests running, then
kills it (`kill -9`) or freezes it (`SIGSTOP`). With `--use-fault-tolerance` the run must finish every rollout
with exactly rollout_batch_size × n_samples_per_prompt samples, report the restart and the re-queued requests,
and the restarted engine must serve the weights of the current version.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"
ENGINE_LINE = re.compile(r"started engine pid (\d+) at (http://[\d.]+:\d+)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _argv(model: pathlib.Path, out: pathlib.Path, rollouts: int, response_len: int, *extra: str) -> list[str]:
    return [
        sys.executable, str(REPO / "apps" / "train"),
        "--train-backend", "fsdp", "--hf-checkpoint", str(model),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--rm-type", "math", "--advantage-estimator", "grpo",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "8",
        "--rollout-max-response-len", str(response_len), "--rollout-temperature", "1.0",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate", "--lr", "1e-4",
        "--num-rollout", str(rollouts), "--output-dir", str(out),
        "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt"),
        # A 30 s health-check timeout: a live engine slowed by a loaded 2-core machine must not be taken for a hung
        # one (with 3 s a CI run restarted the live engine at the end of rollout 0; see `_run_with_fault`). A dead
        # engine needs none (its connections are refused); a stopped one is found hung 30 s after its last answer.
        "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "30",
        "--rollout-engine-recovery-timeout", "300",
        *extra,
    ]  # fmt: skip


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # engines are local: never via a proxy


def _running(url: str) -> int:
    with _DIRECT.open(url + "/v1/loads", timeout=2) as r:
        return sum(x["num_running_reqs"] for x in json.loads(r.read())["loads"])


def _run_with_fault(argv: list[str], sig: signal.Signals) -> tuple[subprocess.CompletedProcess, dict]:
    """Runs the trainer; once rollout 1 has started, sends `sig` to engine 0 while it has requests running.

    Not before rollout 1 has started: the health monitor runs only while a rollout generates, and an engine's own
    `/health_generate` (of its start-up, or of a check that straddled the end of rollout 0) is a running request
    too. A CI run sent SIGSTOP to an engine that was starting up again (the monitor had taken the live engine,
    slowed by the load, for hung at the end of rollout 0): its launcher then waited out its 600 s start-up
    timeout. An engine restarted before the fault now fails the test at once, with the run's output.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    lines: list[str] = []
    engines: dict[str, list[int]] = {}  # url -> the pids started there, in order
    fault: dict = {}

    def reader():
        for line in proc.stdout:
            lines.append(line)
            if m := ENGINE_LINE.search(line):
                engines.setdefault(m.group(2), []).append(int(m.group(1)))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        # Rollout 0 is done, and training, the weight push and the phase of rollout 1 have begun (the progress line
        # "rollout 1: started"); its generation follows.
        deadline = time.monotonic() + 600
        while not any(line.rstrip().endswith("rollout 1: started") for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines[-80:])
            time.sleep(0.2)
        url = sorted(engines)[0]
        while time.monotonic() < deadline and not fault:
            if len(engines[url]) > 1:
                pytest.fail(f"engine {url} was restarted before the fault (taken for hung?):\n" + "".join(lines[-80:]))
            try:
                if _running(url) > 0:
                    os.kill(engines[url][0], sig)
                    fault = {"url": url, "pid": engines[url][0], "at": time.monotonic()}
            except OSError:
                pass
            time.sleep(0.02)
        assert fault, f"engine {url} never had requests running after rollout 0:\n" + "".join(lines[-40:])
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:  # say where the run stood, not only that it did not end
            pytest.fail(f"the run did not end within 600 s of the fault {fault}:\n" + "".join(lines[-120:]))
    finally:
        if proc.poll() is None:
            proc.kill()
        if sig is signal.SIGSTOP and fault:
            try:  # never leave a stopped process behind
                os.kill(fault["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        thread.join(timeout=10)
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(lines), ""), fault


def _check(
    out: pathlib.Path, result: subprocess.CompletedProcess, fault: dict, tb_scalars, *, rollouts: int, sole_engine: bool
) -> None:
    assert result.returncode == 0, result.stdout[-6000:]
    for rollout_id in range(rollouts):
        samples = torch.load(out / "dumps" / f"rollout_{rollout_id}.pt", weights_only=False)["samples"]
        assert len(samples) == 8, (rollout_id, len(samples))  # 4 prompts × 2, none lost, none twice
        assert len({s["index"] for s in samples}) == 8
        # Every sample was generated by an engine holding the weights pushed before this rollout.
        assert {tuple(s["weight_versions"]) for s in samples} == {(str(rollout_id),)}, rollout_id
    tb = out / "tensorboard"
    restarts = tb_scalars(tb, "rollout/fault/engine_restarts")
    requeued = tb_scalars(tb, "rollout/fault/requeued_requests")
    assert sum(restarts.values()) == 1 and sum(requeued.values()) >= 1, (restarts, requeued)
    if sole_engine:
        # Nothing else can finish the rollout: the restarted engine gets the served weights pushed before it serves.
        # (With two engines the other may finish the rollout first; the next regular push then covers it.)
        assert "restored weights v" in result.stdout
    assert re.search(rf"engine \d+ restarted at {re.escape(fault['url'])}", result.stdout), "not on the same port"


def test_kill_9_of_an_engine_mid_rollout_loses_no_sample(tiny_qwen3, tmp_path, tb_scalars):
    out = tmp_path / "run"
    # The only engine: its requests wait for the restart (failover to another engine is in test_engine_health.py).
    argv = _argv(tiny_qwen3, out, 2, 48)
    result, fault = _run_with_fault(argv, signal.SIGKILL)
    _check(out, result, fault, tb_scalars, rollouts=2, sole_engine=True)
    # Found dead, by its host ("process exited") or by the refused/reset /health_generate connection ("process
    # gone", also when the host's alive call timed out on a loaded machine), never taken for a hung engine.
    reasons = re.findall(r"engine \d+ recovered in [\d.]+s \((.*)\)", result.stdout)
    assert reasons and not any("hung" in r for r in reasons), reasons


def test_sigstop_of_the_only_engine_mid_rollout_is_found_hung_and_restarted(tiny_qwen3, tmp_path, tb_scalars):
    out = tmp_path / "run"
    result, fault = _run_with_fault(_argv(tiny_qwen3, out, 2, 48), signal.SIGSTOP)
    _check(out, result, fault, tb_scalars, rollouts=2, sole_engine=True)
    assert "(hung)" in result.stdout
