"""`slime_train_fsdp.compile_warmup`: a side process fills inductor's cache with the layer's graphs (issue 26)."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from slime_train_fsdp import FSDPTrainBackend
from slime_train_fsdp import compile_warmup as cw

_COMMON = pathlib.Path(__file__).with_name("_worker_common.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_compile_warmup_workers", _COMMON)
_workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_workers)
make_args = _workers.make_args


def test_token_counts_follow_the_micro_batch_size_and_are_capped_by_the_activation_budget(tmp_path):
    cfg = make_args(str(tmp_path), use_dynamic_batch_size=True, max_tokens_per_gpu=8192)
    assert cw.warm_up_token_counts(cfg, 1024, 3072) == [8192, 1024]
    # qwen3-32b's widths: one layer's saved activations allow 4096 tokens within 1 GiB.
    assert cw.warm_up_token_counts(cfg, 5120, 25600) == [cw.ACTIVATION_BUDGET // (2 * (10 * 5120 + 3 * 25600))] + [1024]
    fixed = make_args(str(tmp_path), micro_batch_size=4, rollout_max_prompt_len=100, rollout_max_response_len=300)
    assert cw.warm_up_token_counts(fixed, 64, 128) == [1600, 1024]
    small = make_args(str(tmp_path), use_dynamic_batch_size=True, max_tokens_per_gpu=600)
    assert cw.warm_up_token_counts(small, 64, 128) == [600]


def test_the_dummy_step_packs_rows_of_the_asked_lengths():
    batch = cw._dummy_batch([1100, 300])
    (step,) = batch.micro_batches
    assert [sum(int(batch.tokens[i].numel()) for i in mb) for mb in step] == [1100, 300]
    assert [int(batch.tokens[i].numel()) for i in step[0]] == [512, 512, 76]
    assert batch.response_lengths[:3] == [256, 256, 38]
    assert all(0 <= int(t.max()) < 256 for t in batch.tokens)


def test_nothing_starts_where_no_layer_compiles(tmp_path, make_tiny_qwen3):
    ckpt = str(make_tiny_qwen3(tmp_path / "m"))
    assert cw.start_compile_warm_up(make_args(ckpt)) is None  # CPU: layers are not compiled by default
    assert cw.start_compile_warm_up(make_args(ckpt, fsdp_compile_layers=True, fsdp_compile_warmup=False)) is None


def test_lora_leaves_the_layers_eager_by_default_and_starts_no_warm_up(tmp_path, make_tiny_qwen3, monkeypatch, caplog):
    # The qwen3-0.6b LoRA acceptance run compiled its peft-wrapped layers for 83 s in-process after the warm-up.
    from slime_train_fsdp.model_loading import LORA_EAGER_REASON, _log_lora_eager, compiles_layers

    ckpt = str(make_tiny_qwen3(tmp_path / "m"))
    lora = {"lora_rank": 4, "train_backend": "fsdp"}
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert compiles_layers(make_args(ckpt), cuda) is True
    assert compiles_layers(make_args(ckpt, **lora), cuda) is False
    assert compiles_layers(make_args(ckpt, **lora, fsdp_compile_layers=True), cuda) is True  # explicit wins
    assert compiles_layers(make_args(ckpt, **lora), cpu) is False
    with caplog.at_level(logging.INFO, logger="slime_train_fsdp.model_loading"):
        assert _log_lora_eager(make_args(ckpt, **lora), cuda) is True
        assert _log_lora_eager(make_args(ckpt, **lora, fsdp_compile_layers=True), cuda) is False
        assert _log_lora_eager(make_args(ckpt), cuda) is False
    assert caplog.text.count(LORA_EAGER_REASON) == 1 and "83 s" in LORA_EAGER_REASON
    # On a CUDA machine no warm-up process starts for a LoRA run; an explicit --fsdp-compile-layers starts one.
    started = []
    monkeypatch.setattr(cw.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cw, "remove_orphaned_workdirs", lambda: started.append("start") or 0)
    monkeypatch.setattr(cw.tempfile, "mkdtemp", lambda prefix: (_ for _ in ()).throw(RuntimeError("would start")))
    assert cw.start_compile_warm_up(make_args(ckpt, **lora)) is None and started == []
    with pytest.raises(RuntimeError, match="would start"):
        cw.start_compile_warm_up(make_args(ckpt, **lora, fsdp_compile_layers=True))
    assert started == ["start"]


def _handle(tmp_path: pathlib.Path, code: str) -> cw.CompileWarmUp:
    workdir = tmp_path / "work"
    workdir.mkdir()
    log = open(workdir / "warmup.log", "wb")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    log.close()
    return cw.CompileWarmUp(process=proc, workdir=workdir)


def test_a_gated_process_waits_at_its_gate_until_the_rank_releases_it(tmp_path, monkeypatch):
    """Colocated ranks start the warm-up while the engines start; it must not go on before `release`."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    code = ("import json, sys; from slime_train_fsdp import compile_warmup as cw; "
            "print('at the gate', flush=True); waited = cw._wait_at_gate(); "
            "open('report.json', 'w').write(json.dumps({'waited': waited}))")  # fmt: skip
    env = {**os.environ, "SLIME_WARMUP_GATE": str(workdir / cw._GATE)}
    log = open(workdir / "warmup.log", "wb")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    log.close()
    handle = cw.CompileWarmUp(process=proc, workdir=workdir, gated=True)
    deadline = time.monotonic() + 120
    while b"at the gate" not in (workdir / "warmup.log").read_bytes():
        assert proc.poll() is None and time.monotonic() < deadline, (workdir / "warmup.log").read_text()
        time.sleep(0.1)
    time.sleep(1.0)
    assert proc.poll() is None and not (workdir / "report.json").exists()  # still at the gate
    before = handle.started
    handle.release()
    assert (workdir / cw._GATE).exists() and not handle.gated and handle.started >= before  # DEFER_S from the gate
    assert proc.wait(timeout=60) == 0
    assert json.loads((workdir / "report.json").read_text())["waited"] >= 1.0
    handle.release()  # once open, again is nothing
    # Ungated (no variable): no wait at all.
    monkeypatch.delenv("SLIME_WARMUP_GATE", raising=False)
    assert cw._wait_at_gate() == pytest.approx(0.0, abs=0.05)


