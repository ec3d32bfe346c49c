"""MoE routing replay on the rollout side (issue 30 item 4): the reference engine's `routed_experts`, held to SGLang's
wire (`tests/fixtures/sglang-wire/routed_experts.json`, derived from the SGLang 0.5.16 source), the request flag,
the decoded routes on the sample across turns, and the engine launch flags. The GPU test asks real SGLang.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pathlib

import numpy as np
import pytest
import torch

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.routing_replay import decode_routed_experts, encode_routed_experts
from slime_core.sample import Sample
from slime_rollout.engines.launch import build_reference_command, build_sglang_command
from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.generation import generate as generate_mod
from slime_rollout.generation.routed_experts import attach_routed_experts

WIRE = pathlib.Path(__file__).parents[1] / "fixtures" / "sglang-wire" / "routed_experts.json"
PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]
NUM_LAYERS, TOPK, NUM_EXPERTS = 2, 2, 8


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, make_tiny_qwen3_moe) -> pathlib.Path:
    return make_tiny_qwen3_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"))


@pytest.fixture(scope="module")
def served(moe_dir) -> ReferenceModel:
    return ReferenceModel(str(moe_dir))


def _hf_routes(model_dir: pathlib.Path, token_ids: list[int]) -> torch.Tensor:
    """An independent reference: HF's router top-k ids of each token of `token_ids`, `[T, L, K]`."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    got = {}
    for i, layer in enumerate(model.model.layers):
        layer.mlp.gate.register_forward_hook(lambda m, a, out, i=i: got.__setitem__(i, out[2].clone()))
    with torch.no_grad():
        model(input_ids=torch.tensor([token_ids]))
    return torch.stack([got[i] for i in range(len(got))], dim=1).to(torch.int32)


def _reference_client(served: ReferenceModel, server_args: dict):
    """A `fastapi.testclient.TestClient` of the reference engine serving `served`.

    Imported here, not at the top: fastapi is a server-only package, missing from the GPU machine's trainer stack,
    where this file's GPU test must still collect.
    """
    from fastapi.testclient import TestClient

    from slime_rollout.engines.reference.server import build_app

    return TestClient(build_app(served, max_running_requests=4, random_seed=0, server_args=server_args))


