"""Model FLOPs and the throughput metrics (`slime_core.flops`) by hand; a train step's figures: test_train_step.py."""

import json
import types

import pytest

from slime_core.flops import model_config, throughput_metrics, transformer_flops

DENSE = dict(hidden_size=4, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=3,
             intermediate_size=5, vocab_size=10)  # fmt: skip


def test_dense_flops_by_hand_from_an_object_or_a_mapping():
    # d_q = 6, d_kv = 3; per layer: q 4*6 + k,v 2*4*3 + o 6*4 + mlp 3*4*5 = 24 + 24 + 24 + 60 = 132; 2 layers = 264.
    for cfg in (types.SimpleNamespace(**DENSE), DENSE, {"text_config": DENSE, "model_type": "qwen3_vl"}):
        fwd = transformer_flops(cfg, [3, 5], lm_head_tokens=4, backward=False)
        assert fwd["n_body"] == 264
        assert fwd["matmul"] == 2 * 264 * 8 + 2 * 10 * 4 * 4  # 4224 + 320
        assert fwd["attention"] == 2 * 2 * 6 * (9 + 25)  # 816
        both = transformer_flops(cfg, [3, 5], lm_head_tokens=4, backward=True)
        assert both["total"] == 3 * fwd["total"]


def test_moe_flops_count_the_routed_experts_the_shared_expert_the_router_and_dense_layers():
    moe = {**DENSE, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 3,
           "shared_expert_intermediate_size": 1}  # fmt: skip
    # attention part per layer 72 (as dense); MoE MLP: 3*4*(3*2 + 1) = 84, router 4*8 = 32 → 116 per layer.
    assert transformer_flops(moe, [1], lm_head_tokens=0, backward=False)["n_body"] == 2 * (72 + 116)
    # DeepSeek style: first layer dense (3*4*5 = 60), n_shared_experts × expert size as the shared expert.
    ds = {**DENSE, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 3, "n_shared_experts": 1,
          "first_k_dense_replace": 1}  # fmt: skip
    # MoE layer: 3*4*(3*2 + 3) = 108 + router 32 = 140.
    assert transformer_flops(ds, [1], lm_head_tokens=0, backward=False)["n_body"] == (72 + 60) + (72 + 140)


def test_a_config_without_a_needed_field_is_named():
    with pytest.raises(KeyError, match="'vocab_size'"):
        transformer_flops({k: v for k, v in DENSE.items() if k != "vocab_size"}, [1], lm_head_tokens=0, backward=False)


def test_throughput_metrics_by_hand():
    # 2 sequences of 3 and 5 tokens, 4 response tokens, 2 GPUs. Forward FLOPs: 2*264*8 + 2*2*6*34 + 2*10*4*4 = 5360.
    times = {"perf/log_probs_time": 2.0, "perf/ref_log_probs_time": 0.0, "perf/actor_train_time": 4.0}
    out = throughput_metrics(DENSE, 8.0, 34.0, 4.0, 2, times)
    fwd_per_gpu = 5360 / 2 / 1e12
    assert out == pytest.approx({
        "perf/log_probs_tflops": fwd_per_gpu / 2.0,
        "perf/actor_train_tflops": 3 * fwd_per_gpu / 4.0,
        "perf/actor_train_tok_per_s": 8.0 / 4.0,
    })  # fmt: skip
    assert "perf/ref_log_probs_tflops" not in out  # that forward did not run
    assert throughput_metrics({"hidden_size": 4}, 8.0, 34.0, 4.0, 2, times) == {}


def test_model_config_reads_config_json_once(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(DENSE))
    model_config.cache_clear()
    try:
        assert model_config(str(tmp_path)) == DENSE
        (tmp_path / "config.json").write_text("{}")
        assert model_config(str(tmp_path)) == DENSE  # cached: read once per process
        assert model_config(None) is None and model_config(str(tmp_path / "missing")) is None
    finally:
        model_config.cache_clear()