def test_the_gate_comes_after_the_cpu_part_and_before_the_first_gpu_or_process_group_call(
    tmp_path, make_tiny_qwen3, monkeypatch
):
    """run_warm_up: the stand-in is written and the counts known before the gate; the device after it (on CPU the
    process group is the first thing past the gate; a CUDA lazy init before the gate would show in `events`)."""
    import torch.distributed as dist

    events = []
    real_write = cw._write_stand_in

    def write(*args):
        events.append("stand-in")
        return real_write(*args)

    class Stop(Exception):
        pass

    def init_process_group(*args, **kwargs):
        events.append("process group")
        raise Stop

    monkeypatch.setattr(cw, "_write_stand_in", write)
    monkeypatch.setattr(cw, "_wait_at_gate", lambda: events.append("gate") or 0.0)
    # A CUDA context (device memory) is made at torch's lazy init; `is_available` only asks the driver.
    monkeypatch.setattr(cw.torch.cuda, "_lazy_init", lambda: events.append("cuda init"))
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    ckpt = str(make_tiny_qwen3(tmp_path / "m"))
    with pytest.raises(Stop):
        cw.run_warm_up(make_args(ckpt, fsdp_compile_layers=True), tmp_path)
    assert events == ["stand-in", "gate", "process group"]


def test_a_failed_warm_up_is_logged_with_its_log_and_the_run_goes_on(tmp_path, caplog):
    handle = _handle(tmp_path, "import sys; print('inductor exploded here'); sys.exit(2)")
    with caplog.at_level(logging.WARNING, logger=cw.__name__):
        assert handle.wait(timeout_s=30) is None
    assert "exit status 2" in caplog.text and "inductor exploded here" in caplog.text
    assert not handle.workdir.exists()


