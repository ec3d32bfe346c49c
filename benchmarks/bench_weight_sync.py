"""Weight push into one rollout engine: DiskWeightUpdater vs TensorWeightUpdater.

`python3 benchmarks/bench_weight_sync.py --preset qwen3-0.6b --modes disk,tensor [--repeats 3]
[--engine sglang|reference] [--engine-url URL] [--device cuda|cpu]`

The benchmark process loads the same checkpoint (bf16 on GPU) and pushes named HF tensors in 512 MiB
buckets (`--bucket-mib`). Each repeat pushes a perturbed copy (w + N(0, 0.02²), a new weight_version) and
then the originals (another version), so every push changes the engine's weights and the engine ends
with the checkpoint it started with. Checked: the engine reports each version, and the greedy
continuation of a fixed prompt differs after the perturbed push and equals the original after the
restore (mismatches are listed in `greedy_failures`; a wrong weight_version fails the script).
Reported per mode: median seconds over 2·repeats pushes, GB/s of
bf16 payload (bytes of the pushed tensors / seconds). Disk mode writes under `--disk-dir` (local /tmp).
Budget on an H200 (engine already up): 0.6B ≈ 40 s, 4B ≈ 120 s; + 60–100 s when it starts its own engine.
Without `--engine-url` it starts one engine (no memory saver: torch_memory_saver is not staged there).

`--weight-modes full,delta` adds `delta_vs_full`: per transport (`--modes`), the same sequence of `--repeats`
training-like steps (a `--frozen-fraction` of the tensors frozen, the others moved by `--step-rel`·|w|·N(0,1), cast
to the pushed dtype) pushed once with `--update-weight-mode full` and once with `delta` after one full push of the
checkpoint. Reported per (transport, mode): median seconds per push, median bytes on the wire (the delta's
compressed payloads; the whole model for full), fraction of tensors sent, byte density, the first (full) push's
seconds and the trainer's base copy in GB. After every push `--check-tensors` sampled parameters are compared with
the engine's `/weights_checker` checksums (exact; failures listed in `delta_check_failures`). Delta over `tensor`
needs the reference engine (SGLang has no delta endpoint: reported as skipped). CPU:
`uv run python benchmarks/bench_weight_sync.py --device cpu --engine reference --preset qwen3-tiny --weight-modes
full,delta --repeats 3`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import _common  # sibling module: a script's own directory is first on sys.path
import _engine

PROMPT_IDS = [785, 6722, 315, 9625, 374]  # "The capital of France is" (Qwen3 tokenizer)


def buckets(named: list[tuple[str, object]], bucket_bytes: int) -> list[list[tuple[str, object]]]:
    """Greedy split into buckets of at most `bucket_bytes` (a larger tensor gets its own bucket)."""
    out, cur, size = [], [], 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > bucket_bytes:
            out.append(cur)
            cur, size = [], 0
        cur.append((name, t))
        size += nbytes
    if cur:
        out.append(cur)
    return out


async def greedy(url: str, n: int = 12) -> list[int]:
    """Greedy continuation ids of PROMPT_IDS (ignore_eos, so always `n` ids)."""
    from slime_rollout.engines.client import RolloutClient

    client = RolloutClient([url])
    try:
        reply = await client.generate({
            "input_ids": PROMPT_IDS, "return_logprob": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True},
        })  # fmt: skip
    finally:
        await client.aclose()
    return [int(e[1]) for e in reply["meta_info"]["output_token_logprobs"]]


async def weight_version(url: str) -> str | None:
    """The engine's reported weight_version."""
    from slime_rollout.engines.client import RolloutClient

    client = RolloutClient([url])
    try:
        return (await client.get_weight_versions())[0]
    finally:
        await client.aclose()


