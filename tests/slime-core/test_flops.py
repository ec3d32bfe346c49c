"""Model FLOPs (`slime_core.flops`) by hand, and the original's `perf/*_tflops` / length metrics of a train step."""

import json
import types

import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.flops import model_config, throughput_metrics, transformer_flops
from slime_core.train_step import train_on_rollout

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


class _Backend:
    """A one-parameter-per-sample backend (see test_train_step.FakeBackend), rank 0 of `dp` identical ranks."""

    has_ref = has_teacher = False

    def __init__(self, batch, dp):
        self.params = [torch.nn.Parameter(torch.full((n,), -1.0)) for n in batch.response_lengths]
        self.dp = dp

    def compute_log_probs(self, batch, *, model="actor"):
        return [p.detach().clone() for p in self.params]

    def all_reduce_sum(self, tensor):
        return tensor * self.dp

    def forward_backward(self, batch, step, loss_fn, *, denominator):
        out = []
        for ids in batch.micro_batches[step]:
            loss, metrics = loss_fn(ids, [self.params[i] * 1.0 for i in ids], [torch.zeros(len(self.params[i]))
                                                                               for i in ids])  # fmt: skip
            (loss / denominator).backward()
            out.append(metrics)
        return out

    def optimizer_step(self):
        return 0.0, 0.1

    def reduce_metric_sums(self, sums):
        return {k: v * self.dp for k, v in sums.items()}

    def reset_optimizer_states(self):
        pass


def test_a_train_step_reports_the_original_length_means_and_tflops(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(DENSE))
    batch = RolloutBatch(
        tokens=[torch.arange(3), torch.arange(5)],
        response_lengths=[2, 3],
        loss_masks=[torch.ones(2), torch.ones(3)],
        rewards=[1.0, -1.0],
        raw_rewards=[1.0, 0.0],
        loss_denominators=[2.0, 3.0],
        micro_batches=[[[0], [1]]],
        truncated=[0, 1],
        step_sample_counts=[4],
        step_token_counts=[10.0],
    )
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}).model_copy(
        update={"hf_checkpoint": str(tmp_path), "actor_num_gpus_per_node": 2}
    )
    model_config.cache_clear()
    try:
        metrics, _ = train_on_rollout(cfg, _Backend(batch, dp=2), 0, batch)
    finally:
        model_config.cache_clear()
    # Two identical DP ranks: 4 samples of 3, 5, 3, 5 tokens; responses 2, 3, 2, 3; one in two truncated.
    assert metrics["rollout/total_lengths"] == 4.0
    assert metrics["rollout/response_lengths"] == 2.5
    assert metrics["rollout/truncated"] == 0.5
    # Forward FLOPs of the rollout: 2*264*16 + 2*2*6*68 + 2*10*4*10 = 8448 + 1632 + 800 = 10880, over 2 GPUs.
    seconds = metrics["perf/actor_train_time"]
    assert metrics["perf/actor_train_tflops"] == pytest.approx(3 * 10880 / 2 / 1e12 / seconds)
    assert metrics["perf/actor_train_tok_per_s"] == pytest.approx(16 / seconds)
    # One step: the old log-probs come from the training forward, so no separate forward is timed.
    assert "perf/log_probs_tflops" not in metrics and "perf/ref_log_probs_tflops" not in metrics
