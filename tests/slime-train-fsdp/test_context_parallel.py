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
import pathlib
from unittest import mock

import pytest
import torch

from slime_train_fsdp.context_parallel import response_counts, shard_row

_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch", pathlib.Path(__file__).with_name("_launch.py"))
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(pathlib.Path(__file__).with_name("_cp_workers.py"))  # ranks forked from the forkserver
TOL = 1e-5


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


def test_shard_row_counts_from_lengths_read_nothing_and_match():
    """With the response lengths the slices' counts come from the host (no read of `predict_index`), same shard."""
    ids, pos = torch.arange(10, 17)[None], torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    predict, targets = torch.tensor([1, 4, 5]), torch.tensor([12, 15, 16])
    for rank in (0, 1):
        read = shard_row(ids, pos, predict, targets, [3, 4], rank, 2)
        with mock.patch.object(torch.Tensor, "tolist", side_effect=AssertionError("read predict_index")):
            given = shard_row(ids, pos, predict, targets, [3, 4], rank, 2, response_lengths=[1, 2])
        assert given.counts == read.counts == [1, 2]
        assert torch.equal(given.predict_index, read.predict_index) and torch.equal(given.targets, read.targets)
    # 3 samples over 4 slices of 3 (S0 = 12): predicting [1, 3), [5, 8) and [10, 11).
    assert response_counts([4, 5, 3], [2, 3, 1], 3, 4) == [2, 1, 2, 1]
    with pytest.raises(ValueError, match="2 sequence lengths but 1 response lengths"):
        response_counts([3, 4], [1], 4, 2)


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory) -> list[dict]:
    from transformers import AutoModelForCausalLM, Qwen3Config

    ckpt = tmp_path_factory.mktemp("cp_qwen3")
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(ckpt)
    _ranks.workers()  # the worker module's import errors show here, not in a rank
    return _ranks.forked("cp", 2, tmp_path_factory.mktemp("cp_out"), ckpt)


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
