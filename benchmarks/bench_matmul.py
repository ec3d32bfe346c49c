"""Measured dense matmul rate, the MFU ceiling: `python3 benchmarks/bench_matmul.py [--size 8192] [--device cuda]`.

C = A·B with A, B of shape [size, size] in bf16 (random normal data: zeros run faster, METHOD.md), timed with
CUDA events after 3 warm-up products; 5 timed products, median reported. FLOPs = 2·size³.
Budget on an H200: < 5 s.
"""

from __future__ import annotations

import argparse
import time

import _common  # sibling module: a script's own directory is first on sys.path


def main(argv: list[str] | None = None) -> dict:
    """Parses flags, times the products, emits the JSON line."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    _common.setup_logging()
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA GPU is visible")
    dtype = getattr(torch, a.dtype)
    gen = torch.Generator(device=a.device).manual_seed(0)
    x = torch.randn(a.size, a.size, device=a.device, dtype=dtype, generator=gen)
    y = torch.randn(a.size, a.size, device=a.device, dtype=dtype, generator=gen)
    out = torch.empty(a.size, a.size, device=a.device, dtype=dtype)
    for _ in range(a.warmup):
        torch.matmul(x, y, out=out)
    times = []
    for _ in range(a.repeats):
        if a.device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(x, y, out=out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            torch.matmul(x, y, out=out)
            times.append(time.perf_counter() - t0)
    # Sanity: a slice against an fp32 product (bf16 operands → relative error ~1e-3..1e-2).
    ref = x[:64].float() @ y.float()
    rel = float((out[:64].float() - ref).norm() / ref.norm())
    if not rel < 2e-2:
        raise RuntimeError(f"matmul result is wrong: relative error {rel:.3g}")
    flops = 2.0 * a.size**3
    t = _common.median(times)
    return _common.emit("matmul", {
        "device": _common.device_name(a.device), "size": a.size, "dtype": a.dtype, "repeats": a.repeats,
        "seconds_median": t, "seconds_all": times, "tflops": flops / t / 1e12, "rel_err": rel,
    })  # fmt: skip


if __name__ == "__main__":
    main()
