"""`compile_warmup_head.warm_up_head`: the compiled log-prob head's graphs as the real step uses them (issue 26).

On one H100 the first step after the warm-up still spent 11 s in torch.compile. On CPU (with the `fused` head
compiled, as on CUDA) the real step after the old warm-up missed inductor's FX graph cache 3 times, all in the
head: its two forward graphs were guarded on the stand-in's 256-token vocabulary (`V <= 4096`), and its backward
was warmed with an entropy gradient that a run with `--entropy-coef 0` never has. The decoder layers hit.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

_COMMON = pathlib.Path(__file__).with_name("_worker_common.py")

# argv: phase (warm | real), checkpoint, _worker_common.py, config overrides (JSON). Prints inductor's counters.
_STEP = textwrap.dedent("""
    import importlib.util, json, sys
    import torch, torch.distributed as dist
    from torch._dynamo.utils import counters
    import slime_core.algorithms.fused_head as fused_head

    # CUDA's behaviour on CPU: the fused head's elementwise functions run compiled.
    fused_head._maybe_compiled = lambda fn, device, compiled: fused_head._compiled(fn) if compiled else fn
    spec = importlib.util.spec_from_file_location("slime_fsdp_warmup_head_workers", sys.argv[3])
    workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workers)
    import dataclasses
    from slime_core.batch import RolloutBatch
    from slime_train_fsdp import FSDPTrainBackend
    from slime_train_fsdp.compile_warmup_head import warm_up_head
    from slime_train_fsdp.packing import ForwardOptions, forward_options, install_response_forward

    cfg = workers.make_args(sys.argv[2], **json.loads(sys.argv[4]))
    if sys.argv[1] == "warm":
        vocab = int(json.load(open(sys.argv[2] + "/config.json"))["vocab_size"])
        warm_up_head(ForwardOptions(head="fused", compile_head=True), vocab_size=vocab,
                        device=torch.device("cpu"), cfg=cfg)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        backend = FSDPTrainBackend()
        backend.init(cfg, with_ref=False)  # eager layers on CPU; only the head compiles
        install_response_forward(backend.model, dataclasses.replace(forward_options(backend.model),
                                                                    compile_head=True))
        g = torch.Generator().manual_seed(1)
        lengths = [(9, 5), (12, 7), (6, 11), (15, 4)]  # (prompt, response)
        tokens = [torch.randint(0, 1000, (p + r,), generator=g) for p, r in lengths]
        resp = [r for _, r in lengths]
        masks = [torch.ones(r) for r in resp]
        batch = RolloutBatch(tokens=tokens, response_lengths=resp, loss_masks=masks, rewards=[1.0, -1.0, 1.0, -1.0],
                             raw_rewards=[0.0] * 4, loss_denominators=[float(r) for r in resp],
                             micro_batches=[[[0, 1], [2, 3]]], sample_indices=[0, 1, 2, 3], step_sample_counts=[4],
                             step_token_counts=[float(sum(resp))])
        backend.compute_log_probs(batch)
        backend.train(0, batch)  # the real GRPO loss
    print(json.dumps(dict(counters["inductor"])), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()  # a live gloo group's threads could abort the interpreter's exit
""")


def _run(phase: str, ckpt: str, overrides: dict, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", _STEP, phase, ckpt, str(_COMMON), json.dumps(overrides)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_real_step_loads_the_heads_graphs_that_the_warm_up_compiled(tmp_path, make_tiny_qwen3):
    """After `warm_up_head` in one process, a fresh trainer's compute_log_probs + train() miss no FX graph.

    The trainer's vocabulary is Qwen3's 151936 (the stand-in's is 256); `--entropy-coef 0` (the default) detaches
    the entropy, so the head's backward has no entropy term. With 4-row chunks each micro-batch's 12 and 15
    response rows span 3 and 4 chunks: the later chunks' cotangents are slices at storage offsets ≥ 2, which
    dynamo guards on (on one H100 a 16-row, one-chunk warm-up left that backward graph to the first step). 4
    graphs: the no-grad forward, the training forward (with entropy), the backward at offset 0 and at ≥ 2.
    About 60 s on 2 CPU cores, most of it inductor's C++ build in the warm-up.
    """
    ckpt = str(make_tiny_qwen3(tmp_path / "m"))
    overrides = {"log_probs_head": "fused", "log_probs_chunk_size": 4, "entropy_coef": 0.0, "global_batch_size": 4}
    # VEC_ISA_OK=0: no SIMD probing, which builds and loads test programs in every process (~20 s on 2 loaded
    # cores); both processes use it, so the cache keys agree.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCHINDUCTOR_VEC_ISA_OK": "0",
           "RANK": "0", "WORLD_SIZE": "1"}  # fmt: skip
    warm = _run("warm", ckpt, overrides, env)
    assert warm.get("fxgraph_cache_miss") == 3 and not warm.get("fxgraph_cache_hit"), warm
    real = _run("real", ckpt, overrides, env)
    assert real.get("fxgraph_cache_hit") == 3 and not real.get("fxgraph_cache_miss"), real
