"""Engine command lines, environment, process lifecycle and clean shutdown."""

import os
import signal
import socket
import sys
import textwrap
import time

import pytest

from slime_core.config import SlimeArgs
from slime_rollout.engines import process as process_mod
from slime_rollout.engines.launch import (
    build_reference_command,
    build_sglang_command,
    engine_env,
    launch_engines,
    sglang_passthrough,
)
from slime_rollout.engines.process import find_free_port, start_engine_process

# ServerArgs fields of SGLang 0.5.16 (python/sglang/srt/server_args.py) that the launcher emits; the CLI flag
# is the field name with dashes.
SGLANG_FIELDS = {
    "model_path",
    "host",
    "port",
    "tp_size",
    "nccl_port",
    "base_gpu_id",
    "random_seed",
    "trust_remote_code",
    "skip_server_warmup",
    "mem_fraction_static",
    "enable_memory_saver",
    "enable_draft_weights_cpu_backup",  # recorded in tests/fixtures/sglang-wire/text.json's server_args
}


def sglang_args(**kw):
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": "/models/qwen3", **kw})


def test_sglang_command_line(monkeypatch):
    monkeypatch.delenv("SLIME_SGLANG_ARGS", raising=False)
    monkeypatch.setenv("SLIME_SGLANG_PYTHON", "/opt/sgl/bin/python")
    cmd = build_sglang_command(
        sglang_args(sglang_args={"sglang_chunked_prefill_size": "4096", "enable-dp-attention": True, "x_flag": False}),
        host="10.0.0.2",
        port=15000,
        nccl_port=15001,
        tp_size=2,
        base_gpu_id=4,
        random_seed=1238,
        memory_saver=True,
        mem_fraction_static=0.7,
    )
    assert cmd[:3] == ["/opt/sgl/bin/python", "-m", "sglang.launch_server"]
    flags = " ".join(cmd[3:])
    assert flags == (
        "--model-path /models/qwen3 --host 10.0.0.2 --port 15000 --tp-size 2 --nccl-port 15001 --base-gpu-id 4 "
        "--random-seed 1238 --trust-remote-code --skip-server-warmup --mem-fraction-static 0.7 "
        "--enable-memory-saver --enable-draft-weights-cpu-backup --chunked-prefill-size 4096 --enable-dp-attention"
    )
    emitted = {t[2:].replace("-", "_") for t in cmd if t.startswith("--")} - {
        "chunked_prefill_size",
        "enable_dp_attention",
    }
    assert emitted <= SGLANG_FIELDS


def test_engine_kinds_start_by_index(monkeypatch):
    # The launcher knows kinds only through ENGINE_KINDS: SGLang takes the next free port as its NCCL port and
    # defaults its first GPU to index * gpus_per_engine; the reference engine binds one port and takes no GPU.
    from slime_rollout.engines.launch import ENGINE_KINDS, EngineLauncher

    monkeypatch.delenv("SLIME_SGLANG_ARGS", raising=False)
    port = find_free_port("127.0.0.1", 21000)
    common = dict(host="127.0.0.1", port=port, index=2, gpus_per_engine=4, base_gpu_id=None, random_seed=9)
    cmd, last = ENGINE_KINDS["sglang"].command(sglang_args(), memory_saver=False, mem_fraction_static=None, **common)
    assert last > port and cmd[cmd.index("--nccl-port") + 1] == str(last)
    assert cmd[cmd.index("--base-gpu-id") + 1] == "8" and cmd[cmd.index("--tp-size") + 1] == "4"
    cmd, last = ENGINE_KINDS["reference"].command(sglang_args(), memory_saver=False, mem_fraction_static=None, **common)
    assert last == port and cmd[cmd.index("--random-seed") + 1] == "9" and "--base-gpu-id" not in cmd
    assert list(ENGINE_KINDS) == ["sglang", "reference"]
    with pytest.raises(KeyError, match=r"--rollout-engine: unknown rollout engine 'vllm' \(registered: "):
        EngineLauncher(sglang_args().model_copy(update={"rollout_engine": "vllm"}), gpus_per_engine=1)


