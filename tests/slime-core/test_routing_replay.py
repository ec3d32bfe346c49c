"""MoE routing replay in slime-core (issue 30 item 4): the wire format, the routes' way through the batch to each
data-parallel rank, the old-log-prob pass that records them, and the preflight errors."""

import base64
import json
import random

import numpy as np
import pytest
import torch

from slime_core.config import SlimeArgs, parse_args
from slime_core.config.base import ConfigError
from slime_core.routing_replay import (
    decode_routed_experts,
    encode_routed_experts,
    moe_shape,
    routes_for_tokens,
    validate_routes,
)
from slime_core.sample import Sample
from slime_core.train_data import build_rollout_batches
from slime_core.train_step import can_reuse_old_log_probs

_BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_rollout": 1, "global_batch_size": 4,
         "train_backend": "fsdp", "rollout_engine": "reference"}  # fmt: skip


def _cfg(**kw) -> SlimeArgs:
    return SlimeArgs.from_dict({**_BASE, **kw})


@pytest.fixture
def installed_entries():
    """Config validation reads the capability records of the backend and the engine: their packages must be
    installed (the workspace suite; the slime-core isolation run skips the tests that validate a config)."""
    pytest.importorskip("slime_train_fsdp")
    pytest.importorskip("slime_rollout")


def test_sglang_encoding_round_trip():
    routes = torch.arange(3 * 2 * 2, dtype=torch.int32).reshape(3, 2, 2)
    wire = encode_routed_experts(routes)
    # SGLang: base64 of the int32 buffer (detokenizer_manager._b64_encode_per_request); decoded as its helper does.
    assert np.frombuffer(base64.b64decode(wire), dtype=np.int32).tolist() == list(range(12))
    assert torch.equal(decode_routed_experts(wire, num_layers=2, topk=2), routes)
    assert torch.equal(decode_routed_experts(routes.tolist(), num_layers=2, topk=2), routes)  # nested lists too
    with pytest.raises(ValueError, match="sample 7: meta_info.routed_experts is not base64"):
        decode_routed_experts("not base64!", num_layers=2, topk=2, what="sample 7")
    assert moe_shape({"num_hidden_layers": 4, "num_local_experts": 8, "num_experts_per_tok": 2}) == (4, 2)
    assert moe_shape({"num_hidden_layers": 4, "model_type": "qwen3"}) is None


def test_last_token_gets_a_filler_row():
    routes = torch.tensor([[[5, 6]], [[7, 1]]], dtype=torch.int32)  # 2 rows: tokens 0 and 1 of 3
    full = routes_for_tokens(routes, 3)
    assert full.tolist() == [[[5, 6]], [[7, 1]], [[0, 1]]] and full.dtype == torch.int64
    with pytest.raises(ValueError, match="routes have 2 rows for 4 tokens"):
        routes_for_tokens(routes, 4)


