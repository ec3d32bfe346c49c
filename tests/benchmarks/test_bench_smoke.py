"""CPU smoke tests of the GPU benchmark scripts (tiny Qwen3 with the real tokenizer, reference engine).

They check that every script runs end to end and emits a well-formed, self-consistent JSON line; the numbers
themselves are meaningless on CPU. The FLOP formula and helpers are checked against hand computations.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def _import_file(module_name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(name: str):
    # The scripts import their helpers as top-level `_common` / `_engine` (run as `python3 benchmarks/x.py`,
    # their own directory is first on sys.path); here the helpers are registered under those names instead.
    for helper in ("_common", "_engine"):  # _engine imports _common: this order
        if helper not in sys.modules:
            sys.modules[helper] = _import_file(helper, BENCH / f"{helper}.py")
    return _import_file(f"bench_{name}", BENCH / f"{name}.py")


def _run(cmd: list[str], tmp: pathlib.Path, models: pathlib.Path, timeout: int = 600) -> dict:
    env = {**os.environ, "SLIME_BENCH_MODELS": str(models), "BENCH_RESULTS": str(tmp / "results.jsonl"),
           "BENCH_LOG_DIR": str(tmp / "logs"), "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    (tmp / "logs").mkdir(exist_ok=True)
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout  # exactly one result line on stdout
    result = json.loads(lines[0])
    saved = [json.loads(ln) for ln in (tmp / "results.jsonl").read_text().splitlines()]
    assert saved[-1] == result  # the same line was appended to $BENCH_RESULTS
    return result


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> pathlib.Path:
    """A model root holding the qwen3-tiny checkpoint (written once)."""
    root = tmp_path_factory.mktemp("models")
    path, seconds = _load("_common").ensure_model("qwen3-tiny", root)
    assert (path / "model.safetensors").is_file() and seconds > 0
    assert _load("_common").ensure_model("qwen3-tiny", root) == (path, 0.0)  # reused, not rewritten
    return root


# ------------------------------------------------------------------------------------------ helpers


def test_train_flops_counts_old_logprob_forward():
    bench = _load("bench_train_fsdp")
    common = _load("_common")
    cfg = common.preset_config("qwen3-0.6b")
    a = types.SimpleNamespace(tokens_per_mb=8192, seq_len=1024, response_len=512, steps_per_rollout=2, mbs_per_step=1)
    with_fwd = bench.train_flops(cfg, a, old_forward=True)["total"]
    without = bench.train_flops(cfg, a, old_forward=False)["total"]
    assert with_fwd == pytest.approx(without * 4 / 3, rel=1e-12)  # fwd = 1/3 of fwd+bwd
    # Leading term 6·N_body·T per train step: 0.6B shape has ~0.44 B decoder-layer parameters.
    n_body = bench.train_flops(cfg, a, old_forward=False)["n_body"]
    assert 0.40e9 < n_body < 0.46e9
    assert without > 2 * 6 * n_body * 8192


def test_make_batch_schedule():
    bench = _load("bench_train_fsdp")
    a = types.SimpleNamespace(tokens_per_mb=100, seq_len=30, response_len=10, steps_per_rollout=2, mbs_per_step=2)
    b = bench.make_batch(a)
    assert b.num_samples == 12 and b.micro_batches == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]
    assert all(t.numel() == 30 for t in b.tokens) and b.step_sample_counts == [6, 6]
    assert b.step_token_counts == [60.0, 60.0]
    with pytest.raises(ValueError, match="--response-len"):
        bench.make_batch(types.SimpleNamespace(**{**vars(a), "response_len": 30}))


def test_weight_buckets_respect_the_limit():
    import torch

    bench = _load("bench_weight_sync")
    named = [(f"t{i}", torch.zeros(n, dtype=torch.bfloat16)) for i, n in enumerate([10, 20, 5, 40, 1])]
    out = bench.buckets(named, bucket_bytes=60)  # 2 bytes per element
    # 20+40 bytes fill the first; 10 alone (10+80 > 60); 80 is oversized and alone; then 2.
    assert [[n for n, _ in b] for b in out] == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]


def test_e2e_report_summary():
    report = _load("e2e_report")
    scalars = {"perf/step_time": {0: 10.0, 1: 4.0, 2: 6.0}, "perf/rollout_time": {0: 5.0, 1: 2.0, 2: 3.0},
               "rollout/response_len/mean": {0: 100.0, 1: 50.0, 2: 70.0}}  # fmt: skip
    s = report.summarize(scalars, rollout_batch_size=2, n=3, skip_first=1)
    assert s["perf/step_time"]["median"] == 5.0 and s["perf/rollout_time"]["all"] == [5.0, 2.0, 3.0]
    assert s["generated_tokens"] == 6 * (50 + 70)
    assert s["tokens_per_s"] == pytest.approx(720 / 10.0)
    assert s["perf/train_time"]["median"] is None
    assert "train/opd_reverse_kl" not in s  # curves only when the run logged them
    ppo = {**scalars, "train/critic-explained_variance": {0: -0.3, 1: 0.1, 2: 0.4}}
    assert report.summarize(ppo, rollout_batch_size=2, n=3, skip_first=1)["train/critic-explained_variance"] == {
        "first": -0.3,
        "last": 0.4,
    }
    with pytest.raises(ValueError, match="perf/step_time"):
        report.summarize({}, rollout_batch_size=1, n=1, skip_first=0)
    assert "tokens_per_s_compiled" not in s  # no eager step logged: nothing to tell apart


def test_e2e_report_compiled_steady_state():
    """Steps that ran eagerly (warm-up pending) or loaded the graphs are left out of `tokens_per_s_compiled`."""
    report = _load("e2e_report")
    scalars = {"perf/step_time": {0: 9.0, 1: 5.0, 2: 6.0, 3: 3.0, 4: 2.0},
               "rollout/response_len/mean": {0: 10.0, 1: 10.0, 2: 20.0, 3: 30.0, 4: 10.0},
               "perf/compile_warmup_pending": {0: 1.0, 1: 1.0}, "perf/compile_time": {2: 1.5}}  # fmt: skip
    s = report.summarize(scalars, rollout_batch_size=1, n=2, skip_first=1)
    assert s["steps_eager"] == [0, 1] and s["steps_compiled"] == [3, 4]
    assert s["tokens_per_s_compiled"] == pytest.approx(2 * (30 + 10) / (3.0 + 2.0))
    assert s["tokens_per_s"] == pytest.approx(2 * (10 + 20 + 30 + 10) / 16.0)  # every measured step
    assert s["perf/compile_warmup_pending"]["all"] == [1.0, 1.0, None, None, None]


# ------------------------------------------------------------------------------------------ scripts


def test_matmul_cpu(tmp_path, models):
    r = _run([sys.executable, str(BENCH / "bench_matmul.py"), "--device", "cpu", "--size", "128"], tmp_path, models)
    assert r["bench"] == "matmul" and len(r["seconds_all"]) == 5 and r["tflops"] > 0 and r["rel_err"] < 2e-2


@pytest.mark.slow
def test_train_fsdp_cpu(tmp_path, models):
    r = _run([sys.executable, str(BENCH / "bench_train_fsdp.py"), "--device", "cpu", "--preset", "qwen3-tiny",
              "--tokens-per-mb", "64", "--seq-len", "32", "--response-len", "16", "--repeats", "2"],
             tmp_path, models)  # fmt: skip
    assert r["seqs_per_mb"] == 2 and r["tokens_per_train"] == 2 * 2 * 32 and r["old_logprob_forward"] is True
    assert len(r["train_s_all"]) == 2 and r["tokens_per_s"] == pytest.approx(128 / r["train_s_median"])
    assert r["grad_norm"] > 0 and r["peak_mem_gib"] is None


_MEGATRON_CPU = ["bench_train_megatron.py", "--device", "cpu", "--preset", "qwen3-tiny", "--tokens-per-mb", "64",
                 "--seq-len", "32", "--response-len", "16"]  # fmt: skip


@pytest.fixture(scope="module")
def megatron_dense_with_flags(tmp_path_factory, models) -> dict:
    """One `bench_train_megatron.py` run with the dense-mask attention and issue 26's run flags (`--log-probs-head
    fused`, `--megatron-extra=--use-foreach-grad-norm`), asserted on by the two tests below: the dense attention's
    first-call gradient norm against the packed run's, and the flags' echo (one process start instead of two)."""
    pytest.importorskip("megatron.core")
    cmd = [sys.executable, str(BENCH / _MEGATRON_CPU[0]), *_MEGATRON_CPU[1:], "--repeats", "1", "--attention-backend",
           "local", "--log-probs-head", "fused", "--megatron-extra=--use-foreach-grad-norm"]  # fmt: skip
    return _run(cmd, tmp_path_factory.mktemp("megatron_dense_with_flags"), models)


@pytest.mark.slow
def test_train_megatron_cpu(tmp_path, models, megatron_dense_with_flags):
    cmd = [sys.executable, str(BENCH / _MEGATRON_CPU[0]), *_MEGATRON_CPU[1:], "--repeats", "2"]
    r = _run(cmd, tmp_path, models)
    assert r["bench"] == "train_megatron" and r["attention"] == "packed" and r["old_logprob_forward"] is True
    assert r["compile_layers"] is False and r["log_probs_head"] == "logits"  # the CPU defaults (eager, logits)
    assert r["seqs_per_mb"] == 2 and r["tokens_per_train"] == 2 * 2 * 32 and len(r["train_s_all"]) == 2
    assert r["tokens_per_s"] == pytest.approx(128 / r["train_s_median"]) and r["grad_norm"] > 0
    # Same FLOP count as the FSDP benchmark on the same shape.
    fsdp = _load("bench_train_fsdp")
    import transformers

    config = transformers.AutoConfig.from_pretrained(models / "qwen3-tiny-bfloat16")
    shape = types.SimpleNamespace(tokens_per_mb=64, seq_len=32, response_len=16, steps_per_rollout=2, mbs_per_step=1)
    assert r["model_tflops_per_train"] == pytest.approx(fsdp.train_flops(config, shape, True)["total"] / 1e12)
    # The dense-mask attention on the same batch: same first-call gradient norm (bf16 on CPU: 2 %; the fused head
    # it ran with gives the logits head's norm within the same 2 %, test_train_megatron_speed_switches_cpu).
    dense = megatron_dense_with_flags
    assert dense["attention"] == "dense" and dense["grad_norm"] == pytest.approx(r["grad_norm"], rel=2e-2)


@pytest.mark.slow
def test_train_megatron_speed_switches_cpu(tmp_path, models, megatron_dense_with_flags):
    """Issue 26's switches: as run flags, and as `--ab` variants toggled on one backend (one JSON line either way)."""
    cmd = [sys.executable, str(BENCH / _MEGATRON_CPU[0]), *_MEGATRON_CPU[1:], "--repeats", "1"]
    flags = megatron_dense_with_flags
    assert flags["log_probs_head"] == "fused" and flags["megatron_extra"] == "--use-foreach-grad-norm"
    ab = _run([*cmd, "--log-probs-head", "fused", "--ab", "base,head,gradnorm,eager_all"], tmp_path, models)
    assert [(v["variant"], v["flags"]) for v in ab["ab"]] == [
        ("base", ""),
        ("head", "--log-probs-head fused"),
        ("gradnorm", "--use-foreach-grad-norm"),
        ("eager_all", "--use-torch-fused-adam --use-foreach-grad-norm --log-probs-head fused"),
    ]
    # base turned the run's --log-probs-head fused off: the top level is the first variant's, with the logits head
    assert ab["log_probs_head"] == "logits" and ab["train_s_median"] == ab["ab"][0]["train_s_median"]
    assert ab["ab"][0]["speedup_vs_first"] == 1.0 and all("error" not in v for v in ab["ab"])
    # Same weights and batch on the first call of each (lr 1e-6 moves the weights by ~1e-6 between variants); the
    # flags' run had the dense attention, whose norm is the packed one's within the same 2 % (test_train_megatron_cpu).
    for variant in ab["ab"]:
        assert variant["grad_norm"] == pytest.approx(flags["grad_norm"], rel=2e-2)  # bf16 on CPU
    # A misspelt variant fails before the model is written or loaded (the model root stays empty).
    with pytest.raises(AssertionError, match="unknown variants"):
        _run([*cmd, "--ab", "base,nosuch"], tmp_path, tmp_path / "no-models")
    assert not (tmp_path / "no-models").exists()


@pytest.mark.slow
def test_megatron_attention_probe_cpu(tmp_path, models):
    pytest.importorskip("megatron.core")
    r = _run([sys.executable, str(BENCH / "probe_megatron_attention.py"), "--device", "cpu", "--seqs", "3",
              "--seq-len", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--repeats", "1"],
             tmp_path, models)  # fmt: skip
    assert r["tokens"] == 96 and r["dense_ms"] > 0 and r["packed_ms"] > 0
    # fp32 on CPU: both paths compute the same attention (1e-5); the dense one keeps at least the [H, T, T] fp32
    # probabilities more for the backward (4 heads, T = 96).
    assert r["max_abs_diff"] < 1e-5
    assert (r["dense_saved_gib"] - r["packed_saved_gib"]) * 2**30 >= 4 * 96 * 96 * 4


# bench_e2e.sh's CPU smoke is the GSM8K run of tests/apps/test_train_e2e.py (`gsm8k_run`): one run serves both.


def test_grader_throughput_cpu(tmp_path):
    """bench_grader.py at a tiny N: one well-formed line, and the scores a faster grader must leave unchanged."""
    cmd = [sys.executable, str(BENCH / "bench_grader.py"), "--num-pairs", "300", "--repeats", "2"]
    r = _run(cmd, tmp_path, tmp_path)  # no model: the model root is never read
    assert r["bench"] == "grader" and r["num_pairs"] == 300 and len(r["round_s_all"]) == 2
    assert r["num_timed"] + r["num_symbolic"] == 300 and r["num_symbolic"] > 0 and not r["include_symbolic"]
    assert r["pairs_per_s"] == pytest.approx(r["num_timed"] / r["round_s_median"], rel=1e-3)
    # Pinned at 3fb8c42, before the grader's hot path was made faster (RESULTS.md, "Grader throughput"): the 149
    # labelled pairs and 151 generated ones (seed 0). A change here is a changed score, not a speed-up.
    assert (r["checksum"], r["score_sum"]) == ("1e7d56dc7fdd32eb", pytest.approx(164.59150495946133, abs=1e-9))


def test_grader_bench_pairs_and_checksum():
    bench = _load("bench_grader")
    fixture = [json.loads(ln) for ln in (REPO / "tests/fixtures/graders/pairs.jsonl").read_text().splitlines() if ln]
    pairs = bench.make_pairs(len(fixture) + 50, seed=3)
    assert pairs[: len(fixture)] == fixture and pairs == bench.make_pairs(len(fixture) + 50, seed=3)
    assert bench.make_pairs(5, seed=3) == fixture[:5]
    assert {p["grader"] for p in bench.make_pairs(len(fixture) + 400, seed=0)[len(fixture) :]} == {
        "math", "dapo", "deepscaler", "f1", "gpqa"
    }  # fmt: skip
    # The fixture's pairs are graded as labelled (test_grader_pairs.py), so their checksum is their labels'.
    scores, symbolic = bench.first_pass(fixture)
    assert bench.checksum(scores) == bench.checksum([float(p["expected"]) for p in fixture])
    assert 0 < sum(symbolic) < len(fixture)  # some reach sympy (`3^{-40}` against `\frac{1}{3^{40}}`), most not
    assert bench.checksum([1.0, 0.5]) == hashlib.sha256(b"1.0\n0.5").hexdigest()[:16]
    with pytest.raises(ValueError, match="--num-pairs"):
        bench.make_pairs(0, seed=0)


def test_trl_reward_parsing():
    trl_bench = _load("bench_trl_grpo")
    assert trl_bench.last_number("so 12 + 3 = 1,234.") == "1234"
    assert trl_bench.last_number("no digits") is None
    completions = [[{"role": "assistant", "content": "The answer is 72"}], [{"role": "assistant", "content": "7"}], "x"]
    assert trl_bench.math_reward(completions, ["72", "72", "3"]) == [1.0, 0.0, 0.0]
    rows = trl_bench.load_prompts(REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl", 52)
    assert len(rows) == 52 and rows[50] == rows[0] and rows[0]["prompt"][0]["role"] == "user"


@pytest.mark.slow
def test_engine_server_serves_until_sigterm(tmp_path, models):
    import signal
    import time

    import httpx

    url_file = tmp_path / "url"
    env = {**os.environ, "SLIME_BENCH_MODELS": str(models), "CUDA_VISIBLE_DEVICES": ""}
    log = tmp_path / "server.log"
    cmd = [sys.executable, str(BENCH / "_engine.py"), "--engine", "reference", "--preset", "qwen3-tiny",
           "--url-file", str(url_file), "--log-dir", str(tmp_path)]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not url_file.exists():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "engine not ready in 300 s"
            time.sleep(0.5)
        url = url_file.read_text().strip()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        with pytest.raises(httpx.TransportError):  # the engine went down with the server script
            httpx.get(f"{url}/health", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def gpu_session(tmp_path_factory, models) -> tuple[pathlib.Path, dict[str, dict]]:
    """One `gpu_session.sh matmul nosuchstep weight_sync rollout` in CPU smoke mode, asserted on by the three tests
    below: the session script itself, and weight_sync and rollout on its shared engine (the same scripts and flags
    as their standalone runs; a script starting its own engine goes through the `_engine.engine` that serves the
    shared one). Yields `$OUT` and each bench's result line by name."""
    tmp = tmp_path_factory.mktemp("gpu_session")
    out = tmp / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "SLIME_BENCH_MODELS": str(models),
        "BENCH_SMOKE": "1",
        "BENCH_LOG_DIR": str(tmp / "logs"),
        "ENGINE_URL_FILE": str(tmp / "engine.url"),
        "WS_DISK_DIR": str(tmp / "disk"),
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
    }  # python3 = this interpreter
    proc = subprocess.run(["bash", str(BENCH / "gpu_session.sh"), "matmul", "nosuchstep", "weight_sync", "rollout"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]
    steps = {ln["step"]: ln["rc"] for ln in lines if ln["bench"] == "step"}
    assert steps == {"matmul": 0, "weight_sync": 0, "rollout": 0}, (steps, (out / "logs.txt").read_text()[-3000:])
    results = {ln["bench"]: ln for ln in lines if ln["bench"] != "step"}
    return out, results


@pytest.mark.slow
def test_gpu_session_smoke_mode(gpu_session):
    out, results = gpu_session
    lines = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines()]
    assert [ln["bench"] for ln in lines if ln["bench"] != "step"] == ["matmul", "weight_sync", "rollout"]
    assert "unknown step 'nosuchstep'" in (out / "logs.txt").read_text()
    assert (out / "engine-logs.tar.gz").stat().st_size > 0
    assert len(list(out.iterdir())) <= 8  # what comes back from the device machine


@pytest.mark.slow
def test_weight_sync_reference_engine(gpu_session):
    out, results = gpu_session
    r = results["weight_sync"]
    assert r["engine"] == "reference" and r["preset"] == "qwen3-tiny" and r["repeats"] == 1
    # 2 pushes per mode (perturbed, restored), each verified by weight_version and a greedy generation.
    assert r["greedy_checked"] and r["greedy_failures"] == [] and r["final_weight_version"] == "4"
    for mode in ("disk", "tensor"):
        assert len(r[mode]["seconds_all"]) == 2
        assert r[mode]["gb_per_s"] == pytest.approx(r["payload_gb"] / r[mode]["seconds_median"])
    disk = out.parent / "disk"
    assert disk.is_dir() and not any(disk.iterdir())  # disk versions are deleted after each update


@pytest.mark.slow
def test_rollout_reference_engine(gpu_session):
    _, results = gpu_session
    r = results["rollout"]
    assert (r["engine"], r["num_prompts"], r["n"], r["max_new_tokens"], r["concurrency"]) == ("reference", 3, 2, 6, 8)
    assert 3 * 2 <= r["tokens_per_round"] <= 3 * 2 * 6  # 3 prompts x 2 samples, at most 6 new tokens each
    assert r["slime_tok_s_median"] > 0 and r["direct_tok_s_median"] > 0
    b, a = r["direct_tok_s_median"], r["slime_tok_s_median"]
    assert r["overhead_pct"] == pytest.approx(100 * (b - a) / b)


def test_megatron_all_hostnorm_variant_puts_megatron_cores_norm_back_under_the_foreach_hooks(monkeypatch):
    """`--ab all,all_hostnorm` measures the host read of the grad norm that `--use-foreach-grad-norm` took out.

    `run_ab` on no backend (the other switches' toggles and the timing stubbed): the grad norm and clip megatron-core's
    optimizer module would call while each variant is timed."""
    pytest.importorskip("megatron.core")
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mcore_optimizer

    from slime_train_megatron import torch_optimizer as tp

    if "bench_train_fsdp" not in sys.modules:  # imported by name, as the script's directory gives it
        sys.modules["bench_train_fsdp"] = _load("bench_train_fsdp")
    bench = _load("bench_train_megatron")
    assert bench.VARIANTS["all_hostnorm"] == (*bench.VARIANTS["all"], "hostnorm")
    for switch in ("head", "adam", "fusions", "compile"):
        monkeypatch.setitem(bench.SWITCHES, switch, (bench.SWITCHES[switch][0], lambda backend, on, device: None))
    seen = []

    def timed(backend, batch, device, repeats):
        norm, clip = mcore_optimizer.get_grad_norm_fp32, mcore_optimizer.clip_grad_by_total_norm_fp32
        hooks = "foreach" if clip_grads.l2_norm_impl is tp.foreach_l2_norm else "local"
        on_device = (norm, clip) == (tp.device_grad_norm_fp32, tp.device_clip_grad_by_total_norm_fp32)
        own = (norm, clip) == (clip_grads.get_grad_norm_fp32, clip_grads.clip_grad_by_total_norm_fp32)
        seen.append((hooks, "device" if on_device else "megatron-core" if own else "mixed"))
        return 0.0, [1.0], {}, None

    monkeypatch.setattr(bench._common, "time_train", timed)
    a = types.SimpleNamespace(ab="all_hostnorm,all,all_hostnorm,base", profile=False, profile_gaps=False,
                              profile_variants=None,
                              device="cpu", repeats=1, peak_tflops=1.0)  # fmt: skip
    try:
        tp.use_foreach_grad_norm(True)  # the run's flags: --use-foreach-grad-norm
        bench.run_ab(None, None, a, {"total": 1e12})
        assert seen == [("foreach", "megatron-core"), ("foreach", "device"), ("foreach", "megatron-core"),
                        ("local", "megatron-core")]  # fmt: skip
        # The first variant sets every switch, also one the run's flags left off: `all` first has the device norm.
        tp.use_foreach_grad_norm(False)
        seen.clear()
        bench.run_ab(None, None, types.SimpleNamespace(**{**vars(a), "ab": "all"}), {"total": 1e12})
        assert seen == [("foreach", "device")]
    finally:
        tp.use_foreach_grad_norm(False)


def test_gap_attribution_charges_idle_device_time_to_the_host_frames_around_it():
    """Kernels at 0–100 and 300–400 µs and a memcpy at 390–500 (merged), a 10 µs launch gap at 500–510, then a
    kernel to 600: one counted gap (100–300). `step` spans it all, `copy_loop` covers 150–250 of it, and an op that
    ran only while the device was busy is charged nothing."""
    common = _load("_common")
    ev = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 300, "dur": 100},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 390, "dur": 110},
        {"ph": "X", "cat": "kernel", "name": "add", "ts": 510, "dur": 90},
        {"ph": "X", "cat": "python_function", "name": "optimizer.py(1): step", "ts": 0, "dur": 600},
        {"ph": "X", "cat": "python_function", "name": "optimizer.py(2): copy_loop", "ts": 150, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 200, "dur": 200},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 20, "dur": 50},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 280, "dur": 10},
        {"ph": "i", "cat": "python_function", "name": "instant", "ts": 120},
    ]
    out = common.gap_attribution(ev, min_gap_us=20.0)
    assert out["gaps"] == 1 and out["gap_ms"] == 0.2
    assert out["device_busy_ms"] == 0.39  # 0–100, 300–500, 510–600
    assert out["python"] == [["optimizer.py(1): step", 0.2], ["optimizer.py(2): copy_loop", 0.1]]
    assert out["cpu_op"] == [["aten::copy_", 0.1]]
    assert out["runtime"] == [["cudaLaunchKernel", 0.01]]
    assert common.gap_attribution(ev, min_gap_us=5.0)["gaps"] == 2
    assert common.gap_attribution([], min_gap_us=5.0)["gap_ms"] == 0.0


def test_gap_attribution_keeps_python_frames_of_the_main_thread_inside_their_callers():
    """A C call the tracer left open (its end past its caller's) is clipped to the caller; another thread's frames
    (a compile worker's reader) are not charged."""
    common = _load("_common")
    ev = [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 300, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 700, "dur": 100},
        {"ph": "X", "cat": "python_function", "tid": 1, "name": "main", "ts": 0, "dur": 800},
        {"ph": "X", "cat": "python_function", "tid": 1, "name": "fwd", "ts": 90, "dur": 160},
        {"ph": "X", "cat": "python_function", "tid": 1, "name": "<built-in method op>", "ts": 200, "dur": 600},
        {"ph": "X", "cat": "python_function", "tid": 2, "name": "reader", "ts": 0, "dur": 700},
    ]
    out = common.gap_attribution(ev, min_gap_us=20.0)
    assert out["gap_ms"] == 0.5  # 100–300 and 400–700
    assert out["python"] == [["main", 0.5], ["fwd", 0.15], ["<built-in method op>", 0.05]]