class _EchoKind:
    """A third-party engine kind: serves the reference engine's command under another name."""

    name = "echo"

    def command(self, cfg, **kw):
        return ["echo-server", "--port", str(kw["port"])], kw["port"]

    def env(self):
        return {"ECHO": "1"}

    def check_own(self, proc):
        return None


@pytest.fixture
def registered_engines():
    from slime_core.extensions import ROLLOUT_ENGINES, RolloutEngineSpec

    specs = [
        RolloutEngineSpec(name="echo", launchable=True, factory=_EchoKind),
        RolloutEngineSpec(name="remote_only"),
        RolloutEngineSpec(name="launchable_no_factory", launchable=True),
        RolloutEngineSpec(name="bad_factory", launchable=True, factory=dict),
    ]
    yield [ROLLOUT_ENGINES.register(s) for s in specs]
    for s in specs:
        ROLLOUT_ENGINES.unregister(s.name)


def test_a_launchable_engine_of_another_package_starts_through_its_record(registered_engines):
    # Preflight lets a launchable record through, so the launcher must start it: the record's factory is its kind.
    from slime_rollout.engines.launch import EngineLauncher, engine_env, engine_kind

    launcher = EngineLauncher(sglang_args().model_copy(update={"rollout_engine": "echo"}), gpus_per_engine=1)
    assert isinstance(launcher.kind, _EchoKind) and engine_env("echo") == {"ECHO": "1"}
    with pytest.raises(ValueError, match=r"'remote_only': slime does not start .*\(its record is not launchable\); "
                                         "give their addresses with --rollout-engine-urls"):  # fmt: skip
        engine_kind("remote_only")
    with pytest.raises(ValueError, match=r"'launchable_no_factory': .*\(its launchable record names no factory\)"):
        engine_kind("launchable_no_factory")
    with pytest.raises(ValueError, match="'bad_factory': its factory built dict, which lacks command, env, check_own"):
        engine_kind("bad_factory")


def test_a_releasing_engine_keeps_its_speculative_draft_weights(monkeypatch):
    # Was: colocated (--enable-memory-saver) engines ran without --enable-draft-weights-cpu-backup, which the original
    # always passes: a sync never sends an EAGLE/MTP draft model's weights, so after the first release SGLang served
    # the draft from fresh memory for the rest of the run (no error; drafts all rejected).
    monkeypatch.delenv("SLIME_SGLANG_ARGS", raising=False)
    spec = sglang_args(sglang_args={"speculative_algorithm": "EAGLE", "speculative_num_steps": "3"})
    common = dict(host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=0, python="py")
    cmd = build_sglang_command(spec, memory_saver=True, **common)
    assert cmd.count("--enable-draft-weights-cpu-backup") == 1
    assert cmd.index("--enable-draft-weights-cpu-backup") < cmd.index("--speculative-algorithm")
    given = sglang_args(sglang_args={"enable_draft_weights_cpu_backup": True})
    assert build_sglang_command(given, memory_saver=True, **common).count("--enable-draft-weights-cpu-backup") == 1


def test_sglang_command_no_saver_passthrough_overrides_and_env_args(monkeypatch):
    monkeypatch.setenv("SLIME_SGLANG_ARGS", "--log-level debug --attention-backend 'fa3'")
    cmd = build_sglang_command(
        sglang_args(sglang_args={"mem_fraction_static": "0.5", "cuda_graph_max_bs": "64"}),
        host="h",
        port=1,
        nccl_port=2,
        tp_size=1,
        base_gpu_id=0,
        random_seed=0,
        memory_saver=False,
        mem_fraction_static=0.7,
        python="py",
    )
    assert "--enable-memory-saver" not in cmd and "--enable-draft-weights-cpu-backup" not in cmd
    assert cmd.count("--mem-fraction-static") == 1 and cmd[cmd.index("--mem-fraction-static") + 1] == "0.5"
    assert cmd[-8:] == [
        *["--mem-fraction-static", "0.5", "--cuda-graph-max-bs", "64"],  # pass-through (wins over the computed 0.7)
        *["--log-level", "debug", "--attention-backend", "fa3"],  # $SLIME_SGLANG_ARGS, last
    ]


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        ("/venvs/sgl/bin/python", "/opt/sgl/bin/python", "/venvs/sgl/bin/python"),  # the flag wins
        (None, "/opt/sgl/bin/python", "/opt/sgl/bin/python"),
        (sys.executable, "/opt/sgl/bin/python", "/opt/sgl/bin/python"),  # the value validation fills in = unset
        (None, None, sys.executable),
        ("/venvs/sgl/bin/python", None, "/venvs/sgl/bin/python"),
    ],
)
def test_engine_python_flag_then_env_then_this_interpreter(monkeypatch, flag, env, expected):
    if env is None:
        monkeypatch.delenv("SLIME_SGLANG_PYTHON", raising=False)
    else:
        monkeypatch.setenv("SLIME_SGLANG_PYTHON", env)
    cmd = build_sglang_command(
        sglang_args(engine_python=flag), host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=0,
        memory_saver=False,
    )  # fmt: skip
    assert cmd[:3] == [expected, "-m", "sglang.launch_server"]


