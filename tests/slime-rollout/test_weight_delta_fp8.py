"""Delta weight sync of an FP8 push (`--update-weight-mode delta` with a blockwise-FP8 `--hf-checkpoint`).

The pushed e4m3 weights and float32 scales are what an FP8 engine holds: the sender's base keeps their bytes (no cast to
the engine's compute dtype), and the reference engine rebuilds them from the FP8 tensors it received, not from the
dequantized weights it computes with. Exact: the engine must then hold dequant(quant(w)) bit for bit.
"""

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_core.fp8 import (
    FP8_DTYPE,
    SCALE_SUFFIX,
    Fp8Config,
    dequantize_blockwise,
    quantize_blockwise,
    quantize_buckets,
)
from slime_rollout.engines.reference.delta import apply_delta_request
from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.weight_delta import DeltaBase, DeltaChecksumError, UpdateWeightsFromDeltaReq
from slime_rollout.weight_sync.updaters import write_hf_checkpoint

FP8 = Fp8Config(weight_block_size=(32, 32))
Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def fp8_engine(private_tmp, tiny_qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    quantized = quantize_buckets([list(state.items())], FP8)
    out = write_hf_checkpoint(quantized, private_tmp / "fp8-delta", assets_from=tiny_qwen3_dir)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = FP8.to_quantization_config()
    (out / "config.json").write_text(json.dumps(config))
    return ReferenceModel(str(out)), state


def _served(state):
    """dequant(quant(w)) for the quantized linears, w for the rest (what an FP8 engine computes with)."""
    block = FP8.weight_block_size
    return {
        n: dequantize_blockwise(*quantize_blockwise(w, block), block) if ".layers." in n and n.endswith("_proj.weight")
        else w
        for n, w in state.items()
    }  # fmt: skip


def _assert_holds(engine, state):
    held = engine.model.state_dict()
    for name, w in _served(state).items():
        assert torch.equal(held[name], w), name


def _request(base, deltas, version):
    return UpdateWeightsFromDeltaReq(
        serialized_named_tensors=[""],  # unused: the payloads are passed decoded
        checksums={d.name: d.checksum for d in deltas},
        base_version=str(base.version),
        weight_version=version,
    )


def _payloads(deltas):
    return [(d.name, torch.from_numpy(d.payload.copy())) for d in deltas]


def test_fp8_pushes_go_full_then_as_deltas_and_the_engine_holds_them_exactly(fp8_engine):
    engine, state = fp8_engine
    base = DeltaBase(encoding="xor", algorithm="xxh3-128", dtype=torch.float32)  # the engine's compute dtype

    # Full push: the quantized tensors travel as they are (before: cast to float32, the engine refused the push with
    # 'FP8 tensors without their partner', its scales arriving without FP8 weights).
    v1 = {k: v + 0.01 for k, v in state.items()}
    sent = base.record_full(next(quantize_buckets([list(v1.items())], FP8)))
    dtypes = dict((n, t.dtype) for n, t in sent)
    assert dtypes[Q] == FP8_DTYPE and dtypes[Q.removesuffix(".weight") + SCALE_SUFFIX] == torch.float32
    assert dtypes["model.norm.weight"] == torch.float32
    engine.weights.load_named_tensors(sent)
    base.commit("1")
    _assert_holds(engine, v1)

    # A delta that changes one FP8 weight's bytes but not its block scales (one element's sign flipped: same block
    # max): only the weight travels; the engine pairs it with the scale it holds.
    v2 = {k: v.clone() for k, v in v1.items()}
    assert v2[Q][1, 1] != 0
    v2[Q][1, 1] = -v2[Q][1, 1]
    v2["model.norm.weight"] += 0.5
    base.begin()
    deltas = base.encode_bucket(next(quantize_buckets([list(v2.items())], FP8)))
    assert sorted(d.name for d in deltas) == sorted([Q, "model.norm.weight"])
    assert apply_delta_request(engine, _payloads(deltas), _request(base, deltas, "2")) == 2
    base.commit("2")
    _assert_holds(engine, v2)

    # Every quantized tensor changes (weights and scales): rebuilt from the held e4m3 bytes and scales.
    v3 = {k: v * 1.5 for k, v in v2.items()}
    base.begin()
    deltas = base.encode_bucket(next(quantize_buckets([list(v3.items())], FP8)))
    assert any(d.name.endswith(SCALE_SUFFIX) for d in deltas)

    # A flipped payload byte: refused naming the tensor, nothing applied (FP8 halves included).
    flipped = [dataclasses.replace(d, payload=d.payload.copy()) for d in deltas]
    flipped[-1].payload[len(flipped[-1].payload) // 2] ^= 0x5A
    with pytest.raises(DeltaChecksumError, match=rf"delta for '{flipped[-1].name}'"):
        apply_delta_request(engine, _payloads(flipped), _request(base, flipped, "3"))
    _assert_holds(engine, v2)

    assert apply_delta_request(engine, _payloads(deltas), _request(base, deltas, "3")) == len(deltas)
    _assert_holds(engine, v3)
