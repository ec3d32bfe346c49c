"""FP8 rollout on the reference engine: it serves a blockwise-FP8 checkpoint and FP8 pushes (disk, tensor, gloo).

The engine must hold exactly dequant(quant(w)) (float32 engine: bit-equal), report SGLang's checksums of the e4m3
bytes and scales it received, and refuse an FP8 weight without its scale.
"""

import asyncio
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from slime_core.fp8 import FP8_DTYPE, Fp8Config, dequantize_blockwise, quantize_blockwise, quantize_buckets
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.process import find_free_port
from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.weight_checksum import tensor_checksum
from slime_rollout.weight_sync.check import PushChecksums
from slime_rollout.weight_sync.updaters import (
    DiskWeightUpdater,
    DistributedWeightUpdater,
    TensorWeightUpdater,
    write_hf_checkpoint,
)

FP8 = Fp8Config(weight_block_size=(32, 32))  # hidden 64: 2×2 blocks per attention projection
PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]


@pytest.fixture(scope="module")
def bf16_state(tiny_qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    return model, {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied


def _fp8_dir(tmp, tiny_qwen3_dir, state):
    out = write_hf_checkpoint(quantize_buckets([list(state.items())], FP8), tmp / "fp8", assets_from=tiny_qwen3_dir)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = FP8.to_quantization_config()
    (out / "config.json").write_text(json.dumps(config))
    return out


def _served(state):
    """What an FP8 engine computes with: dequant(quant(w)) for the quantized linears, w for the rest."""
    out = {}
    for name, w in state.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            out[name] = dequantize_blockwise(*quantize_blockwise(w, FP8.weight_block_size), FP8.weight_block_size)
        else:
            out[name] = w
    return out


def _perturbed(state, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in state.items()}


def test_reference_model_loads_fp8_and_fp8_pushes_exactly(private_tmp, tiny_qwen3_dir, bf16_state):
    _, state = bf16_state
    engine = ReferenceModel(str(_fp8_dir(private_tmp / "m1", tiny_qwen3_dir, state)))
    held = engine.model.state_dict()
    for name, w in _served(state).items():
        assert torch.equal(held[name], w), name
    assert not torch.equal(
        held["model.layers.0.self_attn.q_proj.weight"], state["model.layers.0.self_attn.q_proj.weight"]
    )

    new = _perturbed(state, 1)
    pushed = list(quantize_buckets([list(new.items())], FP8))
    assert engine.weights.load_named_tensors(pushed[0]) == len(new)
    held = engine.model.state_dict()
    for name, w in _served(new).items():
        assert torch.equal(held[name], w), name

    # /weights_checker as SGLang 0.5.16 answers it for a block-FP8 model (seen on the H200: 226 tensors for
    # qwen3-0.6b, FP8 or not): no scale is listed, and an FP8 weight hashes as its dequantized bfloat16
    # (`Fp8BlockComparable.dequantize` = `block_quant_dequant`: q·s in float32 per block, one rounding to bf16).
    checksums = engine.weights.weight_checksums()
    assert not [k for k in checksums if k.endswith("weight_scale_inv")]
    pair = dict(pushed[0])
    q = torch.cat([pair[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    s = torch.cat([pair[f"model.layers.0.self_attn.{p}_proj.weight_scale_inv"] for p in "qkv"])
    b = q.shape[-1] // s.shape[-1]
    grid = s.float().repeat_interleave(b, 0).repeat_interleave(b, 1)[: q.shape[0], : q.shape[1]]
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    assert checksums[qkv] == tensor_checksum((q.float() * grid).to(torch.bfloat16))
    assert checksums[qkv] != tensor_checksum(q)  # not the e4m3 bytes (what the H200 run compared, and failed)
    watcher = PushChecksums(8, seed=0, dtype=torch.float32, engine_names=set(checksums))
    for _ in watcher.watch(iter(pushed)):
        pass
    assert watcher.checksums and watcher.checksums == {k: checksums[k] for k in watcher.checksums}
    assert "model.layers.1.mlp.gate_up_proj.weight" in watcher.checksums


def test_an_fp8_weight_without_its_scale_is_refused_and_nothing_changes(private_tmp, tiny_qwen3_dir, bf16_state):
    _, state = bf16_state
    engine = ReferenceModel(str(_fp8_dir(private_tmp / "m2", tiny_qwen3_dir, state)))
    q, _ = quantize_blockwise(state["model.layers.0.mlp.up_proj.weight"], FP8.weight_block_size)
    with pytest.raises(ValueError, match=r"mlp.up_proj.weight \(no scale\)"):
        engine.weights.load_named_tensors([("model.layers.0.mlp.up_proj.weight", q)])
    plain = ReferenceModel(str(tiny_qwen3_dir))
    with pytest.raises(ValueError, match="served unquantized"):
        plain.weights.load_named_tensors([("model.layers.0.mlp.up_proj.weight", q)])


def _logprobs(url):
    async def go():
        client = RolloutClient([url])
        try:
            return await client.generate({"input_ids": PROMPT, "return_logprob": True,
                                          "sampling_params": {"temperature": 0.0, "max_new_tokens": 4,
                                                              "ignore_eos": True}})  # fmt: skip
        finally:
            await client.aclose()

    out = asyncio.run(go())
    return out["output_ids"], torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])


def _expected(model, state, ids):
    model.load_state_dict({**state, "lm_head.weight": state["model.embed_tokens.weight"]})
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + ids])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]


