"""`compile_stats`: what torch.compile did, read from torch's own records (the warm-up and step log lines)."""

import torch

from slime_train_fsdp.compile_stats import cache_counts, compile_seconds, compiled_frames, compiled_graphs, now_us


def _scaled_tanh(x):
    return torch.tanh(x) * 2


def _shifted_exp(x):
    return torch.exp(x) - 1


def test_compiled_frames_lists_only_what_was_compiled_since_the_mark():
    torch.compile(_scaled_tanh, backend="eager")(torch.ones(3))
    mark, seconds, graphs = now_us(), compile_seconds(), compiled_graphs()
    torch.compile(_shifted_exp, backend="eager")(torch.ones(3))
    lines = compiled_frames(mark)
    assert len(lines) == 1 and lines[0].startswith("_shifted_exp (test_compile_stats.py:"), lines
    assert lines[0].endswith("AOT 0 hit / 0 miss, FX 0 hit / 0 miss"), lines  # the eager backend looks nothing up
    assert compile_seconds() > seconds and compiled_graphs() == graphs + 1
    assert compiled_frames(now_us()) == []


def test_cache_counts_start_from_torchs_counters():
    from torch._dynamo.utils import counters

    before = cache_counts()
    counters["inductor"]["fxgraph_cache_miss"] += 2
    counters["aot_autograd"]["autograd_cache_hit"] += 1
    after = cache_counts()
    assert {k: after[k] - before[k] for k in after} == {"fx_hit": 0, "fx_miss": 2, "aot_hit": 1, "aot_miss": 0}


def test_compiled_frames_names_the_guard_a_recompile_failed_on():
    torch._dynamo.reset()
    compiled = torch.compile(_scaled_tanh, backend="eager", dynamic=False)
    compiled(torch.ones(3))
    mark = now_us()
    compiled(torch.ones(5))  # a new static shape: dynamo's size guard fails and the frame compiles again
    lines = compiled_frames(mark)
    assert len(lines) == 1 and lines[0].startswith("_scaled_tanh ("), lines
    assert "recompiled: " in lines[0] and "size" in lines[0], lines


def _normed(x, eps):
    return torch.nn.functional.rms_norm(x, (3,), eps=eps)


def test_compiled_frames_names_a_restarted_analysis():
    torch._dynamo.reset()
    mark = now_us()
    with torch._dynamo.config.patch(specialize_float=False):  # torch's default: a float input restarts the analysis
        torch.compile(_normed, dynamic=True, backend="aot_eager")(torch.ones(2, 3), 1e-6)
    lines = compiled_frames(mark)
    assert len(lines) == 1 and "restarted after " in lines[0] and "(TensorifyScalarRestartAnalysis)" in lines[0], lines