@pytest.mark.parametrize(
    "bad",
    [
        {"port": 1},
        {"sglang_tp_size": 2},
        ["--sglang-model-path", "x"],
        {"tensor_parallel_size": 2},  # SGLang alias
        ["--sglang-tp", "4"],  # argparse abbreviation of --tp-size
        ["--sglang-model=x"],
    ],
)
def test_managed_fields_cannot_be_passed_through(bad):
    with pytest.raises(ValueError, match="which slime sets itself for every engine"):
        sglang_passthrough(bad)


def test_passthrough_value_kinds():
    got = sglang_passthrough({"a_b": [1, 2], "c": None, "log_level": "x y"})
    assert got == ["--a-b", "1", "2", "--log-level", "x y"]
    assert sglang_passthrough(None) == []


def test_the_reference_engine_gets_the_context_length_flag():
    # It was not passed on (the engine kept the model's context while the rollout capped by the flag).
    args = sglang_args(hf_checkpoint="/m", sglang_args={"sglang-context-length": "64"})
    cmd = build_reference_command(args, host="127.0.0.1", port=31000, random_seed=5)
    assert cmd[cmd.index("--context-length") + 1] == "64"
    assert "--context-length" not in build_reference_command(
        sglang_args(hf_checkpoint="/m"), host="127.0.0.1", port=31000, random_seed=5
    )


def test_reference_command_line():
    args = sglang_args(hf_checkpoint="/m", sglang_args={"max_running_requests": "8"})
    cmd = build_reference_command(args, host="127.0.0.1", port=31000, random_seed=5)
    assert cmd[1:] == [
        "-m",
        "slime_rollout.engines.reference",
        "--model-path",
        "/m",
        "--host",
        "127.0.0.1",
        "--port",
        "31000",
        "--random-seed",
        "5",
        "--dtype",
        "float32",
        "--max-running-requests",
        "8",
    ]
    from slime_rollout.engines.reference.__main__ import parse_args

    parsed = parse_args(cmd[3:])  # the engine's own parser accepts what the launcher emits
    assert parsed.port == 31000 and parsed.max_running_requests == 8


def test_engine_env(monkeypatch):
    monkeypatch.setenv("SLIME_SGLANG_PYTHONPATH", "/sgl/src")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "true")
    env = engine_env("sglang")
    assert env["PYTHONPATH"] == "/sgl/src" and "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"] == "true"  # the user's setting wins over the default
    assert env["SGLANG_MEMORY_SAVER_CUDA_GRAPH"] == "true"
    # Engines and trainer run NCCL with the same cuMem setting (a mismatch hangs the NCCL weight update).
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    assert engine_env("sglang")["NCCL_CUMEM_ENABLE"] == "1"
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    assert engine_env("sglang")["NCCL_CUMEM_ENABLE"] == "0"
    assert engine_env("reference").get("PYTHONPATH") != "/sgl/src" or os.environ.get("PYTHONPATH") == "/sgl/src"


def test_find_free_port_skips_bound_and_reserved():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        port = find_free_port(start=busy)
        assert port > busy
        assert find_free_port(start=busy) > port  # handed-out ports are not handed out again


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


