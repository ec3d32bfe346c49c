"""Helpers shared by the benchmark scripts: model dirs, JSON result lines, FLOP counts, timing.

Every benchmark prints exactly one JSON line on stdout (its result) and, when ``$BENCH_RESULTS`` names a
file, appends the same line to it (the GPU session collects all of them in ``$OUT/results.jsonl``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from slime_core.flops import transformer_flops  # noqa: F401 - the benchmarks' FLOPs (`_common.transformer_flops`)

REPO = pathlib.Path(__file__).resolve().parents[1]
TOKENIZER_DIR = pathlib.Path(os.environ.get("SLIME_QWEN3_TOKENIZER", REPO / "tests" / "fixtures" / "qwen3-tokenizer"))
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"

logger = logging.getLogger("bench")


def setup_logging() -> None:
    """INFO logs on stderr, so that stdout carries only the JSON result line."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the log


def preset_config(preset: str):
    """`Qwen3Config` of a make_model preset (qwen3-tiny, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b)."""
    import slime_make_model  # imported here: transformers loads slowly and not every benchmark needs it

    return slime_make_model.preset_config(preset)


def ensure_model(preset: str, root: str | os.PathLike, dtype: str = "bfloat16") -> tuple[pathlib.Path, float]:
    """Returns `(dir, seconds spent writing)`: `<root>/<preset>-<dtype>`, written once with make_model.

    Raises:
        ValueError: unknown preset.
    """
    out = pathlib.Path(root) / f"{preset}-{dtype}"
    if (out / "config.json").is_file():
        return out, 0.0
    start = time.perf_counter()
    import slime_make_model

    slime_make_model.make_model(preset, out, TOKENIZER_DIR, dtype, 0, 4.0)
    seconds = time.perf_counter() - start
    logger.info("wrote %s in %.1f s", out, seconds)
    return out, seconds


def git_commit() -> str:
    """Short commit of the checkout: `$BENCH_COMMIT` when set (a copied tree's .git can be stale), else git's."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(device: str) -> str:
    """GPU name (e.g. "NVIDIA H200") or "cpu"."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


def emit(bench: str, result: dict[str, Any]) -> dict[str, Any]:
    """Prints one JSON line (with bench, UTC time, commit) and appends it to `$BENCH_RESULTS` when set."""
    line = {"bench": bench, "time_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": git_commit(), **result}  # fmt: skip
    text = json.dumps(line, sort_keys=False, default=str)
    print(text, flush=True)  # the result line is the script's output
    target = os.environ.get("BENCH_RESULTS")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return line


def median(xs: list[float]) -> float:
    """Median (the middle of ≥3 repeats is what the tables report)."""
    return float(statistics.median(xs))


