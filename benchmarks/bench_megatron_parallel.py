"""Megatron parallel consistency: the same GRPO step under several (TP, PP, CP) layouts gives the same loss.

`python3 benchmarks/bench_megatron_parallel.py --preset qwen3-0.6b --layouts 1,1,1 2,1,1 1,2,1 1,1,2`

For each layout (TP·PP·CP ranks, one process per GPU, NCCL), `MegatronTrainBackend` loads the same random-weight
checkpoint in bf16 and runs `train()` on the same rollout: 8 prompt groups × 2 samples of 512 tokens with
96-475 response tokens (random ids, seed 0), GRPO advantages from fixed 0/1 rewards, one optimizer step, 4
micro-batches of ≤ 2048 tokens, batched by
`build_rollout_batches` (the app's own path). It does so twice from the same weights: with the
per-sample loss (default) and with `--calculate-per-token-loss`. Rank 0 of the last pipeline stage reports
`train/loss`, `train/pg_loss` and `train/grad_norm` (the step's first-step metrics; ratio 1, so the loss is the
advantage-weighted mean) and the mean response log-prob.

The JSON line holds every layout's values and each one's relative difference to the first layout. A layout
that needs more GPUs than the machine has, or CP > 1 without Transformer Engine (the local layer spec's attention
has no context-parallel exchange), is reported as skipped with the reason. Budget on H200s (qwen3-0.6b): ~60-90 s per
layout (imports, checkpoint load, 4 forward/backward passes).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import _common  # sibling module: a script's own directory is first on sys.path

LOSS_MODES = {"per_sample": False, "per_token": True}


def _config(model_dir: str, tp: int, pp: int, cp: int):
    from slime_core.config import parse_args

    return parse_args(
        [
            *("--hf-checkpoint", model_dir, "--train-backend", "megatron", "--num-rollout", "1"),
            *("--rollout-batch-size", "8", "--n-samples-per-prompt", "2", "--global-batch-size", "16"),
            *("--use-dynamic-batch-size", "--max-tokens-per-gpu", "2048", "--rollout-temperature", "1.0"),
            *("--advantage-estimator", "grpo", "--lr", "1e-6", "--bf16"),
            *("--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)),
            *("--context-parallel-size", str(cp)),
        ]
    )


def _samples(vocab: int):
    """16 samples (8 groups of 2) of 512 tokens with 96-475 response tokens, rewards 0/1 (never equal in a group).

    Response lengths differ so that the per-sample and the per-token loss differ.
    """
    import torch

    from slime_core.sample import Sample, Status

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(16):
        tokens = torch.randint(100, vocab - 100, (512,), generator=g).tolist()
        response = 96 + (i * 53) % 380
        out.append(
            Sample(
                index=i, group_index=i // 2, prompt="", tokens=tokens, response_length=response,
                loss_mask=[1] * response, reward=float((i + i // 2) % 2), status=Status.COMPLETED,
            )
        )  # fmt: skip
    return out


def worker(model_dir: str, tp: int, pp: int, cp: int, out_path: str) -> None:
    """One rank: both loss modes from the same initial weights; the last stage's rank 0 writes the result."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    from megatron.core import parallel_state

    from slime_core.train_data import build_rollout_batches
    from slime_train_megatron.backend import MegatronTrainBackend

    cfg = _config(model_dir, tp, pp, cp)
    backend = MegatronTrainBackend()
    backend.init(cfg, with_ref=False)
    dp = parallel_state.get_data_parallel_world_size()
    result: dict = {"layout": [tp, pp, cp], "dp": dp}
    start = backend.weights.snapshot()
    for mode, per_token in LOSS_MODES.items():
        backend.cfg = cfg.model_copy(update={"calculate_per_token_loss": per_token})  # read by train() per call
        batch = build_rollout_batches(backend.cfg, _samples(backend.model_args.vocab_size), dp_size=dp)[
            parallel_state.get_data_parallel_rank()
        ]
        t0 = time.perf_counter()
        lp = backend.compute_log_probs(batch)
        metrics = backend.train(0, batch)
        torch.cuda.synchronize()
        result[mode] = {
            "loss": metrics["train/loss"],
            "pg_loss": metrics["train/pg_loss"],
            "grad_norm": metrics["train/grad_norm"],
            "mean_log_prob": float(torch.cat(lp).mean()),
            "seconds": time.perf_counter() - t0,
        }
        backend.weights.restore(start)
        backend.optimizer.reload_model_params()
    result["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    ps = parallel_state
    reporter = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
    if reporter and ps.get_data_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0:
        pathlib.Path(out_path).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(model_dir: pathlib.Path, layout: tuple[int, int, int], log_dir: pathlib.Path, timeout_s: int) -> dict:
    """Spawns TP·PP·CP ranks of `worker`; returns its result or `{"error": ...}` with the log tail."""
    tp, pp, cp = layout
    world = tp * pp * cp
    out = log_dir / f"result-{tp}-{pp}-{cp}.json"
    out.unlink(missing_ok=True)
    port = _free_port()
    procs, logs = [], []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        log = open(log_dir / f"rank{rank}-{tp}-{pp}-{cp}.log", "w")
        logs.append(log)
        cmd = [sys.executable, __file__, "--worker", str(model_dir), str(tp), str(pp), str(cp), str(out)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_s
    # A rank that fails leaves the others blocked in a collective: stop them all at the first failure.
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
            for q in procs:
                q.kill()
            break
        time.sleep(0.5)
    for p in procs:
        p.wait()
    for log in logs:
        log.close()
    if all(p.returncode == 0 for p in procs) and out.exists():
        return json.loads(out.read_text())
    failed = next((r for r, p in enumerate(procs) if p.returncode not in (0, -9)), 0)
    tail = (log_dir / f"rank{failed}-{tp}-{pp}-{cp}.log").read_text()[-3000:]
    return {"layout": list(layout), "error": f"exit codes {[p.returncode for p in procs]}", "log_tail": tail}


def main(argv: list[str] | None = None) -> dict:
    """Runs every layout in turn, then compares each with the first."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--layouts", nargs="+", default=["1,1,1", "2,1,1", "1,2,1", "1,1,2"])
    p.add_argument("--timeout", type=int, default=300, help="seconds per layout")
    p.add_argument("--log-dir", default=os.environ.get("BENCH_LOG_DIR", "/tmp/slime-bench-logs"))
    a = p.parse_args(argv)
    _common.setup_logging()
    import torch

    log_dir = pathlib.Path(a.log_dir) / "megatron-parallel"
    log_dir.mkdir(parents=True, exist_ok=True)
    model_dir, write_s = _common.ensure_model(a.preset, a.model_root)
    try:
        import transformer_engine  # noqa: F401

        has_te = True
    except ImportError:
        has_te = False
    results = []
    for spec in a.layouts:
        tp, pp, cp = (int(x) for x in spec.split(","))
        if tp * pp * cp > torch.cuda.device_count():
            results.append({"layout": [tp, pp, cp], "skipped": f"needs {tp * pp * cp} GPUs"})
        elif cp > 1 and not has_te:
            results.append({"layout": [tp, pp, cp], "skipped": "CP needs Transformer Engine (not installed)"})
        else:
            t0 = time.perf_counter()
            results.append(run_layout(model_dir, (tp, pp, cp), log_dir, a.timeout))
            results[-1]["wall_s"] = time.perf_counter() - t0
        _common.logger.info("layout %s: %s", spec, json.dumps(results[-1])[:600])
    ok = [r for r in results if "per_sample" in r]
    if ok:
        base = ok[0]
        for r in ok[1:]:
            r["rel_diff"] = {
                mode: {k: abs(r[mode][k] - base[mode][k]) / max(abs(base[mode][k]), 1e-12)
                       for k in ("loss", "pg_loss", "grad_norm", "mean_log_prob")}
                for mode in LOSS_MODES
            }  # fmt: skip
    return _common.emit("megatron_parallel", {"preset": a.preset, "layouts": results, "checkpoint_write_s": write_s})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        main()