STUBBORN = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    # a grandchild that ignores SIGTERM, as a wedged engine worker would
    body = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)"
    child = subprocess.Popen([sys.executable, "-c", body + "; time.sleep(600)"])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def test_shutdown_kills_the_whole_process_group(tmp_path):
    proc = start_engine_process([sys.executable, "-c", STUBBORN], url="http://127.0.0.1:1", log_path=tmp_path / "l")
    for _ in range(200):
        lines = (tmp_path / "l").read_text().split() if (tmp_path / "l").exists() else []
        if "ready" in lines and any(t.isdigit() for t in lines):
            break
        time.sleep(0.05)
    child = int(next(t for t in lines if t.isdigit()))
    assert os.getpgid(child) == proc.pid  # same new session/process group
    assert _alive(proc.pid) and _alive(child)
    proc.shutdown(grace_s=2)
    for _ in range(100):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(proc.pid) and not _alive(child)
    assert proc not in process_mod._LIVE
    proc.shutdown()  # idempotent


def test_wait_healthy_reports_early_exit_with_log(tmp_path):
    code = "import sys; print('boom: CUDA out of memory'); sys.exit(3)"
    proc = start_engine_process([sys.executable, "-c", code], url="http://127.0.0.1:9", log_path=tmp_path / "l")
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*CUDA out of memory"):
        proc.wait_healthy(30, poll_s=0.05)
    proc.shutdown()


def test_the_engine_startup_wait_is_the_flags_and_its_timeout_names_it(tmp_path):
    """The wait was a constant 600 s that no flag changed (the original waits as long as the engine process lives):
    a large model loading for longer stopped the run with no way to allow it more time."""
    from slime_core.config.cli import parse_args
    from slime_rollout.engines.launch import EngineLauncher
    from slime_rollout.engines.launch.launcher import _wait_own_engine

    base = ["--rollout-batch-size", "1", "--num-rollout", "1", "--hf-checkpoint", "/models/qwen3"]
    cfg = parse_args([*base, "--rollout-engine-startup-timeout", "0.5"])
    launcher = EngineLauncher(cfg, gpus_per_engine=1)
    assert launcher.startup_timeout_s == 0.5
    assert EngineLauncher(cfg, gpus_per_engine=1, startup_timeout_s=7).startup_timeout_s == 7  # an explicit wait wins
    assert parse_args(base).rollout_engine_startup_timeout == 1800.0

    code = "import time; print('loading shards'); time.sleep(60)"  # alive, never serving
    url = f"http://127.0.0.1:{find_free_port(start=43000)}"
    proc = start_engine_process([sys.executable, "-c", code], url=url, log_path=tmp_path / "l")
    try:
        with pytest.raises(TimeoutError, match=r"(?s)--rollout-engine-startup-timeout.*loading shards"):
            _wait_own_engine(proc, launcher.kind, launcher.startup_timeout_s)
    finally:
        proc.shutdown()


def test_sigterm_first_lets_the_main_process_exit_cleanly(tmp_path):
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('up', flush=True)\n"
        "time.sleep(600)"
    )
    proc = start_engine_process([sys.executable, "-c", code], url="http://x:1", log_path=tmp_path / "l")
    for _ in range(200):
        if (tmp_path / "l").exists() and "up" in (tmp_path / "l").read_text():
            break
        time.sleep(0.05)
    proc.shutdown(grace_s=10)
    assert proc.popen.returncode == 0  # exited through its SIGTERM handler, not SIGKILL


@pytest.mark.slow  # several engine processes (10-30 s): the full CI pass runs it
def test_launch_failure_cleans_up(tmp_path, reference_args, engine_base_port):
    args = reference_args(tmp_path / "missing-model")
    before = set(process_mod._LIVE)
    with pytest.raises(RuntimeError, match="exited with code"):
        launch_engines(
            args, num_engines=2, gpus_per_engine=1, startup_timeout_s=120, log_dir=tmp_path, base_port=engine_base_port
        )
    assert set(process_mod._LIVE) == before


def test_launch_validates_arguments(reference_args, tmp_path):
    vllm = reference_args(tmp_path).model_copy(update={"rollout_engine": "vllm"})  # past validation, which rejects it
    with pytest.raises(ValueError, match="--rollout-engine"):
        launch_engines(vllm, num_engines=1, gpus_per_engine=1)
    with pytest.raises(ValueError, match="base_gpu_ids"):
        launch_engines(reference_args(tmp_path), num_engines=2, gpus_per_engine=1, base_gpu_ids=[0])