def _step(named: list, frozen: set[str], rel: float, seed: int, device: str) -> list:
    """One training-like step: unfrozen tensors move by `rel`·|w|·N(0, 1) (computed in fp32, cast back)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for n, t in named:
        if n not in frozen:
            w = t.float()
            t = (w + rel * w.abs() * torch.randn(w.shape, generator=g, device=device)).to(t.dtype)
        out.append((n, t))
    return out


def _checked_push(updater, url: str, weights: list, bucket_bytes: int, version: int, k: int, dtype, names) -> tuple:
    """Pushes `weights` as `version`; returns (seconds, mismatches of `k` sampled parameters vs the engine)."""
    from slime_rollout.engines.client import EngineClient
    from slime_rollout.weight_sync.check import PushChecksums, check_engines

    bucket_list = buckets(weights, bucket_bytes)
    sample = PushChecksums(k, seed=version, dtype=dtype, engine_names=names)
    for _ in sample.watch(bucket_list):  # hashed before the clock starts: the check is not part of the push
        pass
    t0 = time.perf_counter()
    updater.update(iter(bucket_list), str(version))
    seconds = time.perf_counter() - t0

    async def compare():
        engine = EngineClient(url, timeout=600.0)
        try:
            return await check_engines([engine], sample.checksums)
        finally:
            await engine.aclose()

    report = asyncio.run(compare())
    bad = list(report.mismatches) + ([f"v{version}: no tensor compared"] if not report.checked else [])
    return seconds, bad


def delta_vs_full(a, url: str, model_dir, named: list, transports: list[str], bucket_bytes: int, version: int,
                  result: dict) -> int:  # fmt: skip
    """Full vs delta pushes of the same step sequence per transport into `result["delta_vs_full"]`; returns the
    last weight_version. The engine ends with the checkpoint's weights (a final full push of `named`)."""
    import random

    from slime_core.config import ConfigError, SlimeArgs
    from slime_rollout.engines.client import EngineClient, RolloutClient
    from slime_rollout.weight_sync.check import engine_checksums, engine_weight_dtype
    from slime_rollout.weight_sync.delta_sync import make_delta_updater
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater, TensorWeightUpdater

    async def held_names():
        engine = EngineClient(url, timeout=600.0)
        try:
            return set().union(*(await engine_checksums(engine) or [{}]))
        finally:
            await engine.aclose()

    names = asyncio.run(held_names())
    frozen = set(random.Random(0).sample([n for n, _ in named], round(a.frozen_fraction * len(named))))
    out: dict = {"frozen_fraction": a.frozen_fraction, "step_rel": a.step_rel, "tensors": len(named)}
    failures: list[str] = []
    payload_bytes = sum(t.numel() * t.element_size() for _, t in named)
    for transport in transports:
        for mode in ("full", "delta"):
            fields = {"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": str(model_dir),
                      "rollout_engine": a.engine, "update_weight_disk_dir": a.disk_dir, "weight_sync": transport,
                      "update_weight_mode": mode, "rollout_num_gpus_per_engine": 1}  # fmt: skip
            if a.engine == "reference":
                fields["sglang_args"] = {"dtype": "float32"}  # what _engine starts it with
            try:
                cfg = SlimeArgs.from_dict(fields)
            except ConfigError as exc:
                out[f"{transport}_{mode}"] = {"skipped": str(exc)}
                continue
            client = RolloutClient([url])
            if mode == "delta":
                updater = make_delta_updater(cfg, client)
            else:
                updater = (DiskWeightUpdater if transport == "disk" else TensorWeightUpdater)(cfg, client)
            dtype = engine_weight_dtype(cfg)
            version += 1
            first_s, bad = _checked_push(updater, url, named, bucket_bytes, version, a.check_tensors, dtype, names)
            failures += bad
            weights, times, wire, sent, density = named, [], [], [], []
            for r in range(a.repeats):
                weights = _step(weights, frozen, a.step_rel, seed=100 + r, device=a.device)
                version += 1
                s, bad = _checked_push(updater, url, weights, bucket_bytes, version, a.check_tensors, dtype, names)
                failures += bad
                times.append(s)
                stats = getattr(updater, "delta_stats", None)
                wire.append(stats.wire_bytes if stats is not None else payload_bytes)
                sent.append(stats.num_sent / max(stats.num_tensors, 1) if stats is not None else 1.0)
                density.append(stats.changed_bytes / max(stats.total_bytes, 1) if stats is not None else 1.0)
            asyncio.run(client.aclose())
            base = getattr(updater, "base", None)
            out[f"{transport}_{mode}"] = {
                "seconds_median": _common.median(times), "seconds_all": times, "first_push_s": first_s,
                "wire_bytes_median": _common.median(wire), "sent_fraction_median": _common.median(sent),
                "density_median": _common.median(density),
                "trainer_base_gb": base.nbytes / 1e9 if base is not None else 0.0,
            }  # fmt: skip
            _common.logger.info("%s %s: %s", transport, mode, out[f"{transport}_{mode}"])
    # Back to the checkpoint, so that a shared engine serves what the next benchmark expects.
    version += 1
    restore_cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rollout_num_gpus_per_engine": 1,
                                       "update_weight_disk_dir": a.disk_dir})  # fmt: skip
    restorer = (TensorWeightUpdater if "tensor" in transports else DiskWeightUpdater)(restore_cfg, RolloutClient([url]))
    restorer.update(iter(buckets(named, bucket_bytes)), str(version))
    out["check_failures"] = failures
    result["delta_vs_full"] = out
    return version