def test_an_unfinished_warm_up_never_delays_the_first_step(tmp_path, caplog):
    handle = _handle(tmp_path, "import time; print('still compiling', flush=True); time.sleep(60)")
    time.sleep(1.0)
    begun = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=cw.__name__):
        assert handle.wait() is None  # the default: stop it at once
    assert time.monotonic() - begun < 30  # not the 60 s it would have run
    assert handle.process.returncode is not None  # killed, not left behind
    assert "not finished (waited" in caplog.text and "still compiling" in caplog.text


def test_a_rank_whose_node_runs_another_warm_up_waits_for_that_one(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    lock = open(cw._lock_path(), "a+")  # noqa: SIM115 - "the other warm-up" holds it
    fcntl.flock(lock, fcntl.LOCK_EX)
    released = []
    timer = threading.Timer(1.5, lambda: (released.append(time.monotonic()), fcntl.flock(lock, fcntl.LOCK_UN)))
    timer.start()
    handle = _handle(tmp_path, f"import sys; sys.exit({cw.ANOTHER_RUNS})")
    with caplog.at_level(logging.INFO, logger=cw.__name__):
        assert handle.wait(timeout_s=30) is None
    assert released and time.monotonic() >= released[0]  # it returned only after the lock was released
    assert "another rank's on this node finished" in caplog.text
    lock.close()


_REAL_STEP = textwrap.dedent("""
    import importlib.util, json, os, sys
    spec = importlib.util.spec_from_file_location("slime_fsdp_compile_warmup_workers", sys.argv[2])
    workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workers)
    make_args = workers.make_args
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from slime_train_fsdp import FSDPTrainBackend
    from slime_train_fsdp import compile_warmup as cw
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    cfg = make_args(sys.argv[1], **json.loads(sys.argv[3]))
    backend = FSDPTrainBackend()
    backend.init(cfg, with_ref=False)
    # Other lengths than the warm-up's (the graphs are dynamic): 48-token rows, so the first micro-batch packs two
    # sequences (80 = 48 + 32) and the second one (30). 110 tokens, not 1000: the eager 151936-token head took
    # 60 CPU-s of this step at 1000 (22 CPU-s at ~100), and it is not what this test checks.
    cw._SEQ_LEN = 48
    batch = cw._dummy_batch([80, 30])
    # The real step, with the no-grad forward where the config has one (--entropy-coef 0: the entropy is detached).
    metrics = backend.train(0, batch)
    from torch._dynamo.utils import get_compilation_metrics
    restarts = sum(bool(m.restart_reasons) for m in get_compilation_metrics())
    print(json.dumps({**counters["inductor"], **{k: v for k, v in metrics.items() if k.startswith("perf/compile")},
                      "restarts": restarts}), flush=True)
    dist.destroy_process_group()  # a live gloo group's threads could abort the interpreter's exit (SIGABRT, once)
""")


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant",
    [{"global_batch_size": 8}, {"lora_rank": 4, "train_backend": "fsdp", "advantage_estimator": "gspo"}],
    ids=["full-grpo", "lora-gspo"],
)
def test_the_first_step_after_a_warm_up_compiles_nothing_itself(tmp_path, make_tiny_qwen3, monkeypatch, variant):
    """The stand-in's graphs are the real model's: a fresh trainer process then only hits inductor's cache.

    The tiny model's vocabulary (151936) and depth (2) differ from the stand-in's (256, 1): the graphs must not
    depend on them. With `--lora-rank` (compiled only when asked) the stand-in gets the same peft wrapping, since it
    is built from the run's config: on CPU its graphs hit the cache as the full model's do (2.5 to 7 minutes here).
    GRPO trained in one step reuses the training forward's log-probs, so its warm-up compiles no no-grad forward
    (it would never be loaded); GSPO's step computes the old log-probs first, so its warm-up does.
    """
    from slime_core.train_step import runs_no_grad_forward

    ckpt = str(make_tiny_qwen3(tmp_path / "m"))
    overrides = {"fsdp_compile_layers": True, "attn_implementation": "slime_varlen", "use_dynamic_batch_size": True,
                 "max_tokens_per_gpu": 1024, **variant}  # fmt: skip
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cfg = make_args(ckpt, **overrides)
    no_grad = runs_no_grad_forward(cfg)
    assert no_grad is ("lora_rank" in variant)
    handle = FSDPTrainBackend.start_compile_warm_up(cfg)
    assert handle is not None
    report = handle.wait(timeout_s=600)
    assert report is not None and report["graphs"] >= 1 and report["token_counts"] == [1024]
    # Where the warm-up's time went, phase by phase; all its compiling happens inside them.
    phases = report["phases"]
    expected = ["process_group", "model_init", *(["log_probs"] if no_grad else []), "forward_backward", "head"]
    assert list(phases) == expected, phases
    assert all(wall >= compiling >= 0 for wall, compiling in phases.values()), phases
    assert phases["forward_backward"][1] > 0 and (not no_grad or phases["log_probs"][1] > 0), phases
    assert sum(c for _, c in phases.values()) == pytest.approx(report["compile_seconds"], abs=0.05), report
    # Each compiled frame is named with its cache lookups (a fresh cache: every FX lookup misses).
    assert report["frames"] and all("FX 0 hit / " in line for line in report["frames"]), report["frames"]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", _REAL_STEP, ckpt, str(_COMMON),
                           json.dumps(overrides)], env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    counters = json.loads(done.stdout.strip().splitlines()[-1])
    assert counters.get("fxgraph_cache_hit", 0) >= 1
    assert counters.get("fxgraph_cache_miss", 0) == 0, counters
    # train()'s own lookups (all of the step's graphs) reach its metrics.
    assert counters["perf/compile_cache_hits"] == counters["fxgraph_cache_hit"], counters
    assert counters["perf/compile_cache_misses"] == 0, counters
    # Loaded in one pass: a float input made dynamo restart the layer's analysis (specialize_float_inputs).
    assert counters["restarts"] == 0, counters


