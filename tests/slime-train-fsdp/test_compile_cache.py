"""`slime_train_fsdp.compile_cache`: torch.compile's artifacts beside the checkpoints (issue 26)."""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from slime_train_fsdp.compile_cache import CACHE_FILE, load_compile_cache, save_compile_cache


def test_nothing_compiled_writes_nothing_and_keeps_an_existing_file(tmp_path):
    from torch.compiler._cache import CacheArtifactManager

    (tmp_path / CACHE_FILE).write_bytes(b"from an earlier save")
    # torch's saves are cumulative over the process: an earlier compile in this xdist worker would be saved again,
    # so the process-fresh state is set up explicitly (the CI failure at af5b7de: 287,025 bytes written).
    with CacheArtifactManager.with_fresh_cache():
        assert save_compile_cache(tmp_path) == 0
    assert (tmp_path / CACHE_FILE).read_bytes() == b"from an earlier save"
    assert not list(tmp_path.glob("*.tmp"))


def test_missing_file_is_not_an_error(tmp_path):
    assert load_compile_cache(tmp_path) is False


def test_unreadable_file_warns_and_the_run_goes_on(tmp_path, caplog):
    (tmp_path / CACHE_FILE).write_bytes(b"\x00not a torch cache")
    with caplog.at_level(logging.WARNING, logger="slime_train_fsdp.compile_cache"):
        assert load_compile_cache(tmp_path) is False
    assert CACHE_FILE in caplog.text and "the first step compiles" in caplog.text


_ROUND_TRIP = textwrap.dedent("""
    import sys, torch
    from torch._dynamo.utils import counters
    from slime_train_fsdp.compile_cache import load_compile_cache, save_compile_cache
    mode, folder = sys.argv[1], sys.argv[2]
    if mode == "load":
        assert load_compile_cache(folder)
    layer = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256)).cuda()
    layer.compile(dynamic=True)
    x = torch.randn(300, 256, device="cuda", requires_grad=True)
    layer(x).square().mean().backward()
    if mode == "save":
        assert save_compile_cache(folder) > 0
    print("HITS", counters["inductor"]["fxgraph_cache_hit"], "MISSES", counters["inductor"]["fxgraph_cache_miss"])
""")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (inductor's GPU artifacts)")
def test_artifacts_saved_by_one_machine_are_hits_on_a_fresh_one(tmp_path):
    # Two processes with separate inductor cache directories stand for two machines.
    def run(mode: str, cache_dir: pathlib.Path) -> str:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "TRITON_CACHE_DIR": str(cache_dir / "triton")}
        done = subprocess.run([sys.executable, "-c", _ROUND_TRIP, mode, str(tmp_path)], env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.strip().splitlines()[-1]

    first = run("save", tmp_path / "machine_a").split()
    assert first[1] == "0" and int(first[3]) > 0  # compiled from scratch
    second = run("load", tmp_path / "machine_b").split()
    assert int(second[1]) > 0 and second[3] == "0"  # every graph came from the saved artifacts
