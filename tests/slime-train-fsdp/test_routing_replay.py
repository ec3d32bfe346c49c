"""MoE routing replay in the FSDP backend (issue 30 item 4), on a tiny random Qwen3-MoE on one CPU rank (gloo).

(b) replaying the router's own routes is bitwise the plain forward; other routes give the log-probs of a forward
with the routers forced by hand (combine weights from the current logits); (c) `--use-routing-replay` records in
the old-log-prob pass and the training forward replays it after the router weights change; (d) the routes follow
the packing of 2-sample micro-batches, and the engine's `T - 1` rows line up with the tokens. Tolerance: 1e-5
(fp32, packed vs one sequence at a time).
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import pytest
import torch

pytestmark = [
    pytest.mark.slow,  # multi-process: ranks forked
]

_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch", pathlib.Path(__file__).with_name("_launch.py"))
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(pathlib.Path(__file__).with_name("_routing_workers.py"))
TOL = 1e-5


@pytest.fixture(scope="module")
def routing(tmp_path_factory, qwen3_tokenizer_dir) -> dict:
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    path = tmp_path_factory.mktemp("tiny_qwen3_moe")
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                         tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 1.0)  # routes clearly depend on the token
    model.save_pretrained(path)
    for f in qwen3_tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, path / f.name)
    _ranks.workers()
    return _ranks.forked("routing", 1, tmp_path_factory.mktemp("routing"), path)[0]


def test_replaying_the_routers_own_routes_is_bitwise_the_plain_forward(routing):
    assert routing["natural_bitwise"] == [True] * 8
    assert routing["record_old_bitwise"]  # recording changes nothing either


def test_replayed_routes_are_used_with_weights_from_the_current_logits(routing):
    assert routing["forced_diff"] <= TOL
    assert routing["forced_vs_plain"] > 1e-2  # other experts, other log-probs
    # Two counted passes over the same tokens: the router's own routes (none differ), then shifted ones (all differ).
    assert routing["r3_old_pass_mismatch"] == 0.5


def test_routing_replay_records_in_the_old_pass_and_replays_in_training(routing):
    assert routing["recorded_equal_hf"] == [True] * 8  # one route row per token, packing undone per sample
    assert routing["replay_diff"] <= TOL  # the flipped routers' logits over the recorded experts
    assert routing["replay_vs_free"] > 1e-2  # the flipped routers alone would pick other experts
    assert routing["mismatch"] == pytest.approx(routing["mismatch_expected"], abs=0) and routing["mismatch"] > 0.5


def test_train_step_reports_the_mismatch_and_frees_the_routes(routing):
    assert 0.0 <= routing["train_mismatch"] < 0.5 and 0.0 <= routing["train_r3_mismatch"] < 0.5
    assert routing["recorded_after_train"] == 0
    assert (
        "has no routes" in routing["unrecorded_error"]
        and "--use-routing-replay records them" in (routing["unrecorded_error"])
    )
