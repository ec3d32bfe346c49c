"""The local Ray node's start-up: one retry on Ray's start-up timeout, then one line naming the cause and the knobs."""

import os
import subprocess
import sys
import textwrap

import pytest

from slime_app.demo import MODEL_DIR
from slime_app.ray_start import RayStartupError, start_local_ray, wait_for_load

# What Ray 2.60's node.py raises when the node does not register within its 30 s.
RAY_TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the raylet failed to startup "
    "or the GCS has become overloaded."
)


class FakeRay:
    """`ray.init`/`ray.shutdown` that fail with the given errors in turn (None: the attempt succeeds)."""

    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)
        self.calls: list[dict] = []
        self.shutdowns = 0

    def init(self, **kwargs):
        self.calls.append(kwargs)
        outcome = self.outcomes.pop(0)
        if outcome is not None:
            raise outcome

    def shutdown(self):
        self.shutdowns += 1


class FakeLoad:
    """A load average that falls by `step` on each read; `sleep` advances a fake clock."""

    def __init__(self, start: float, step: float, cores: int = 2):
        self.value, self.step, self.cores = start, step, cores
        self.slept = 0.0

    def clock(self):
        return self.slept

    def __call__(self):
        value = self.value
        self.value = max(0.0, self.value - self.step)
        return value, self.cores

    def sleep(self, seconds):
        self.slept += seconds


def test_first_attempt_succeeds_without_retry():
    ray = FakeRay(None)
    start_local_ray(ray.init, ray.shutdown, {"num_cpus": 8}, retry_wait_s=60, load=FakeLoad(9.0, 1.0))
    assert ray.calls == [{"num_cpus": 8}] and ray.shutdowns == 0


def test_timeout_is_retried_once_after_the_load_falls(caplog):
    ray = FakeRay(RAY_TIMEOUT, None)
    load = FakeLoad(6.0, 1.0)  # reads 6 (logged), then 5, 4, 3, 2: the wait ends at 2 <= 2 cores
    with caplog.at_level("WARNING"):
        start_local_ray(
            ray.init, ray.shutdown, {"num_cpus": 8}, retry_wait_s=60, load=load, sleep=load.sleep, clock=load.clock
        )
    assert len(ray.calls) == 2 and ray.calls[0] == ray.calls[1]
    assert ray.shutdowns == 1  # the failed attempt is cleared before the retry
    assert load.slept == pytest.approx(3 * 2.0)  # three polls of 2 s
    (record,) = [r for r in caplog.records if r.name == "slime_app.ray_start"]
    assert "load average 6.0 on 2 core(s)" in record.getMessage() and "--ray-startup-retry-wait" in record.getMessage()


def test_second_timeout_ends_in_one_line_naming_the_knobs():
    ray = FakeRay(RAY_TIMEOUT, RAY_TIMEOUT)
    load = FakeLoad(8.0, 0.0)  # never falls: the retry waits the whole --ray-startup-retry-wait
    with pytest.raises(RayStartupError) as info:
        start_local_ray(ray.init, ray.shutdown, {}, retry_wait_s=5, load=load, sleep=load.sleep, clock=load.clock)
    message = str(info.value)
    assert "\n" not in message
    assert "load average 8.0, then 8.0, on 2 core(s)" in message
    for knob in ("--ray-startup-retry-wait", "--ray-address", "RAY_agent_register_timeout_ms", "ray start --head"):
        assert knob in message
    assert len(ray.calls) == 2 and ray.shutdowns == 2
    assert load.slept == pytest.approx(5.0)
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained 30-line traceback


def test_other_errors_are_not_retried():
    ray = FakeRay(ValueError("num_cpus must be >= 0"))
    with pytest.raises(ValueError, match="num_cpus"):
        start_local_ray(ray.init, ray.shutdown, {}, retry_wait_s=60, load=FakeLoad(9.0, 1.0))
    assert len(ray.calls) == 1 and ray.shutdowns == 0


def test_wait_for_load_stops_at_the_deadline():
    now = [0.0]
    load = FakeLoad(50.0, 0.0, cores=4)

    def sleep(seconds):
        now[0] += seconds

    assert wait_for_load(7.0, load=load, sleep=sleep, clock=lambda: now[0]) == 50.0
    assert now[0] == pytest.approx(7.0)  # 2 + 2 + 2 + 1: never past the deadline


