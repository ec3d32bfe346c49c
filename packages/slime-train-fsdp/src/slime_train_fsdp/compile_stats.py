"""What torch.compile did in this process: seconds spent, graphs made, cache lookups, and which frames it compiled.

Read around a step (`FSDPTrainBackend.train`) and the compile warm-up's phases (`compile_warmup.run_warm_up`), so a
log line can say whether a step loaded the warm-up's graphs from inductor's caches or compiled one itself, and which.
All values come from torch's own bookkeeping (`torch._dynamo.utils`: `calculate_time_spent`, `counters`,
`get_compilation_metrics`); nothing here changes what is compiled.
"""

from __future__ import annotations

import os
import time

__all__ = ["cache_counts", "compile_seconds", "compiled_frames", "compiled_graphs", "now_us"]


def compile_seconds() -> float:
    """Seconds this process has spent in torch.compile so far (dynamo tracing and backend compilation)."""
    from torch._dynamo.utils import calculate_time_spent

    return float(calculate_time_spent().get("total_wall_time", 0.0))


def compiled_graphs() -> int:
    """Graphs torch.compile has produced in this process (one per grad mode when nothing recompiles)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def cache_counts() -> dict[str, int]:
    """This process's torch.compile cache lookups so far: inductor's FX graph cache and the AOT autograd cache.

    A graph the compile warm-up left in the on-disk caches is a hit in both; a miss means it was compiled here.
    """
    from torch._dynamo.utils import counters

    return {
        "fx_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fx_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "aot_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "aot_miss": int(counters["aot_autograd"]["autograd_cache_miss"]),
    }


def now_us() -> int:
    """Wall-clock microseconds, on the clock of torch's compile records (`compiled_frames`' `since_us`)."""
    return time.time_ns() // 1000


def compiled_frames(since_us: int) -> list[str]:
    """One line per frame dynamo compiled since `since_us` (`now_us()`), for a log.

    Each: `function (file:line) S s (dynamo a, AOT b, inductor c, triton d s), AOT h hit / m miss, FX h hit / m
    miss[, recompiled: reason][, restarted after t s (why)]`: the parenthesis gives torch's cumulative timers of
    the compile (nested: the AOT time includes inductor's) where it kept them; "restarted" means dynamo threw a
    first attempt away. The backward graph of a frame is compiled on its first backward and listed as its own
    entry (`backward of ...`). The reason is dynamo's failed guard (first 200 characters) when the frame had been
    compiled before: what differs from the graph already made (a shape, a dtype, a Python value).
    """
    from torch._dynamo.utils import get_compilation_metrics

    lines = []
    for m in get_compilation_metrics():
        if (m.start_time_us or 0) < since_us:
            continue
        where = f"{os.path.basename(m.co_filename or '?')}:{m.co_firstlineno}" if m.co_filename else "?"
        name = m.co_name or "?"
        seconds = (m.duration_us or 0) / 1e6
        reason = getattr(m, "recompile_reason", None)  # absent in torch before 2.7
        restarts = ", ".join(sorted(r.split(".")[-1].rstrip("'>") for r in (m.restart_reasons or ())))
        parts = [f"{label} {us / 1e6:.1f}" for label, us in (
            ("dynamo", m.dynamo_cumulative_compile_time_us), ("AOT", m.aot_autograd_cumulative_compile_time_us),
            ("inductor", m.inductor_cumulative_compile_time_us), ("triton", getattr(m, "triton_compile_time_us", None)),
        ) if us]  # fmt: skip
        split = f" ({', '.join(parts)} s)" if parts else ""
        lines.append(
            f"{'backward of ' if m.is_forward is False else ''}{name} ({where}) {seconds:.1f} s{split}, "
            f"AOT {m.aotautograd_local_cache_hit_count or 0} hit / {m.aotautograd_local_cache_miss_count or 0} miss, "
            f"FX {m.inductor_fx_local_cache_hit_count or 0} hit / {m.inductor_fx_local_cache_miss_count or 0} miss"
            + (f", recompiled: {' '.join(str(reason).split())[:200]}" if reason else "")
            + (f", restarted after {m.dynamo_time_before_restart_s or 0:.1f} s ({restarts})" if restarts else "")
        )
    return lines
