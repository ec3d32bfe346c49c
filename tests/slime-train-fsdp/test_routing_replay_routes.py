"""Routes handed to the FSDP routing replay that the model cannot take (hostile pass 29): an expert id outside
`[0, num_experts)` (an engine serving another preset, a custom generate function's own routes) or another top-k.

In process, on a plain tiny Qwen3-MoE (no FSDP, no ranks): `RoutingReplay.before_forward` must refuse such routes with
one line naming the sample and what is wrong, before the router's `gather` indexes out of range (on CUDA a
device-side assert that kills the process without naming anything).
"""

from __future__ import annotations

import types

import pytest
import torch

from slime_train_fsdp.routing_replay import RoutingReplay

NUM_LAYERS, TOPK, NUM_EXPERTS = 2, 2, 8


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_experts=NUM_EXPERTS, num_experts_per_tok=TOPK, norm_topk_prob=True,
                         num_hidden_layers=NUM_LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=64, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _run(model, routes: torch.Tensor, tokens: int = 5) -> torch.Tensor:
    """Replays `routes` (`[tokens - 1, L, K]`, sample index 41) in one forward; returns the log-probs."""
    replay = RoutingReplay(model, NUM_LAYERS)
    batch = types.SimpleNamespace(rollout_routed_experts=[routes], sample_indices=[41])
    ids = torch.arange(3, 3 + tokens).unsqueeze(0)
    mb = types.SimpleNamespace(sample_ids=[0], seq_lengths=[tokens], input_ids=ids)
    with replay.running("replay"), torch.no_grad():
        replay.before_forward(batch, mb)
        return model(input_ids=ids).logits.log_softmax(-1)


def test_routes_in_range_are_replayed(model):
    routes = torch.tensor([[[0, 7], [3, 4]]] * 4, dtype=torch.int32)  # [4, L, K]
    assert torch.isfinite(_run(model, routes)).all()


@pytest.mark.parametrize("bad", [NUM_EXPERTS, -1])
def test_an_expert_id_out_of_range_is_refused_naming_the_sample(model, bad):
    routes = torch.tensor([[[0, 1], [2, 3]]] * 4, dtype=torch.int32)
    routes[2, 1, 0] = bad
    with pytest.raises(ValueError, match=rf"sample 41: .*expert id {bad} .*\[0, {NUM_EXPERTS}\)"):
        _run(model, routes)


def test_routes_of_another_top_k_are_refused_naming_both(model):
    routes = torch.zeros((4, NUM_LAYERS, TOPK + 2), dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"sample 41: .*top-k {TOPK + 2}.*{TOPK}"):
        _run(model, routes)
