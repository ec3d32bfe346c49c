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
    a = p.parse_args(argv)
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
        result["final_weight_version"] = str(version)
        result["greedy_original"] = original
        result["greedy_failures"] = failures
        result["greedy_checked"] = not failures
    return _common.emit("weight_sync", result)


if __name__ == "__main__":
    main()