def test_cli_prints_one_line_and_exits_4_when_ray_does_not_start(tmp_path):
    # The real CLI with ray.init failing as Ray's does: one `slime: error:` line on stderr, no traceback.
    script = textwrap.dedent(
        f"""
        import sys, ray
        def fail(**kwargs):
            raise Exception({str(RAY_TIMEOUT)!r})
        ray.init = fail
        from slime_app.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "--hf-checkpoint", str(MODEL_DIR),
         "--rollout-batch-size", "1", "--num-rollout", "1",
         "--rollout-max-response-len", "8", "--ray-startup-retry-wait",
         "0", "--output-dir", str(tmp_path), "--rollout-engine", "reference", "--train-backend", "fsdp",
         "--actor-num-gpus-per-node", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    assert out.returncode == 4, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("slime: error:")]
    assert len(errors) == 1 and "--ray-address" in errors[0], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert "reaper" not in out.stderr  # the watchdog was released, not left to kill an orphaned tree


def test_cli_prints_one_line_and_exits_4_when_nothing_answers_at_the_ray_address(tmp_path):
    port = _closed_port()
    out = subprocess.run(
        [sys.executable, "-m", "slime_app", "--hf-checkpoint", str(MODEL_DIR),
         "--rollout-batch-size", "1", "--num-rollout", "1",
         "--rollout-max-response-len", "8", "--output-dir",
         str(tmp_path), "--rollout-engine", "reference", "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1",
         "--ray-address", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    assert out.returncode == 4, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("slime: error:")]
    assert errors == [
        f"slime: error: --ray-address 127.0.0.1:{port}: no Ray head answers at 127.0.0.1:{port} "
        "(Connection refused, within 10 s); start one with `ray start --head` and pass the address it "
        "prints (the GCS port, 6379 by default), or leave --ray-address unset to start a local Ray"
    ]
    assert "Traceback" not in out.stderr


SLOW_AGENT = textwrap.dedent(
    """
    import os, sys, time
    # Ray's dashboard agent, started by the raylet, sleeps before its imports: a machine too busy to start it in time.
    # With SLOW_AGENT_ONCE (a file path) only the first agent is late: the machine got less busy.
    if sys.argv and sys.argv[0].endswith(os.path.join("dashboard", "agent.py")):
        once = os.environ.get("SLOW_AGENT_ONCE")
        if not (once and os.path.exists(once)):
            if once:
                open(once, "w").close()
            time.sleep(float(os.environ["SLOW_AGENT_S"]))
    """
)


REAL_START = textwrap.dedent(
    """
    import os, sys
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from slime_app.ray_start import RayStartupError, start_local_ray
    try:
        start_local_ray(ray.init, ray.shutdown, {"num_cpus": 1, "include_dashboard": False}, retry_wait_s=0)
    except RayStartupError as e:
        print("ONE LINE:", e)
        sys.exit(4)
    print("STARTED", ray.get(ray.remote(lambda: 6 * 7).remote(), timeout=120))
    ray.shutdown()
    """
)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SLIME_TEST_REAL_RAY_RETRY") != "1",
    reason="real Ray start-up timing: on a loaded machine the retry itself misses Ray's fixed 30 s node wait (seen at "
    "load 5+ while other suites ran); opt in with SLIME_TEST_REAL_RAY_RETRY=1 on a quiet machine",
)
def test_real_ray_node_whose_agent_was_late_starts_on_the_retry(tmp_path):
    # Real Ray 2.60: the raylet waits 15 s for its agents, ray.init 30 s for the node; an agent 20 s late fails the
    # first attempt (about 35 s). Checks that Ray's exception text is the one `is_startup_timeout` knows, and that
    # after `ray.shutdown` the retry starts a working node. (The late agent exits once it finds its raylet gone.)
    # Both attempts failing, with real Ray, was run by hand (one `slime: error` line after about 75 s); the fake
    # tests above hold that path.
    (tmp_path / "sitecustomize.py").write_text(SLOW_AGENT)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SLOW_AGENT_S": "20", "RAY_ADDRESS": "",
           "SLOW_AGENT_ONCE": str(tmp_path / "was-late")}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", REAL_START], capture_output=True, text=True, timeout=300, env=env)
    assert out.stderr.count("retrying once") == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert out.returncode == 0 and "STARTED 42" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: nothing listens there


def test_an_explicit_address_with_nothing_listening_fails_at_once_with_one_line(monkeypatch):
    import time

    import slime_app.cluster as cluster
    from slime_app.ray_start import RayAddressError, check_ray_address

    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(RayAddressError) as info:
        check_ray_address(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 5.0
    assert str(info.value) == (
        f"--ray-address 127.0.0.1:{port}: no Ray head answers at 127.0.0.1:{port} (Connection refused, within 10 s); "
        "start one with `ray start --head` and pass the address it prints (the GCS port, 6379 by default), or "
        "leave --ray-address unset to start a local Ray"
    )
    # Through init_ray: ray.init is never reached; RAY_ADDRESS is named when the address came from it.
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: pytest.fail("ray.init must not be called"))
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
    with pytest.raises(RayAddressError, match=rf"^RAY_ADDRESS ray://127.0.0.1:{port}: no Ray head answers"):
        cluster.init_ray(type("Cfg", (), {"ray_address": None, "ray_startup_retry_wait": 0})())


def test_the_address_check_is_bounded_and_leaves_named_modes_to_ray():
    import socket

    from slime_app.ray_start import RayAddressError, check_ray_address

    tried = []

    def black_hole(target, timeout):
        tried.append((target, timeout))
        raise TimeoutError("timed out")

    with pytest.raises(RayAddressError, match=r"no Ray head answers at ::1:6379 \(timed out, within 0.5 s\)"):
        check_ray_address("[::1]:6379", timeout_s=0.5, connect=black_hole)
    assert tried == [(("::1", 6379), 0.5)]
    for address in ("auto", "local", "head-node"):
        check_ray_address(address, connect=black_hole)  # no socket named: Ray resolves these itself
    assert len(tried) == 1
    with socket.socket() as server:  # something listening: the check passes
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_ray_address(f"127.0.0.1:{server.getsockname()[1]}")


def test_a_local_node_prestarts_no_workers_for_the_driver_unless_asked():
    """slime_app.cluster turns off the raylet's prestarted workers (idle beside slime's actors: 3 s of a 33-s CPU run);
    a value already in the environment is kept."""
    code = "import os, slime_app.cluster; print(os.environ['RAY_prestart_worker_first_driver'])"
    env = {k: v for k, v in os.environ.items() if k != "RAY_prestart_worker_first_driver"}
    for given, expected in ((None, "0"), ("1", "1")):
        if given is not None:
            env["RAY_prestart_worker_first_driver"] = given
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout == f"{expected}\n", out.stderr[-2000:]
