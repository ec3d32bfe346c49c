"""How the FSDP backend's layers run: the compile scenario (`compile`, `compile_gpu`: compiled decoder layers over
micro-batches whose sequence count and lengths vary, as dynamic batching feeds them; `make_args` is
`_worker_common.make_args`) and `gathered_states` (when a layer's parameters are gathered or sharded on one rank)."""

from __future__ import annotations

import pathlib

import torch
from torch.distributed.tensor import DTensor

from slime_core.batch import RolloutBatch
from slime_train_fsdp import FSDPTrainBackend
from slime_train_fsdp.model_loading import gathered_through_backward
from slime_train_fsdp.packing import response_log_probs


def varied_batches(count: int, seed: int = 0) -> list[RolloutBatch]:
    """`count` one-step rollouts of 8 samples (vocab 64) whose 2 micro-batches hold different numbers of sequences
    (1 to 7) and lengths (5 to 60 tokens): what dynamic batching feeds the compiled layers in a real run."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(count):
        split = 1 + r % 7
        tokens, resp, masks = [], [], []
        for _ in range(8):
            prompt = int(torch.randint(3, 30, (1,), generator=g))
            response = int(torch.randint(2, 31, (1,), generator=g))
            tokens.append(torch.randint(0, 64, (prompt + response,), generator=g))
            resp.append(response)
            masks.append(torch.ones(response))
        out.append(RolloutBatch(
            tokens=tokens, response_lengths=resp, loss_masks=masks,
            rewards=[1.0 - 2.0 * (i % 2) for i in range(8)], raw_rewards=[0.0] * 8,
            loss_denominators=[float(m.sum()) for m in masks],
            micro_batches=[[list(range(split)), list(range(split, 8))]], sample_indices=list(range(8)),
            step_sample_counts=[8], step_token_counts=[float(sum(float(m.sum()) for m in masks))],
        ))  # fmt: skip
    return out


def scenario_compile(ckpt: str, out: pathlib.Path, work: pathlib.Path, *, make_args) -> dict:
    """Compiled decoder layers over rollouts whose micro-batches vary in sequence count and length: dynamo's
    graph and frame counts after the first rollout and after all of them (CPU: dynamo's `eager` backend, same
    guards as inductor; CUDA: inductor with the flash varlen kernel)."""
    from torch._dynamo.utils import counters

    if not torch.cuda.is_available():
        compile_module = torch.nn.Module.compile
        torch.nn.Module.compile = lambda self, *a, **kw: compile_module(self, *a, **{**kw, "backend": "eager"})
    torch._dynamo.reset()
    counters.clear()
    b = FSDPTrainBackend()
    b.init(make_args(ckpt, fsdp_compile_layers=True, attn_implementation="slime_varlen", global_batch_size=8),
           with_ref=False)  # fmt: skip
    res: dict = {"graphs": [], "frames": [], "compile_time": []}
    for rid, batch in enumerate(varied_batches(6)):
        b.compute_log_probs(batch)  # the no-grad forward (old/ref log-probs)
        res["compile_time"].append(b.train(rid, batch).get("perf/compile_time"))
        res["graphs"].append(int(counters["stats"]["unique_graphs"]))
        res["frames"].append(int(counters["frames"]["total"]))
    res["sequence_counts"] = sorted({len(mb) for batch in varied_batches(6) for mb in batch.micro_batches[0]})
    return res


def gathered_states(b: FSDPTrainBackend, batch: RolloutBatch) -> dict:
    """Whether a decoder layer's parameters are DTensor shards: after a forward inside and after the block."""
    layer = b.model.model.layers[0]
    sharded = lambda: all(isinstance(p, DTensor) for p in layer.parameters())  # noqa: E731
    out = {"before": sharded()}
    with gathered_through_backward(b.model):
        logp, _, anchor = response_log_probs(
            b.model, b._pack(batch, batch.micro_batches[0][0]), temperature=1.0, chunk_size=4
        )
        out["after_forward"] = sharded()
        (logp.sum() + anchor).backward()
    out["after_block"] = sharded() and all(isinstance(p, DTensor) for p in b.model.parameters())
    b.optimizer.zero_grad(set_to_none=True)
    b.compute_log_probs(batch)
    out["after_no_grad_forward"] = sharded()
    return out
