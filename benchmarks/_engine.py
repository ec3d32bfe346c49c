"""One rollout engine for the benchmarks: start it (launch_engines) or attach to a running one.

`python3 benchmarks/_engine.py --preset qwen3-0.6b --url-file F [--engine sglang]` starts one engine,
writes its URL to F (atomically) once it is healthy, and serves until SIGTERM/SIGINT; gpu_session.sh
uses it so that several benchmarks share one SGLang start (≈ 60–100 s each).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import _common  # sibling module: a script's own directory is first on sys.path


def engine_args(
    kind: str, model_dir: Path, *, mem_fraction: float, max_bs: int, memory_saver: bool = False,
    max_total_tokens: int | None = None, extra: dict[str, str | bool] | None = None,
):  # fmt: skip
    """Run-config fields `launch_engines` reads, for one engine on GPU 0 (sglang) or the CPU reference.

    `extra`: more SGLang server arguments by field name (e.g. `{"enable_fp32_lm_head": True}`); SGLang only.
    """
    if kind == "sglang":
        # Decode CUDA graphs on (≈10× faster), no prefill graph capture (saves ≈ 40 s): shared/device/README.md.
        sglang_args = {"cuda_graph_backend_prefill": "disabled", "cuda_graph_max_bs_decode": str(max_bs)}
        if max_total_tokens:  # a fixed KV cache: the engine's memory no longer depends on what else runs
            sglang_args["max_total_tokens"] = str(max_total_tokens)
        sglang_args.update(extra or {})
    else:
        sglang_args = {"dtype": "float32", "max_running_requests": str(max_bs)}
    from slime_core.config import SlimeArgs

    return SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "rollout_engine": kind, "hf_checkpoint": str(model_dir),
        "seed": 1234, "sglang_args": sglang_args, "rollout_num_gpus_per_engine": 1, "offload_rollout": memory_saver,
    })  # fmt: skip


@contextlib.contextmanager
def engine(
    kind: str, model_dir: Path, *, url: str | None, log_dir: str | None, mem_fraction: float = 0.3,
    max_bs: int = 256, memory_saver: bool = False, max_total_tokens: int | None = None,
    extra: dict[str, str | bool] | None = None,
) -> Iterator[tuple[str, float]]:  # fmt: skip
    """Yields `(url, startup seconds)`: the given `url` (0 s), or a freshly launched engine shut down on exit."""
    if url:
        yield url, 0.0
        return
    import time

    from slime_rollout.engines.launch import launch_engines

    args = engine_args(kind, model_dir, mem_fraction=mem_fraction, max_bs=max_bs, memory_saver=memory_saver,
                       max_total_tokens=max_total_tokens, extra=extra)  # fmt: skip
    start = time.perf_counter()
    with launch_engines(
        args, num_engines=1, gpus_per_engine=1, startup_timeout_s=600, log_dir=log_dir, mem_fraction_static=mem_fraction
    ) as group:
        yield group.urls[0], time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    """Serves one engine until SIGTERM."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--engine", default="sglang", choices=["sglang", "reference"])
    p.add_argument("--mem-fraction", type=float, default=0.3)
    p.add_argument("--max-bs", type=int, default=256)
    p.add_argument("--max-total-tokens", type=int, default=None, help="cap the KV cache (tokens)")
    p.add_argument("--url-file", required=True)
    p.add_argument("--log-dir", default=None)
    a = p.parse_args(argv)
    _common.setup_logging()
    model_dir, _ = _common.ensure_model(a.preset, a.model_root)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with engine(
        a.engine,
        model_dir,
        url=None,
        log_dir=a.log_dir,
        mem_fraction=a.mem_fraction,
        max_bs=a.max_bs,
        max_total_tokens=a.max_total_tokens,
    ) as (  # fmt: skip
        url,
        startup_s,
    ):
        tmp = Path(a.url_file + ".tmp")
        tmp.write_text(url + "\n")
        os.replace(tmp, a.url_file)
        _common.logger.info("engine %s ready in %.1f s (model %s)", url, startup_s, model_dir)
        stop.wait()


if __name__ == "__main__":
    main()