def sync(device: str) -> None:
    """Waits for queued device work (no-op on CPU), so host clocks measure finished work."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Runs `fn` between two device syncs; returns (seconds, fn's result)."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def time_train(backend: Any, batch: Any, device: str, repeats: int) -> tuple[float, list[float], dict, float | None]:
    """One warm-up `backend.train()`, then `repeats` timed calls on the same batch.

    Returns:
        (warm-up seconds, timed seconds, the last call's metrics, peak GiB allocated during the timed calls or
        None on CPU).

    Raises:
        RuntimeError: a metric is NaN (a broken step must not pass as a fast one).
    """
    import torch

    warm_s, metrics = timed(lambda: backend.train(0, batch), device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for r in range(repeats):
        t, metrics = timed(lambda r=r: backend.train(r + 1, batch), device)
        times.append(t)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    for k, v in metrics.items():
        if v != v:
            raise RuntimeError(f"train() returned NaN for {k}")
    return warm_s, times, metrics, peak


#: Chrome-trace categories of work on the device (kineto's names).
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def gap_attribution(events: list[dict[str, Any]], min_gap_us: float = 20.0, top: int = 30) -> dict[str, Any]:
    """Where the host was while the device sat idle: GPU gaps attributed to the Python frames and CPU ops around them.

    A gap is a stretch between merged device intervals (kernels, copies, memsets) of at least `min_gap_us`. Each
    host event is charged its overlap with the gaps: an inclusive figure, so a frame's callers carry its time too
    (read the list as a call tree cut into lines). Python frames are those of the thread that ran the most Python
    (the training loop; backward's ops run on autograd's thread and show under `cpu_op`), clipped to their callers.

    Args:
        events: `traceEvents` of a `torch.profiler` chrome trace (`ts`/`dur` in µs).
        min_gap_us: shorter idle stretches (launch latency between back-to-back kernels) are not counted.
        top: names kept per list.

    Returns:
        `gap_ms` (sum of the counted gaps), `gaps` (their number), `device_busy_ms`, and `python` / `cpu_op` /
        `runtime`: `[name, inclusive gap ms]` lists, largest first.
    """
    import bisect

    spans = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in _DEVICE_CATS
    )
    busy: list[list[float]] = []
    for start, end in spans:
        if busy and start <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], end)
        else:
            busy.append([start, end])
    gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:], strict=False) if b[0] - a[1] >= min_gap_us]
    starts = [g[0] for g in gaps]

    def overlap(lo: float, hi: float) -> float:
        i, total = max(bisect.bisect_right(starts, lo) - 1, 0), 0.0
        while i < len(gaps) and gaps[i][0] < hi:
            total += max(0.0, min(hi, gaps[i][1]) - max(lo, gaps[i][0]))
            i += 1
        return total

    by_cat: dict[str, dict[str, float]] = {"python_function": {}, "cpu_op": {}, "cuda_runtime": {}}
    for e in events:
        table = by_cat.get(e.get("cat", ""))
        if table is None or e.get("ph") != "X" or not gaps or e.get("cat") == "python_function":
            continue
        ts = float(e["ts"])
        charged = overlap(ts, ts + float(e.get("dur", 0.0)))
        if charged > 0:
            table[e["name"]] = table.get(e["name"], 0.0) + charged
    for name, lo, hi in _main_thread_frames(events):
        charged = overlap(lo, hi) if gaps else 0.0
        if charged > 0:
            by_cat["python_function"][name] = by_cat["python_function"].get(name, 0.0) + charged

    def ranked(table: dict[str, float]) -> list[list[Any]]:
        return [[name[:160], round(us / 1e3, 2)] for name, us in sorted(table.items(), key=lambda kv: -kv[1])[:top]]

    return {
        "gap_ms": round(sum(b - a for a, b in gaps) / 1e3, 2),
        "gaps": len(gaps),
        "device_busy_ms": round(sum(b - a for a, b in busy) / 1e3, 2),
        "python": ranked(by_cat["python_function"]),
        "cpu_op": ranked(by_cat["cpu_op"]),
        "runtime": ranked(by_cat["cuda_runtime"]),
    }


def _main_thread_frames(events: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """`(name, start, end)` of the Python frames of the thread that ran the most Python, each clipped to its caller.

    The Python tracer leaves some C calls open (their end is the profile's end); clipping every frame to the one it
    started in keeps the list a call tree, so no frame is charged time outside its caller's.
    """
    frames = [e for e in events if e.get("ph") == "X" and e.get("cat") == "python_function"]
    if not frames:
        return []
    per_tid: dict[Any, float] = {}
    for e in frames:
        per_tid[e.get("tid")] = per_tid.get(e.get("tid"), 0.0) + float(e.get("dur", 0.0))
    main = max(per_tid, key=per_tid.__getitem__)
    ordered = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"]) for e in frames if e.get("tid") == main
    )
    out, ends = [], []  # ends: the open callers' (clipped) ends
    for lo, hi, name in sorted(ordered, key=lambda f: (f[0], -(f[1] - f[0]))):
        while ends and ends[-1] <= lo:
            ends.pop()
        if ends:
            hi = min(hi, ends[-1])
        out.append((name, lo, hi))
        ends.append(hi)
    return out


def profile_gaps(fn: Callable[[], Any], top: int = 30) -> dict[str, Any]:
    """Runs `fn` once under `torch.profiler` with Python stacks (CUDA) and attributes the GPU's idle gaps.

    The Python tracer slows the host (every frame is recorded), so the gaps are larger than in a plain run: read
    the shares, not the milliseconds. See `gap_attribution` for the fields; `wall_ms` is added.
    """
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    sync("cuda")
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        fn()
        sync("cuda")
    wall_ms = (time.perf_counter() - start) * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        trace = pathlib.Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    return {"wall_ms": round(wall_ms, 2), **gap_attribution(events, top=top)}


if __name__ == "__main__":
    # `python3 benchmarks/_common.py PRESET ROOT [DTYPE]` prints the checkpoint dir, writing it once (bench_e2e.sh).
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: _common.py PRESET MODEL_ROOT [DTYPE (default bfloat16)]")
    print(ensure_model(*sys.argv[1:])[0])


# Kernel-name fragments -> the category a profile summary puts them in (first match wins).
_KERNEL_CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "varlen")),
    ("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "matmul")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("communication", ("nccl", "allgather", "reduce_scatter", "all_reduce")),
    ("copy/cast", ("copy", "memcpy", "memset", "cast", "to_copy")),
    ("fused (inductor)", ("triton_",)),
)


def _category(name: str) -> str:
    low = name.lower()
    for category, keys in _KERNEL_CATEGORIES:
        if any(k in low for k in keys):
            return category
    return "other"


def profile_summary(fn: Callable[[], Any], top: int = 12) -> dict[str, Any]:
    """Runs `fn` once under `torch.profiler` (CUDA) and summarizes where the GPU time went.

    Returns:
        `wall_ms` (host clock around `fn`, device-synchronized), `gpu_busy_ms` (union of kernel intervals on
        the device: the rest is idle time from launch overhead, host syncs and CPU work), `kernel_ms` by
        category (attention, gemm, optimizer, communication, copy/cast, fused (inductor), other; sums of
        kernel durations, so overlapping streams can exceed busy time), and the `top` kernels by total time
        as `[name (first 80 chars), calls, total ms]`.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    sync("cuda")
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync("cuda")
    wall_ms = (time.perf_counter() - start) * 1e3
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    intervals = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy_us, cur_start, cur_end = 0.0, None, None
    for s, e in intervals:
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                busy_us += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        busy_us += cur_end - cur_start
    by_cat: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        dur_ms = (e.time_range.end - e.time_range.start) / 1e3
        by_cat[_category(e.name)] = by_cat.get(_category(e.name), 0.0) + dur_ms
        entry = by_name.setdefault(e.name, [0, 0.0])
        entry[0] += 1
        entry[1] += dur_ms
    top_kernels = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "wall_ms": round(wall_ms, 2),
        "gpu_busy_ms": round(busy_us / 1e3, 2),
        "kernel_ms": {k: round(v, 2) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "top_kernels": [[name[:80], calls, round(ms, 2)] for name, (calls, ms) in top_kernels],
    }