def test_the_cpu_fallback_attention_returns_the_layout_its_fake_kernel_promises():
    from slime_train_fsdp.attention import _packed_sdpa_fake, packed_sdpa

    q, k, v = torch.randn(1, 4, 10, 8), torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    out = packed_sdpa(q, k, v, torch.tensor([0, 6, 10], dtype=torch.int32), None)
    fake = _packed_sdpa_fake(q, k, v, torch.tensor([0, 6, 10], dtype=torch.int32), None)
    assert out.shape == fake.shape == (1, 10, 4, 8)
    assert out.stride() == fake.stride()  # inductor asserts this under --fsdp-compile-layers on CPU


def test_no_warm_up_under_context_parallelism_and_the_log_says_why(tmp_path, make_tiny_qwen3, caplog):
    """A world of one cannot build the CP group the attention needs: the side process would fail every run."""
    ckpt = str(make_tiny_qwen3(tmp_path / "m"))
    cfg = make_args(
        ckpt,
        fsdp_compile_layers=True,
        attn_implementation="slime_varlen",
        megatron_args=["--context-parallel-size", "2"],
    )
    with caplog.at_level(logging.INFO, logger=cw.__name__):
        assert cw.start_compile_warm_up(cfg) is None
    assert "not with --context-parallel-size 2" in caplog.text