def main(argv: list[str] | None = None) -> dict:
    """Parses flags, runs both modes, emits one JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--modes", default="disk,tensor")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bucket-mib", type=int, default=512)
    p.add_argument("--engine", default="sglang", choices=["sglang", "reference"])
    p.add_argument("--engine-url", default=None, help="use a running engine serving the same --preset")
    p.add_argument("--mem-fraction", type=float, default=0.3)
    p.add_argument("--disk-dir", default="/tmp/slime-bench-weight-sync")
    p.add_argument("--log-dir", default=os.environ.get("BENCH_LOG_DIR"))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--weight-modes", default="full", help="full, or full,delta to add the delta comparison")
    p.add_argument("--frozen-fraction", type=float, default=0.5, help="delta comparison: tensors left unchanged")
    p.add_argument("--step-rel", type=float, default=1e-3, help="delta comparison: relative size of a step")
    p.add_argument("--check-tensors", type=int, default=8, help="delta comparison: parameters checked per push")
    a = p.parse_args(argv)
    weight_modes = [m for m in a.weight_modes.split(",") if m]
    if not weight_modes or set(weight_modes) - {"full", "delta"}:
        p.error(f"--weight-modes {a.weight_modes!r}: choose from full,delta")
    modes = [m for m in a.modes.split(",") if m]
    if not modes or set(modes) - {"disk", "tensor"}:
        p.error(f"--modes {a.modes!r}: choose from disk,tensor")
    _common.setup_logging()
    import torch
    from transformers import AutoModelForCausalLM

    from slime_core.config import SlimeArgs
    from slime_rollout.engines.client import RolloutClient
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater, TensorWeightUpdater

    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA GPU is visible")
    model_dir, write_s = _common.ensure_model(a.preset, a.model_root)
    dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(a.device)
    named = [(n, t.detach()) for n, t in model.state_dict().items()]
    if model.config.tie_word_embeddings:
        named = [(n, t) for n, t in named if n != "lm_head.weight"]
    g = torch.Generator(device=a.device).manual_seed(1)
    perturbed = [(n, t + 0.02 * torch.randn(t.shape, generator=g, device=a.device, dtype=t.dtype)) for n, t in named]
    payload_bytes = sum(t.numel() * t.element_size() for _, t in named)
    bucket_bytes = a.bucket_mib * 2**20
    result: dict = {"device": _common.device_name(a.device), "preset": a.preset, "engine": a.engine,
                    "payload_gb": payload_bytes / 1e9, "bucket_mib": a.bucket_mib, "repeats": a.repeats,
                    "checkpoint_write_s": write_s}  # fmt: skip
    with _engine.engine(a.engine, model_dir, url=a.engine_url, log_dir=a.log_dir, mem_fraction=a.mem_fraction) as (
        url,
        startup_s,
    ):
        result["engine_startup_s"] = startup_s
        original = asyncio.run(greedy(url))
        version, failures = 0, []
        for mode in modes:
            client = RolloutClient([url])
            upd_args = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": str(model_dir),
                                            "update_weight_disk_dir": a.disk_dir, "weight_sync": mode,
                                            "rollout_num_gpus_per_engine": 1})  # fmt: skip
            updater = (DiskWeightUpdater if mode == "disk" else TensorWeightUpdater)(upd_args, client)
            times = []
            for _ in range(a.repeats):
                for weights, expect_original in ((perturbed, False), (named, True)):
                    version += 1
                    _common.sync(a.device)
                    t0 = time.perf_counter()
                    updater.update(iter(buckets(weights, bucket_bytes)), str(version))
                    times.append(time.perf_counter() - t0)
                    got_version = asyncio.run(weight_version(url))
                    if got_version != str(version):
                        raise RuntimeError(f"{mode}: engine reports weight_version {got_version!r}, pushed {version}")
                    out = asyncio.run(greedy(url))
                    if (out == original) != expect_original:
                        # Recorded, not fatal: one GPU session must not lose the timings to a flaky check.
                        what = "restored" if expect_original else "perturbed"
                        failures.append(f"{mode} v{version}: greedy after the {what} push {out}, original {original}")
                        _common.logger.error(failures[-1])
            asyncio.run(client.aclose())
            t = _common.median(times)
            result[mode] = {"seconds_median": t, "seconds_all": times, "gb_per_s": payload_bytes / 1e9 / t}
        if "delta" in weight_modes:
            version = delta_vs_full(a, url, model_dir, named, modes, bucket_bytes, version, result)
            out = asyncio.run(greedy(url))
            if out != original:
                failures.append(f"after the delta comparison's restore: greedy {out}, original {original}")
        result["final_weight_version"] = str(version)
        result["greedy_original"] = original
        result["greedy_failures"] = failures
        result["greedy_checked"] = not failures
    return _common.emit("weight_sync", result)


if __name__ == "__main__":
    main()