def _generate(client, **extra) -> dict:
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True},
            "return_logprob": True, **extra}  # fmt: skip
    reply = client.post("/generate", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_reference_engine_returns_the_routes_hf_picks_in_sglang_format(served, moe_dir):
    spec = json.loads(WIRE.read_text())
    with _reference_client(served, {"enable_return_routed_experts": True}) as client:
        reply = _generate(client, **spec["request"]["body_extra"])
        meta = reply["meta_info"]
        value = meta[spec["meta_info_key"]]
        assert isinstance(value, str)  # base64 text, as SGLang's detokenizer encodes it
        raw = base64.b64decode(value)
        seqlen = meta["prompt_tokens"] + meta["completion_tokens"]
        assert len(raw) == 4 * (seqlen - 1) * NUM_LAYERS * TOPK  # int32, one row per token the engine ran
        routes = np.frombuffer(raw, dtype=spec["dtype"]).reshape(seqlen - 1, NUM_LAYERS, TOPK)
        expected = _hf_routes(moe_dir, [*PROMPT, *reply["output_ids"]][:-1])
        assert torch.equal(torch.from_numpy(routes.copy()), expected)
        assert len(set(routes.reshape(-1).tolist())) > 2  # the routes depend on the token
        # routed_experts_start_len: rows [start, seqlen - 1) only; out of range is SGLang's error.
        part = _generate(client, return_routed_experts=True, routed_experts_start_len=3)["meta_info"]
        assert torch.equal(decode_routed_experts(part["routed_experts"], num_layers=2, topk=2), expected[3:])
        bad = client.post("/generate", json={"input_ids": PROMPT, "return_routed_experts": True,
                                             "routed_experts_start_len": len(PROMPT) + 1})  # fmt: skip
        assert bad.status_code == 400 and "routed_experts_start_len" in bad.text
        assert "routed_experts" not in _generate(client)["meta_info"]  # not asked for
    # Without --enable-return-routed-experts SGLang has no capturer and adds nothing; so does the reference engine.
    with _reference_client(served, {}) as client:
        assert "routed_experts" not in _generate(client, return_routed_experts=True)["meta_info"]


def test_wire_spec_names_its_sglang_sources():
    spec = json.loads(WIRE.read_text())
    assert spec["recorded"] is False and "sglang 0.5.16" in spec["derived_from"]
    assert spec["request"]["body_extra"] == {"return_routed_experts": True}
    assert spec["server_flag"] == "--enable-return-routed-experts"


def _args(model_dir, **kw) -> PluginArgs:
    fields = dict(rollout_batch_size=1, num_rollout=1, rollout_max_response_len=4, hf_checkpoint=str(model_dir),
                  rollout_engine="reference", train_backend="fsdp", use_rollout_routing_replay=True, **kw)  # fmt: skip
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


class _Client:
    """A fake engine: two output tokens, routes for `len(input_ids) + 2 - 1` tokens (expert ids = token position)."""

    def __init__(self, with_routes: bool = True):
        self.payloads, self.with_routes = [], with_routes

    async def generate(self, payload):
        self.payloads.append(payload)
        rows = len(payload["input_ids"]) + 2 - 1
        meta = {"output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]], "finish_reason": {"type": "stop"}}
        if self.with_routes:
            pos = torch.arange(rows, dtype=torch.int32)[:, None, None]
            meta["routed_experts"] = encode_routed_experts(pos.expand(rows, NUM_LAYERS, TOPK))
        return {"text": "ab", "output_ids": [7, 8], "meta_info": meta}


async def test_generate_asks_for_routes_and_keeps_them_aligned_with_the_tokens(monkeypatch, moe_dir):
    client = _Client()
    monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
    args = _args(moe_dir)
    sample = await generate_mod.generate(args, Sample(tokens=[1, 2, 3], index=0), {"max_new_tokens": 4})
    assert client.payloads[0]["return_routed_experts"] is True
    assert sample.tokens == [1, 2, 3, 7, 8] and sample.rollout_routed_experts.shape == (4, NUM_LAYERS, TOPK)
    assert sample.rollout_routed_experts[:, 0, 0].tolist() == [0, 1, 2, 3]
    # A continuation (partial rollout / next turn) sends every token so far: its routes replace the earlier ones.
    sample = await generate_mod.generate(args, sample, {"max_new_tokens": 4})
    assert sample.rollout_routed_experts[:, 1, 1].tolist() == list(range(6))
    # Round trip through the dump format.
    again = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))
    assert torch.equal(again.rollout_routed_experts, sample.rollout_routed_experts)
    # An engine that returns none: one clear error naming the flag.
    monkeypatch.setattr(generate_mod, "get_client", lambda args: _Client(with_routes=False))
    with pytest.raises(ValueError, match="sample 1: --use-rollout-routing-replay .* --enable-return-routed-experts"):
        await generate_mod.generate(args, Sample(tokens=[1, 2], index=1), {"max_new_tokens": 4})