def test_folders_of_killed_ranks_are_removed_and_live_ones_kept(tmp_path, caplog):
    def folder(name: str) -> pathlib.Path:
        path = tmp_path / f"{cw.WORKDIR_PREFIX}{name}"
        (path / "stand-in").mkdir(parents=True)
        (path / "stand-in" / "model.safetensors").write_bytes(b"0" * 1024)
        return path

    killed, live, creating = folder("killed"), folder("live"), folder("creating")
    # A rank that held its folder's lock and was killed (SIGKILL: no clean-up of its own ran).
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, sys, time
        fh = open({str(killed / "owner.lock")!r}, "w")
        fcntl.flock(fh, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait()
    owner = open(live / "owner.lock", "w")  # noqa: SIM115 - a live rank's lock
    fcntl.flock(owner, fcntl.LOCK_EX)
    with caplog.at_level(logging.INFO, logger=cw.__name__):
        assert cw.remove_orphaned_workdirs(str(tmp_path)) == 1
    assert not killed.exists() and live.exists() and creating.exists()
    assert "removed 1 folder(s) left by killed ranks" in caplog.text
    owner.close()
    assert cw.remove_orphaned_workdirs(str(tmp_path)) == 1  # the live rank has gone too
    assert not live.exists() and creating.exists()


def test_a_started_warm_up_holds_its_folder_until_it_is_stopped(tmp_path, make_tiny_qwen3, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(cw.tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    ckpt = str(make_tiny_qwen3(tmp_path / "m"))
    handle = cw.start_compile_warm_up(make_args(ckpt, fsdp_compile_layers=True))
    assert handle is not None and handle.workdir.parent == tmp_path / "tmp"
    try:
        assert cw.remove_orphaned_workdirs() == 0 and handle.workdir.exists()  # its rank lives
    finally:
        handle.stop()
    assert not handle.workdir.exists() and list((tmp_path / "tmp").iterdir()) == []


def test_the_stand_in_keeps_one_layer_of_each_kind(tmp_path):
    """Sliding-window and full-attention layers compile to different graphs: both must be in the stand-in."""
    from transformers import Qwen3Config

    assert cw._stand_in_depth(None) == 1
    assert cw._stand_in_depth(["full_attention"] * 28) == 1
    kinds = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"] * 3
    assert cw._stand_in_depth(kinds) == 3
    source = Qwen3Config(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=12,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, use_sliding_window=True,
                         sliding_window=16, layer_types=kinds)  # fmt: skip
    config = cw._write_stand_in(source, torch.float32, tmp_path / "stand-in")
    assert config.num_hidden_layers == 3 and config.layer_types == kinds[:3] and config.vocab_size == 256
    saved = json.loads((tmp_path / "stand-in" / "config.json").read_text())
    assert saved["num_hidden_layers"] == 3 and saved["layer_types"] == kinds[:3]
    # The activation cap covers all of the stand-in's layers.
    cfg = make_args(str(tmp_path), use_dynamic_batch_size=True, max_tokens_per_gpu=1 << 20)
    per_token = 2 * (10 * 5120 + 3 * 25600)
    assert cw.warm_up_token_counts(cfg, 5120, 25600, num_layers=3)[0] == cw.ACTIVATION_BUDGET // (3 * per_token)


@pytest.mark.parametrize(
    ("attn", "colocate", "offload_rollout", "defers"),
    [
        (None, False, None, True),
        ("slime_varlen", True, True, True),
        ("slime_flex", False, None, False),
        (None, True, False, False),
    ],
)
def test_steps_defer_compiling_except_with_flex_or_a_resident_engine(attn, colocate, offload_rollout, defers):
    from types import SimpleNamespace

    cfg = SimpleNamespace(attn_implementation=attn, colocate=colocate, offload_rollout=offload_rollout)
    assert cw.defers_compile(cfg) is defers


def test_steps_run_eagerly_only_while_the_warm_up_compiles(tmp_path, monkeypatch):
    import torch
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    handle = _handle(tmp_path, "import time; time.sleep(60)")
    assert handle.pending()
    handle.defer_compile = False  # e.g. flex attention: the step compiles rather than run eagerly
    assert not handle.pending()
    handle.defer_compile = True
    monkeypatch.setattr(cw, "DEFER_S", 0.0)  # past the deferral: the step compiles, `wait` stops it
    assert not handle.pending()
    assert handle.wait() is None and handle.process.returncode is not None

    # Another rank's warm-up on this node holds the lock: pending while it does.
    monkeypatch.setattr(cw, "DEFER_S", 300.0)
    lock = open(cw._lock_path(), "a+")  # noqa: SIM115 - "the other warm-up" holds it
    fcntl.flock(lock, fcntl.LOCK_EX)
    (tmp_path / "b").mkdir()
    other = _handle(tmp_path / "b", f"import sys; sys.exit({cw.ANOTHER_RUNS})")
    other.process.wait(timeout=30)
    assert other.pending()
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    assert not other.pending()

    # Under `eager()` a compiled module runs, forward and backward, and compiles nothing.
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.proj(x)) * 2

    layer = Layer()
    layer.compile(dynamic=True)
    before = counters["stats"]["unique_graphs"]
    with handle.eager():
        layer(torch.randn(2, 4)).sum().backward()
    assert counters["stats"]["unique_graphs"] == before