def _rollout(num_layers=2, topk=2, seed=0):
    rng = random.Random(seed)
    samples = []
    for i in range(8):
        resp = rng.randint(1, 6)
        s = Sample(tokens=[100 + i] * 3, index=i, group_index=i // 4, label="x")
        s.append_response_tokens([i] * resp, log_probs=[-0.5] * resp)
        s.reward = float(i % 4 == 0)
        # Each route row names its sample and token: expert ids (1000·index + position, layer).
        t = len(s.tokens) - 1
        pos = torch.arange(t)[:, None, None] + 1000 * i
        s.rollout_routed_experts = torch.cat([pos.expand(t, num_layers, 1), torch.ones(t, num_layers, 1).long()], -1)
        samples.append(s)
    rng.shuffle(samples)
    return samples


@pytest.mark.usefixtures("installed_entries")
@pytest.mark.parametrize("dynamic", [True, False])
def test_routes_follow_their_samples_to_each_rank(dynamic):
    samples = _rollout()
    cfg = _cfg(use_rollout_routing_replay=True, use_dynamic_batch_size=dynamic, max_tokens_per_gpu=12)
    batches = build_rollout_batches(cfg, samples, dp_size=2)
    seen = 0
    for b in batches:
        for tok, routes, index in zip(b.tokens, b.rollout_routed_experts, b.sample_indices, strict=True):
            assert routes.dtype == torch.int32 and routes.shape == (tok.numel() - 1, 2, 2)
            assert routes[:, 1, 0].tolist() == [1000 * index + p for p in range(tok.numel() - 1)]
            seen += 1
    assert seen == 8


@pytest.mark.usefixtures("installed_entries")
def test_missing_or_misaligned_routes_are_one_line_errors():
    cfg = _cfg(use_rollout_routing_replay=True)
    samples = _rollout()
    victim = next(s for s in samples if s.index == 3)
    victim.rollout_routed_experts = None
    with pytest.raises(ValueError, match=r"samples \[3\] carry no rollout_routed_experts \(7 of 8 do\)"):
        build_rollout_batches(cfg, samples, dp_size=2)
    # A tool observation appended after the last engine call: no routes for it.
    samples = _rollout()
    victim = next(s for s in samples if s.index == 5)
    victim.append_response_tokens([9, 9], trainable=False)
    with pytest.raises(ValueError, match="sample 5: rollout_routed_experts has .* rows, its .* tokens need"):
        build_rollout_batches(cfg, samples, dp_size=2)
    with pytest.raises(ValueError, match=r"must be \[T - 1, layers, top-k\]"):
        validate_routes([1, 2, 3], 4, "sample 0")


def test_sample_dump_round_trip_keeps_routes():
    s = next(s for s in _rollout() if s.index == 0)
    again = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert torch.equal(again.rollout_routed_experts, s.rollout_routed_experts.to(torch.int32))


@pytest.mark.usefixtures("installed_entries")
def test_recording_needs_the_old_log_prob_pass():
    from slime_core.batch import RolloutBatch

    one_step = RolloutBatch(
        tokens=[torch.tensor([1, 2, 3])], response_lengths=[1], loss_masks=[torch.ones(1)], rewards=[1.0],
        raw_rewards=[1.0], loss_denominators=[1.0], micro_batches=[[[0]]],
    )  # fmt: skip
    assert can_reuse_old_log_probs(_cfg(), one_step)
    assert not can_reuse_old_log_probs(_cfg(use_routing_replay=True), one_step)  # it records the routes
    assert can_reuse_old_log_probs(_cfg(use_rollout_routing_replay=True), one_step)  # engine routes: as the original


@pytest.mark.usefixtures("installed_entries")
def test_rollout_replay_implies_routing_replay():
    cfg = _cfg(use_rollout_routing_replay=True)
    assert cfg.use_routing_replay and cfg.use_rollout_routing_replay


@pytest.mark.usefixtures("installed_entries")
def test_preflight_errors_name_the_flag(tmp_path):
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 2}))
    with pytest.raises(ConfigError, match=f"--use-routing-replay: --hf-checkpoint {dense} is a dense model"):
        _cfg(use_routing_replay=True, hf_checkpoint=str(dense))
    with pytest.raises(ConfigError, match="--use-rollout-routing-replay: --train-backend megatron does not replay"):
        _cfg(use_rollout_routing_replay=True, train_backend="megatron")
    with pytest.raises(ConfigError, match="--use-routing-replay records the routes .* --use-rollout-logprobs skips"):
        _cfg(use_routing_replay=True, use_rollout_logprobs=True)
    with pytest.raises(ConfigError, match="--use-routing-replay does not support --context-parallel-size 2"):
        parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--train-backend", "fsdp",
                    "--actor-num-gpus-per-node", "2", "--context-parallel-size", "2",
                    "--attn-implementation", "slime_varlen", "--use-routing-replay"])  # fmt: skip
    moe = tmp_path / "moe"
    moe.mkdir()
    (moe / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "num_hidden_layers": 2,
                                                 "num_local_experts": 8, "num_experts_per_tok": 2}))  # fmt: skip
    assert _cfg(use_rollout_routing_replay=True, hf_checkpoint=str(moe)).use_routing_replay


@pytest.mark.usefixtures("installed_entries")
def test_an_engine_that_cannot_return_routes_is_refused(monkeypatch):
    import dataclasses

    from slime_core import extensions

    real = extensions.engine_spec

    def no_routes(cfg):
        return dataclasses.replace(real(cfg), returns_routed_experts=False)

    monkeypatch.setattr("slime_core.config.validation_routing_replay.engine_spec", no_routes)
    with pytest.raises(ConfigError, match="--rollout-engine reference cannot return the experts it routed to"):
        _cfg(use_rollout_routing_replay=True)
    assert _cfg(use_routing_replay=True).use_routing_replay  # its own routes need nothing from the engine
