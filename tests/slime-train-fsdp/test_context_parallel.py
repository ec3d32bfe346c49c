"""FSDP context parallelism (Ulysses all-to-all) on CPU/gloo, 2 processes: CP=2 against CP=1.

1. One packed micro-batch (odd length, so the row is padded for CP): log-probs, entropies and the gradient of
   `Σ a·logp + Σ b·H` with CP=2 (`slime_varlen`, exact CPU fallback, each rank half the row) equal those of
   CP=1 (`sdpa` with its dense mask, both ranks the whole row). Tolerance 1e-5 absolute (fp32, summation order).
   The same with CP=2 and the `fused` log-prob head (the CUDA default) against CP=1's exact `fp32` head.
2. `FSDPTrainBackend.train` on the same global batch, CP=2 × DP=1 (both ranks hold the batch, gradient
   checkpointing on) against CP=1 × DP=2 (each rank half): same parameters after two optimizer steps, same
   grad norms (1e-5 relative, as the DP tests of `test_backend.py`).
Pure helpers (`shard_row`) are checked exactly.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import pathlib
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from slime_train_fsdp.context_parallel import shard_row

pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")

WORKERS = pathlib.Path(__file__).with_name("_workers.py")
TOL = 1e-5


def _workers():
    spec = importlib.util.spec_from_file_location("slime_fsdp_cp_test_workers", WORKERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shard_row_pads_and_splits():
    ids = torch.arange(10, 17)[None]  # S0 = 7 → padded to 8, slices of 4
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    predict, targets = torch.tensor([1, 4, 5]), torch.tensor([12, 15, 16])
    first = shard_row(ids, pos, predict, targets, [3, 4], 0, 2)
    second = shard_row(ids, pos, predict, targets, [3, 4], 1, 2)
    assert first.input_ids.tolist() == [[10, 11, 12, 13]] and second.input_ids.tolist() == [[14, 15, 16, 0]]
    assert second.position_ids.tolist() == [[1, 2, 3, 0]]  # the padding is its own sequence
    assert first.seq_lengths == second.seq_lengths == [3, 4, 1]
    assert first.counts == second.counts == [1, 2]
    assert first.predict_index.tolist() == [1] and second.predict_index.tolist() == [0, 1]
    assert second.targets.tolist() == [15, 16]


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


def _rank_entry(rank: int, port: int, out: pathlib.Path, ckpt: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        w = _workers()
        res = {"micro": _micro_batch_check(w, ckpt), "backend": _backend_check(w, ckpt)}
        torch.save(res, out / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory) -> list[dict]:
    from transformers import AutoModelForCausalLM, Qwen3Config

    ckpt = tmp_path_factory.mktemp("cp_qwen3")
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # forked workers: keep this process free of OpenMP thread pools
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(ckpt)
    _workers()  # import slime_train_fsdp & co. before forking
    out = tmp_path_factory.mktemp("cp_out")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_entry, args=(r, port, out, str(ckpt))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    torch.set_num_threads(threads)
    for rank, p in enumerate(procs):
        if p.is_alive():
            p.kill()
        err = out / f"rank{rank}.err"
        assert p.exitcode == 0, f"rank {rank} failed:\n{err.read_text() if err.exists() else p.exitcode}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.mark.parametrize("run", ["cp2", "cp2_fused"])
def test_cp2_micro_batch_matches_cp1(cp_results, run):
    for res in cp_results:
        cp1, cp2 = res["micro"]["cp1"], res["micro"][run]
        assert float((cp1["logp"] - cp2["logp"]).abs().max()) <= TOL
        assert float((cp1["ent"] - cp2["ent"]).abs().max()) <= TOL
        assert max(float((cp1["grads"][n] - cp2["grads"][n]).abs().max()) for n in cp1["grads"]) <= TOL
        assert max(float(g.abs().max()) for g in cp1["grads"].values()) > 1e-3  # a real gradient
        topp1, topp2 = res["micro"]["cp1_topp"], res["micro"]["cp2_topp"]
        assert float((topp1 - topp2).abs().max()) <= TOL and float((topp1 - cp1["logp"]).abs().max()) > 1e-2


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def test_cp2_backend_training_matches_dp2(cp_results):
    dp2, cp2 = cp_results[0]["backend"]["dp2"], cp_results[0]["backend"]["cp2"]
    assert max(_rel(cp2["params"][n], dp2["params"][n]) for n in dp2["params"]) <= TOL
    assert cp2["grad_norms"] == pytest.approx(dp2["grad_norms"], rel=TOL)
    # Metric sums are reduced over DP only: CP ranks do not count the same samples twice.
    for step_dp, step_cp in zip(dp2["metrics"], cp2["metrics"], strict=True):
        for key in ("train/loss", "train/pg_loss", "train/entropy_loss", "train/ppo_kl"):
            assert step_cp[key] == pytest.approx(step_dp[key], rel=TOL, abs=1e-6), key
    assert [r["backend"]["dp2"]["dp_rank"] for r in cp_results] == [0, 1]
    assert [r["backend"]["cp2"]["dp_rank"] for r in cp_results] == [0, 0]  # one DP group of two CP ranks
    # Both CP ranks end with the same full parameters and the full batch's log-probs.
    other = cp_results[1]["backend"]["cp2"]
    assert all(torch.equal(other["params"][n], cp2["params"][n]) for n in cp2["params"])
    assert all(torch.equal(x, y) for x, y in zip(other["log_probs"], cp2["log_probs"], strict=True))