@pytest.mark.slow  # several engine processes (10-30 s): the full CI pass runs it
def test_reference_group_restart_and_shutdown_leave_no_process(
    tiny_qwen3_dir, reference_args, tmp_path, engine_base_port
):
    import httpx

    with launch_engines(
        reference_args(tiny_qwen3_dir),
        num_engines=1,
        gpus_per_engine=1,
        startup_timeout_s=300,
        log_dir=tmp_path,
        base_port=engine_base_port,
    ) as group:
        proc = group.processes[0]
        assert httpx.get(proc.url + "/server_info", trust_env=False).json()["pid"] == proc.pid
        assert group.dead_engines() == []
        proc.popen.kill()  # simulate a crash
        proc.popen.wait()
        assert group.dead_engines(timeout_s=5) == [0]
        new_url = group.restart(0)
        new = group.processes[0]
        assert new.pid != proc.pid and group.urls == [new_url]
        assert httpx.get(new_url + "/server_info", trust_env=False).json()["pid"] == new.pid
        assert group.dead_engines() == []
    assert not _alive(proc.pid) and not _alive(new.pid)
    with pytest.raises(httpx.ConnectError):
        httpx.get(proc.url + "/health", trust_env=False)


def test_engine_dies_with_a_killed_launcher(tmp_path):
    """A launcher killed by SIGKILL (no exit hooks run) still takes its engine down (PDEATHSIG)."""
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "engine.pid"
    launcher = (
        "import sys, time, pathlib\n"
        "from slime_rollout.engines.process import start_engine_process\n"
        "p = start_engine_process([sys.executable, '-c', 'import time; time.sleep(120)'], url='http://x')\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid))\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher])
    deadline = time.time() + 60
    while not pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    engine_pid = int(pid_file.read_text())
    os.kill(engine_pid, 0)  # alive
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            break
        # Reap it if it became our zombie (it is reparented to init normally).
        time.sleep(0.1)
    else:
        os.kill(engine_pid, signal.SIGKILL)
        raise AssertionError("engine outlived its SIGKILLed launcher")


def test_router_allows_the_requests_the_client_sends():
    """sglang-router caps requests in flight (256 by default in 0.2): slime sets the cap to what it sends."""
    from slime_rollout.engines.router import build_router_command

    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "sglang_server_concurrency": 300})
    cmd = build_router_command(cfg, host="h", port=1, prometheus_port=2, max_concurrent_requests=600)
    assert cmd[cmd.index("--max-concurrent-requests") + 1] == "600"
    given = cfg.model_copy(update={"router_args": {"router_max_concurrent_requests": 50}})
    cmd = build_router_command(given, host="h", port=1, prometheus_port=2, max_concurrent_requests=600)
    assert cmd.count("--max-concurrent-requests") == 1 and cmd[cmd.index("--max-concurrent-requests") + 1] == "50"


def test_an_engine_with_pipeline_stages_splits_its_gpus_into_tp_times_pp(monkeypatch):
    # Fifth hostile pass on issue 27 (item 8): `--rollout-num-gpus-per-engine 4 --sglang-pp-size 2` launched
    # `--tp-size 4 --pp-size 2`, 8 GPUs for an engine given 4 (the original: tp = 4 // 2).
    from slime_rollout.engines.launch import ENGINE_KINDS

    monkeypatch.delenv("SLIME_SGLANG_ARGS", raising=False)
    port = find_free_port("127.0.0.1", 21000)
    common = dict(host="127.0.0.1", port=port, index=1, gpus_per_engine=4, base_gpu_id=None, random_seed=9)
    cfg = sglang_args(rollout_num_gpus_per_engine=4, sglang_args={"pp_size": "2"})
    cmd, _ = ENGINE_KINDS["sglang"].command(cfg, memory_saver=False, mem_fraction_static=None, **common)
    assert cmd[cmd.index("--tp-size") + 1] == "2" and cmd[cmd.index("--pp-size") + 1] == "2"  # was --tp-size 4
    assert cmd[cmd.index("--base-gpu-id") + 1] == "4"
