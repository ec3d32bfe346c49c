"""Context-parallel scenario of `test_context_parallel.py`, run on 2 gloo ranks by `_launch.RankLauncher`.

`run("cp", out, ckpt)`: the micro-batch check (CP=2 vs CP=1 log-probs, entropies, gradients) and the backend check
(CP=2 x DP=1 vs CP=1 x DP=2 training); the rank's results go to `out/rank{r}.pt`.
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _workers():
    spec = importlib.util.spec_from_file_location("slime_fsdp_cp_test_workers", pathlib.Path(__file__).with_name(
        "_worker_common.py"))  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
            for n, p in model.named_parameters()}  # fmt: skip


def _micro_batch_check(w, ckpt: str) -> dict:
    from slime_train_fsdp.model_loading import build_fsdp_model
    from slime_train_fsdp.packing import pack_micro_batch, response_log_probs

    batch = w.make_batch(0, 1)
    ids = [0, 1, 4]
    mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, torch.device("cpu"))
    assert mb.input_ids.shape[1] % 2 == 1  # exercises the CP padding
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(mb.targets.numel(), generator=g), torch.randn(mb.targets.numel(), generator=g)
    res = {}
    cp2 = {"attn_implementation": "slime_varlen", "megatron_args": ["--context-parallel-size", "2"]}
    # Top-p replay: each CP rank scores a contiguous run of the response positions, with their sets.
    topp = w.with_top_p_sets(batch)
    mb_topp = pack_micro_batch(batch.tokens, batch.response_lengths, ids, torch.device("cpu"), topp.kept_tokens(ids))
    cp2_fused = {**cp2, "log_probs_head": "fused"}
    for name, overrides, scale in (("cp1", {}, 1.0), ("cp2", cp2, 2.0), ("cp2_fused", cp2_fused, 2.0)):
        model, _ = build_fsdp_model(w.make_args(ckpt, **overrides), ckpt, torch.device("cpu"))
        res[f"{name}_topp"] = response_log_probs(model, mb_topp, temperature=w.TEMPERATURE, chunk_size=3)[0].detach()
        logp, ent, anchor = response_log_probs(model, mb, temperature=w.TEMPERATURE, chunk_size=3, with_entropy=True)
        # FSDP averages over the 2 ranks: CP=1 ranks hold the same row (the mean is the gradient); CP=2 ranks hold
        # halves, so each scales by the world size as the backend does and the mean is their sum.
        (((logp * a).sum() + (ent * b).sum()) * scale + anchor).backward()
        res[name] = {"logp": logp.detach(), "ent": ent.detach(), "grads": _grads(model)}
    return res


def _backend_check(w, ckpt: str) -> dict:
    from slime_train_fsdp import FSDPTrainBackend

    rank = dist.get_rank()
    res = {}
    # --normalize-advantages: the whitening statistics are summed over DP ranks; counted once per CP group (they
    # were counted twice under CP=2, and the variance's Bessel factor N/(N-1) then took 2N: other grad norms).
    runs = (("dp2", {"normalize_advantages": True}, w.make_batch(rank, 2)),
            ("cp2", {"attn_implementation": "slime_varlen", "megatron_args": ["--context-parallel-size", "2"],
                     "gradient_checkpointing": True, "normalize_advantages": True}, w.make_batch(0, 1)))  # fmt: skip
    for name, overrides, batch in runs:
        backend = FSDPTrainBackend()
        backend.init(w.make_args(ckpt, **overrides), with_ref=False)
        backend.train(0, batch)
        res[name] = {
            "params": w.full_params(backend),
            "grad_norms": [m["train/grad_norm"] for m in backend.step_metrics],
            "metrics": backend.step_metrics,
            "dp_rank": backend.dp_rank,
        }
        res[name]["log_probs"] = backend.compute_log_probs(batch)
    return res


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs the `cp` scenario on this rank (process group from the environment) and saves its results."""
    assert scenario == "cp", scenario
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        w = _workers()
        res = {"micro": _micro_batch_check(w, ckpt), "backend": _backend_check(w, ckpt)}
        torch.save(res, out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()