def test_the_original_append_keeps_a_replys_routes(moe_dir):
    # A generate function written for the original (its own generate with return_routed_experts) passes the reply's
    # meta_info to `append_response_tokens(args, ...)`, whose original decodes the routes; they were dropped here,
    # and training refused every sample as carrying none.
    args = _args(moe_dir)
    sample = Sample(tokens=[1, 2, 3], index=0)  # `slime.utils.types.Sample` is this class
    routes = torch.arange(4, dtype=torch.int32)[:, None, None].expand(4, NUM_LAYERS, TOPK)
    meta = {"routed_experts": encode_routed_experts(routes), "finish_reason": {"type": "stop"}}
    sample.append_response_tokens(args, tokens=[7, 8], log_probs=[-0.5, -0.25], trainable=True, meta_info=meta)
    assert torch.equal(sample.rollout_routed_experts, routes)
    # Without the flag they are not kept (as attach_routed_experts), and the ids-first form is ours: no args.
    plain = Sample(tokens=[1, 2, 3], index=1)
    flag_off = PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}))
    plain.append_response_tokens(flag_off, tokens=[7, 8], log_probs=[-0.5, -0.25], meta_info=meta)
    plain.append_response_tokens([9], log_probs=[-0.1], meta_info=meta)
    assert plain.rollout_routed_experts is None
    with pytest.raises(ValueError, match="sample 2: rollout_routed_experts has 4 rows, its 6 tokens need 5"):
        Sample(tokens=[1, 2, 3, 4], index=2).append_response_tokens(args, tokens=[7, 8], log_probs=[-0.5, -0.25],
                                                                     meta_info=meta)  # fmt: skip


def test_attach_checks_the_row_count(moe_dir):
    sample = Sample(tokens=[1, 2, 3, 4], index=5)
    wrong = encode_routed_experts(torch.zeros(2, NUM_LAYERS, TOPK))  # 3 rows needed for 4 tokens
    with pytest.raises(ValueError, match="sample 5: rollout_routed_experts has 2 rows, its 4 tokens need 3"):
        attach_routed_experts(_args(moe_dir), sample, {"routed_experts": wrong})
    with pytest.raises(ValueError, match="not a multiple of num_hidden_layers × num_experts_per_tok = 2 × 2"):
        attach_routed_experts(_args(moe_dir), sample, {"routed_experts": encode_routed_experts(torch.zeros(3))})
    flag_off = PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}))
    attach_routed_experts(flag_off, sample, {"routed_experts": wrong})
    assert sample.rollout_routed_experts is None


def test_routes_of_another_top_k_are_named_as_such_not_as_a_row_count(moe_dir):
    # An engine routing 4 experts per token (another preset, a top-k override) for a model configured with 2: the
    # 3 × 2 × 4 values decoded as 6 rows of 2 × 2, and the error said the sample's tokens needed 3 rows.
    sample = Sample(tokens=[1, 2, 3, 4], index=5)
    other = encode_routed_experts(torch.zeros(3, NUM_LAYERS, 2 * TOPK))
    with pytest.raises(
        ValueError, match=rf"sample 5: .*holds {2 * TOPK} experts per token .*num_experts_per_tok={TOPK}"
    ):
        attach_routed_experts(_args(moe_dir), sample, {"routed_experts": other})


def test_engines_start_with_enable_return_routed_experts(moe_dir):
    args = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": str(moe_dir),
                                "train_backend": "fsdp", "rollout_engine": "sglang",
                                "use_rollout_routing_replay": True})  # fmt: skip
    cmd = build_sglang_command(args, host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=0,
                               memory_saver=False)  # fmt: skip
    assert cmd.count("--enable-return-routed-experts") == 1
    ref = build_reference_command(args.model_copy(update={"rollout_engine": "reference"}), host="h", port=1,
                                  random_seed=0)  # fmt: skip
    assert "--enable-return-routed-experts" in ref
    plain = args.model_copy(update={"use_rollout_routing_replay": False})
    assert "--enable-return-routed-experts" not in build_sglang_command(
        plain, host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=0, memory_saver=False
    )