@pytest.mark.slow  # 5-12 s: runs in the full suite, not in the per-package isolation run
def test_fp8_engine_serves_disk_tensor_and_distributed_pushes(
    private_tmp, tiny_qwen3_dir, bf16_state, reference_args, engine_base_port
):
    from slime_rollout.engines.launch import launch_engines

    model, state = bf16_state
    fp8_dir = _fp8_dir(private_tmp / "m3", tiny_qwen3_dir, state)
    args = reference_args(fp8_dir, update_weight_disk_dir=str(private_tmp / "push"),
                          update_weight_disk_keep_files=True, rollout_num_gpus_per_engine=1)  # fmt: skip
    group = launch_engines(args, num_engines=1, gpus_per_engine=1, startup_timeout_s=300,
                           log_dir=private_tmp / "fp8-engine-logs", base_port=engine_base_port + 50)  # fmt: skip
    try:
        url = group.urls[0]
        ids, got = _logprobs(url)
        torch.testing.assert_close(got, _expected(model, _served(state), ids), atol=1e-5, rtol=0)
        client = RolloutClient([url])
        distributed = DistributedWeightUpdater(  # gloo carries the FP8 tensors as their bytes (wire.broadcast_buffer)
            args, client, master_address="127.0.0.1", master_port=find_free_port(start=29700), backend="gloo"
        )
        updaters = (DiskWeightUpdater(args, client), TensorWeightUpdater(args, client, load_format=None), distributed)
        for i, updater in enumerate(updaters):
            new = _perturbed(state, 10 + i)
            buckets = quantize_buckets(iter([list(new.items())[j : j + 7] for j in range(0, len(new), 7)]), FP8)
            updater.update(buckets, str(i + 1))
            ids, got = _logprobs(url)
            torch.testing.assert_close(got, _expected(model, _served(new), ids), atol=1e-5, rtol=0)
        asyncio.run(distributed.adisconnect())
        # The disk push wrote FP8 safetensors with scales (the engine reloaded that directory).
        written = {}
        for f in (private_tmp / "push" / "weight_v000001").glob("*.safetensors"):
            written.update(load_file(str(f)))
        assert written["model.layers.0.mlp.down_proj.weight"].dtype == FP8_DTYPE
        assert written["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (2, 4)  # [64, 128] in 32×32 blocks
        assert written["model.embed_tokens.weight"].dtype == torch.float32
    finally:
        group.shutdown()