@pytest.mark.sglang
@pytest.mark.gpu
def test_real_sglang_returns_routed_experts(tmp_path_factory, make_tiny_qwen3_moe):
    """SGLang with --enable-return-routed-experts: the reply's routes have the shape and range of the wire spec."""
    if importlib.util.find_spec("sglang") is None and not os.environ.get("SLIME_SGLANG_PYTHONPATH"):
        pytest.skip("needs SGLang (installed, or staged with SLIME_SGLANG_PYTHONPATH)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import asyncio

    import aiohttp

    from slime_rollout.engines.launch import launch_engines

    model_dir = make_tiny_qwen3_moe(tmp_path_factory.mktemp("sglang-moe"), torch_dtype="bfloat16")
    args = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rollout_engine": "sglang",
                                "hf_checkpoint": str(model_dir), "train_backend": "fsdp", "seed": 1,
                                "use_rollout_routing_replay": True, "rollout_num_gpus_per_engine": 1,
                                "sglang_args": {"disable_cuda_graph": True, "max_total_tokens": "8192"}})  # fmt: skip

    async def ask(url: str) -> dict:
        body = {"input_ids": PROMPT, "return_logprob": True, "return_routed_experts": True,
                "sampling_params": {"max_new_tokens": 5, "temperature": 0.0, "ignore_eos": True}}  # fmt: skip
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            async with session.post(f"{url}/generate", json=body) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()

    with launch_engines(args, num_engines=1, gpus_per_engine=1, colocate=False, mem_fraction_static=0.5,
                        startup_timeout_s=600, log_dir=tmp_path_factory.mktemp("sglang-moe-logs"),
                        base_port=34000) as group:  # fmt: skip
        reply = asyncio.run(ask(group.urls[0]))
    meta = reply["meta_info"]
    routes = decode_routed_experts(meta["routed_experts"], num_layers=NUM_LAYERS, topk=TOPK)
    assert routes.shape[0] == meta["prompt_tokens"] + meta["completion_tokens"] - 1
    assert int(routes.min()) >= 0 and int(routes.max()) < NUM_EXPERTS
    assert all(len(set(row)) == TOPK for row in routes.reshape(-1, TOPK).tolist())  # distinct experts per token


def test_reference_engine_takes_per_expert_matrices_into_its_fused_experts(served):
    # What the FSDP trainer pushes (and SGLang loads): one matrix per expert, under the checkpoint's names.
    fused = served.model.state_dict()["model.layers.1.mlp.experts.gate_up_proj"]
    before = fused.clone()
    up = torch.full((fused.shape[1] // 2, fused.shape[2]), 0.25)
    assert served.weights.load_named_tensors([("model.layers.1.mlp.experts.5.up_proj.weight", up)]) == 1
    assert torch.equal(fused[5, fused.shape[1] // 2 :], up)
    assert torch.equal(fused[5, : fused.shape[1] // 2], before[5, : fused.shape[1] // 2])  # gate rows untouched
    assert torch.equal(fused[:5], before[:5]) and torch.equal(fused[6:], before[6:])
    served.weights.load_named_tensors([("model.layers.1.mlp.experts.gate_up_proj", before)])  # restore
    with pytest.raises(ValueError, match="shape mismatch"):
        served.weights.load_named_tensors([("model.layers.1.mlp.experts.5.up_proj.weight", torch.zeros(3, 3))])


async def test_multi_turn_model_turns_keep_the_routes(moe_dir):
    from slime_rollout.generation.multi_turn import _model_turn

    class _Tok:
        def decode(self, ids):
            return "ab"

    client, sample = _Client(), Sample(tokens=[1, 2, 3], index=4)
    await _model_turn(client, _Tok(), sample, {"max_new_tokens": 8}, 8, _args(moe_dir))
    assert client.payloads[0]["return_routed_experts"] is True
    assert sample.rollout_routed_experts[:, 0, 0].tolist() == [0, 1, 2, 3]
    sample.append_response_tokens([9], trainable=False)  # a tool observation, then the next model turn
    await _model_turn(client, _Tok(), sample, {"max_new_tokens": 8}, 8, _args(moe_dir))
    assert sample.rollout_routed_experts.shape[0] == len(sample.tokens) - 1 == 7
