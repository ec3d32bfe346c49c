"""Weight-sync content check: SGLang's checksums, the draw over a push, and the comparison with the engines.

`tensor_checksum` is held to SGLang's own kernel: the known answers below were computed by
`sglang.kernels.ops.memory.gpu_tensor_hash` (sglang 0.5.16) run under Triton's interpreter on these inputs, and the
GPU wire fixtures add checksums the real server gave. Against the running reference engine (fp32): what was
pushed checks equal; a push the engine did not get is named. Fake engines check TP and missing endpoints.
"""

import asyncio
import collections

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_rollout.engines.client import EngineClient, RolloutClient
from slime_rollout.engines.transport import EngineError
from slime_rollout.engines.weight_checksum import (
    parts_checksum,
    sglang_checksums,
    sglang_param_name,
    tensor_checksum,
)
from slime_rollout.weight_sync.check import PushChecksums, check_engines, engine_checksums, engine_weight_dtype
from slime_rollout.weight_sync.updaters import TensorWeightUpdater

# (input, SGLang's checksum): several tiles, a padded last word, several dtypes.
KNOWN = [
    (lambda: torch.linspace(-3, 3, 1000 * 37).reshape(1000, 37).to(torch.bfloat16), "1db8f1a3df2b7b7b"),
    (lambda: torch.arange(16389, dtype=torch.float32) * 0.25, "d8317136f7bc056c"),
    (lambda: torch.arange(11, dtype=torch.uint8), "9555a0d21e1d5e68"),
    (lambda: torch.ones(7, dtype=torch.bfloat16), "2acc65cd2483416c"),
]


@pytest.mark.parametrize("make,want", KNOWN)
def test_checksum_equals_sglangs_kernel(make, want):
    assert tensor_checksum(make()) == want
    assert tensor_checksum(make().reshape(-1)) == want  # bytes, not shape
    assert tensor_checksum(torch.empty(0)) == "0000000000000000"


def _numpy_checksum(data: bytes) -> str:
    """The module docstring's function written again in numpy uint32 (wrapping arithmetic), one pass per step."""
    import numpy as np

    v = np.frombuffer(data + bytes(-len(data) % 4), dtype="<u4")
    n = v.size
    i = np.arange(n, dtype=np.uint64).astype(np.uint32)

    def fmix(x):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x85EBCA6B)
        x = x ^ (x >> np.uint32(13))
        x = x * np.uint32(0xC2B2AE35)
        return x ^ (x >> np.uint32(16))

    def rotl(x, r):
        return (x << np.uint32(r)) | (x >> np.uint32(32 - r))

    s1 = np.uint32(0x243F6A88)
    s2 = np.uint32(((0x243F6A88 * 0x9E3779B1) ^ 0xDEADBEEF) & 0xFFFFFFFF)
    k1 = fmix(v ^ ((i * np.uint32(0x27D4EB2D) + s1) ^ rotl(i, 15)))
    k2 = fmix(v ^ ((i * np.uint32(0x165667B1) + s2) ^ rotl(i, 13)))

    def tiles(k):  # fmix32(Σ k over each tile of 8192 words, mod 2^32, ^ the byte count)
        sums = [int(k[t : t + 8192].astype(np.uint64).sum()) & 0xFFFFFFFF for t in range(0, n, 8192)]
        return fmix(np.array(sums, dtype=np.uint32) ^ np.uint32(4 * n & 0xFFFFFFFF))

    total = sum((int(h1) << 32) + int(h2) for h1, h2 in zip(tiles(k1), tiles(k2), strict=True))
    x = total & (2**64 - 1)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & (2**64 - 1)
    return f"{x ^ (x >> 31):016x}"


def test_checksum_over_several_passes_and_a_view_off_word_boundaries():
    # 2 passes of 2M words and a partial tile: the per-pass positions, the tile sums of the last, partial tile and the
    # zero-padded last word; then a bf16 view that starts 2 bytes into its storage (no aligned int32 view of it).
    g = torch.Generator().manual_seed(0)
    whole = torch.randn(2 * 8192 * 256 + 5001, generator=g).to(torch.bfloat16)
    for t in (whole, whole[1:], torch.arange(11, dtype=torch.uint8)):
        assert tensor_checksum(t) == _numpy_checksum(t.contiguous().view(torch.uint8).numpy().tobytes())
    assert _numpy_checksum(torch.ones(7, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()) == KNOWN[3][1]


def test_parts_hash_as_their_concatenation_without_concatenating():
    # Parts of 5000, 3 and 20000 words start mid-tile (tiles are 8192 words); a 2-byte last part pads its word; a
    # 6-byte part in the middle shifts every later word boundary (concatenated bytes, then hashed).
    g = torch.Generator().manual_seed(4)
    parts = [torch.randn(5000, generator=g), torch.randn(3, generator=g), torch.randn(100, 200, generator=g),
             torch.ones(1, dtype=torch.bfloat16)]  # fmt: skip
    whole = torch.cat([p.reshape(-1).view(torch.uint8) for p in parts])
    assert parts_checksum(parts) == tensor_checksum(whole)
    shifted = [parts[0], torch.ones(3, dtype=torch.float16), parts[2]]
    assert parts_checksum(shifted) == tensor_checksum(torch.cat([p.reshape(-1).view(torch.uint8) for p in shifted]))
    assert parts_checksum([torch.zeros(0), torch.zeros(0)]) == "0" * 16


def test_checksum_sees_one_flipped_bit():
    t = torch.linspace(-3, 3, 20000).to(torch.bfloat16)
    u = t.clone()
    u.view(torch.int16)[12345] ^= 1
    assert tensor_checksum(t) != tensor_checksum(u)


def test_sglang_names_and_fused_parameters():
    layer = "model.layers.3."
    assert sglang_param_name(layer + "self_attn.q_proj.weight") == (layer + "self_attn.qkv_proj.weight", 0, 3)
    assert sglang_param_name(layer + "mlp.up_proj.weight") == (layer + "mlp.gate_up_proj.weight", 1, 2)
    assert sglang_param_name(layer + "self_attn.q_norm.weight") == (layer + "self_attn.q_norm.weight", 0, 1)
    assert sglang_param_name("model.language_model.layers.0.mlp.down_proj.weight") == (
        "model.layers.0.mlp.down_proj.weight",
        0,
        1,
    )
    assert sglang_param_name("model.visual.blocks.0.attn.qkv.weight") == ("visual.blocks.0.attn.qkv_proj.weight", 0, 1)
    q, k, v = (torch.full((r, 4), float(i)) for i, r in enumerate((4, 2, 2)))
    named = [("m.layers.0.self_attn.v_proj.weight", v), ("m.layers.0.self_attn.q_proj.weight", q),
             ("m.layers.0.self_attn.k_proj.weight", k)]  # fmt: skip
    got = sglang_checksums(named, dtype=torch.bfloat16)
    assert got == {"m.layers.0.self_attn.qkv_proj.weight": tensor_checksum(torch.cat([q, k, v]).to(torch.bfloat16))}
    with pytest.raises(ValueError, match="parts \\[0, 2\\] of 3"):
        sglang_checksums(named[:2], dtype=torch.bfloat16)


def _push(num_layers=5):
    """Buckets of a small Qwen3-like push; q/k/v of a layer split over two buckets."""
    g = torch.Generator().manual_seed(0)
    buckets = []
    for i in range(num_layers):
        p = f"model.layers.{i}."
        buckets.append([(p + "self_attn.q_proj.weight", torch.randn(4, 4, generator=g)),
                        (p + "self_attn.k_proj.weight", torch.randn(2, 4, generator=g))])  # fmt: skip
        buckets.append([(p + "self_attn.v_proj.weight", torch.randn(2, 4, generator=g)),
                        (p + "input_layernorm.weight", torch.randn(4, generator=g))])  # fmt: skip
    return buckets


def test_push_checksums_assemble_fused_parts_across_buckets_as_copies():
    buckets = _push()
    sample = PushChecksums(100, seed=0, dtype=torch.bfloat16)
    assert len([b for b in sample.watch(iter(buckets))]) == len(buckets)  # passed through
    expected = sglang_checksums([t for b in _push() for t in b], dtype=torch.bfloat16)
    assert sample.checksums == expected and len(expected) == 10 and sample.incomplete == []
    buckets = _push()
    again = PushChecksums(100, seed=0, dtype=torch.bfloat16)
    for bucket in again.watch(iter(buckets)):
        for _, t in bucket:
            t.zero_()  # the trainer reuses its buffers once a bucket is sent: the draw holds copies
    assert again.checksums == expected


def test_push_checksums_draw_is_uniform_over_engine_parameters():
    counts = collections.Counter()
    for seed in range(2000):
        sample = PushChecksums(2, seed=seed, dtype=torch.float32)
        list(sample.watch(iter(_push())))
        assert len(sample.checksums) == 2 and sample.incomplete == []
        counts.update(list(sample.checksums))
    # 10 engine parameters (5 fused qkv, 5 norms), each drawn with probability 2/10: 400 of 2000, std ~18.
    assert len(counts) == 10 and all(abs(c - 400) < 90 for c in counts.values()), counts


def test_push_checksums_count_names_the_engine_does_not_hold():
    names = {f"model.layers.{i}.self_attn.qkv_proj.weight" for i in range(5)}
    sample = PushChecksums(3, seed=1, dtype=torch.float32, engine_names=names)
    list(sample.watch(iter(_push())))
    assert set(sample.checksums) <= names and len(sample.checksums) == 3
    assert sample.unmatched == 5 and "input_layernorm" in sample.unmatched_example


class FakeEngine:
    """Answers `/weights_checker` with the given per-rank checksums, or with an HTTP error."""

    def __init__(self, ranks, status=None):
        self.url, self.ranks, self.status = "http://fake:1", ranks, status

    async def request(self, method, route, payload=None, **kw):
        assert (method, route, payload) == ("POST", "/weights_checker", {"action": "checksum"})
        if self.status is not None:
            raise EngineError(self.url, route, "Not Found", self.status)
        return {"success": True, "message": "Success.", "ranks": [{"checksums": r} for r in self.ranks]}


def test_check_engines_compares_and_names_the_difference():
    want = {"a.qkv_proj.weight": "1" * 16, "a.input_layernorm.weight": "2" * 16}
    report = asyncio.run(check_engines([FakeEngine([dict(want)])], want))
    assert (report.checked, report.mismatches) == (2, [])
    wrong = FakeEngine([{**want, "a.qkv_proj.base_layer.weight": "3" * 16}])  # LoRA wrapper names: stripped
    del wrong.ranks[0]["a.qkv_proj.weight"]
    report = asyncio.run(check_engines([wrong], want))
    assert report.checked == 2 and report.mismatches == [
        f"http://fake:1 a.qkv_proj.weight: engine checksum {'3' * 16} (TP rank 0), expected {'1' * 16}"
    ]
    tp2 = FakeEngine([dict(want), {**want, "a.qkv_proj.weight": "9" * 16}])  # shards differ per rank
    report = asyncio.run(check_engines([tp2], want))
    assert (report.checked, report.sharded, report.mismatches) == (1, 1, [])  # the norm, replicated, compared
    report = asyncio.run(check_engines([FakeEngine([], status=404)], want))
    assert (report.checked, report.unsupported) == (0, 1)
    with pytest.raises(EngineError):
        asyncio.run(check_engines([FakeEngine([], status=500)], want))  # a broken engine is not "unsupported"


def test_an_engine_listing_none_of_the_drawn_tensors_is_named_blind_not_passed():
    """The names are drawn from the first engine's list; a second engine listing none of them compared nothing, and
    the check passed on the first engine's comparisons alone (the pairs were counted as missing, never reported)."""
    want = {"a.qkv_proj.weight": "1" * 16, "a.input_layernorm.weight": "2" * 16}
    other = FakeEngine([{"b.qkv_proj.weight": "1" * 16}])
    other.url = "http://other:2"
    partial = FakeEngine([{"a.qkv_proj.weight": "1" * 16}])
    partial.url = "http://partial:3"
    report = asyncio.run(check_engines([FakeEngine([dict(want)]), other, partial], want))
    assert (report.checked, report.missing, report.mismatches) == (3, 3, [])
    assert report.blind == ["http://other:2"]  # the partial one compared a tensor: counted missing, not blind
    assert report.metrics()["weight_check/tensors_missing"] == 3.0


class ReplyEngine(FakeEngine):
    """Answers `/weights_checker` 200 with the given body as it is."""

    def __init__(self, reply):
        super().__init__([])
        self.reply = reply

    async def request(self, method, route, payload=None, **kw):
        return self.reply


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ({"success": True, "message": "Success.", "ranks": []}, "no per-rank checksums"),
        ({"success": True, "message": "Success."}, "no per-rank checksums"),
        ('{"success": true, "ranks": [{"checks', "no per-rank checksums"),  # a body cut short: not JSON
        ({"success": True, "ranks": [{"per_gpu_checksum": "ab"}]}, r"ranks\[0\] has no checksums object"),
    ],
)
def test_a_checksum_reply_that_holds_nothing_is_an_engine_error_not_a_pass(reply, said):
    """An empty `ranks` counted every tensor it was asked about as checked and equal: the check passed on nothing."""
    want = {"a.qkv_proj.weight": "1" * 16}
    with pytest.raises(EngineError, match=said) as e:
        asyncio.run(check_engines([FakeEngine([dict(want)]), ReplyEngine(reply)], want))
    assert e.value.url == "http://fake:1" and e.value.endpoint == "/weights_checker"


def test_engine_weight_dtype_follows_each_engines_rules(tmp_path):
    from slime_core.config import SlimeArgs

    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "torch_dtype": "float32"}')
    base = {"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": str(tmp_path)}
    cfg = lambda **kw: SlimeArgs.from_dict({**base, **kw})  # noqa: E731
    assert engine_weight_dtype(cfg(rollout_engine="sglang")) == torch.float16  # SGLang's auto: fp32 → fp16
    assert engine_weight_dtype(cfg(rollout_engine="sglang", sglang_args={"dtype": "bfloat16"})) == torch.bfloat16
    assert engine_weight_dtype(cfg(rollout_engine="reference")) == torch.float32
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "dtype": "bfloat16"}')
    assert engine_weight_dtype(cfg(rollout_engine="sglang")) == torch.bfloat16


@pytest.fixture(scope="module")
def hf_state(tiny_qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    return {k: v.clone() for k, v in model.state_dict().items()}, model.config


async def _ranks(url):
    engine = EngineClient(url, timeout=60)
    try:
        return await engine_checksums(engine)
    finally:
        await engine.aclose()


def _check(url, checksums):
    async def go():
        engine = EngineClient(url, timeout=60)
        try:
            return await check_engines([engine], checksums)
        finally:
            await engine.aclose()

    return asyncio.run(go())


@pytest.mark.slow  # several engine processes (10-30 s): the full CI pass runs it
def test_reference_engine_reads_back_pushed_tensors(reference_engine, hf_state, tiny_qwen3_dir):
    from slime_core.config import SlimeArgs

    url = reference_engine.urls[0]
    original, config = hf_state
    g = torch.Generator().manual_seed(5)
    new = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    if config.tie_word_embeddings:
        del new["lm_head.weight"]  # one tensor on the engine: pushing both would overwrite the first (trainers skip it)
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
    updater = TensorWeightUpdater(cfg, RolloutClient([url]), load_format=None)
    try:
        engine_names = set().union(*asyncio.run(_ranks(url)))
        assert "model.layers.0.self_attn.qkv_proj.weight" in engine_names and "lm_head.weight" not in engine_names
        sample = PushChecksums(len(engine_names), seed=1, dtype=torch.float32, engine_names=engine_names)
        updater.update(sample.watch(iter([list(new.items())])), "7")  # k = all: every parameter is compared
        report = _check(url, sample.checksums)
        assert report.checked == len(engine_names) and report.mismatches == [] and sample.unmatched == 0
        # The engine missed an update: it still holds `new`, the trainer believes it pushed `original`.
        stale = PushChecksums(3, seed=2, dtype=torch.float32, engine_names=engine_names)
        list(stale.watch(iter([[(k, v) for k, v in original.items() if k in new]])))
        report = _check(url, stale.checksums)
        assert len(report.mismatches) == 3 and all(url in m for m in report.mismatches)
        # A LoRA run compares the base the engine serves with the checkpoint (here: the engine holds `new`).
        base = PushChecksums.from_checkpoint(tiny_qwen3_dir, 2, seed=0, dtype=torch.float32, engine_names=engine_names)
        assert len(base.checksums) == 2 and len(_check(url, base.checksums).mismatches) == 2
        # As SGLang's Qwen3 class (no get_weights_by_name): HTTP 400 for every name.
        with pytest.raises(EngineError, match="400"):
            asyncio.run(EngineClient(url).get_weights_by_name("model.norm.weight"))
    finally:
        restore = RolloutClient([url]).broadcast(
            "update_weights_from_disk", model_path=str(tiny_qwen3_dir), weight_version="default"
        )
        asyncio.run(restore)
    base = PushChecksums.from_checkpoint(tiny_qwen3_dir, 2, seed=0, dtype=torch.float32, engine_names=engine_names)
    assert _check(url, base.checksums).checked == 2 and _check(url, base.checksums).mismatches == []


def test_fp8_weights_hash_dequantized_as_sglangs_checker_and_scales_are_not_listed():
    """SGLang 0.5.16 hashes a block-FP8 weight as `block_quant_dequant(q, s)` in bfloat16 and lists no scale; the
    H200 FP8 run compared raw e4m3 bytes and stopped at the first weight check."""
    from slime_core.fp8 import pair_fp8, quantize_blockwise
    from slime_rollout.engines.weight_checksum import sglang_fp8_comparable

    g = torch.Generator().manual_seed(3)
    w = torch.randn(256, 384, generator=g)
    q, s = quantize_blockwise(w, (128, 128))
    want = tensor_checksum((q.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.bfloat16))
    assert tensor_checksum(sglang_fp8_comparable(q, s)) == want
    name = "model.layers.0.mlp.down_proj.weight"
    norm = ("model.layers.0.input_layernorm.weight", torch.ones(8))
    for bucket in ([(name, q), (name + "_scale_inv", s), norm], [(name + "_scale_inv", s), norm, (name, q)]):
        sample = PushChecksums(10, seed=0, dtype=torch.bfloat16, engine_names={name, norm[0]})
        for _ in sample.watch([bucket]):
            pass
        assert sample.checksums[name] == want
        assert sample.unmatched == 0  # the scale is hashed with its weight, not looked up as an engine name
        assert sglang_checksums(bucket, dtype=torch.bfloat16) == sample.checksums
    with pytest.raises(ValueError, match=r"down_proj.weight_scale_inv \(no weight\)"):
        list(pair_fp8([(name + "_scale_inv", s)]))


def test_engine_weight_dtype_asks_the_engine_record(tmp_path):
    # A package's engine says how it loads weights; nothing compares the engine's name.
    from slime_core.config import SlimeArgs
    from slime_core.extensions import ROLLOUT_ENGINES, RolloutEngineSpec

    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "torch_dtype": "float32"}')
    base = {"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": str(tmp_path)}
    specs = [
        RolloutEngineSpec(name="stored_engine", auto_dtype_as_stored=True),  # "auto" as transformers reads it
        RolloutEngineSpec(name="bf16_engine", default_dtype="bfloat16"),
    ]
    for spec in specs:
        ROLLOUT_ENGINES.register(spec)
    try:
        stored = SlimeArgs.from_dict({**base, "rollout_engine": "stored_engine"})
        assert engine_weight_dtype(stored) == torch.float32  # SGLang's rule would serve it in float16
        assert engine_weight_dtype(SlimeArgs.from_dict({**base, "rollout_engine": "bf16_engine"})) == torch.bfloat16
        half = SlimeArgs.from_dict({**base, "rollout_engine": "bf16_engine", "sglang_args": {"dtype": "half"}})
        assert engine_weight_dtype(half) == torch.float16  # the flag wins over the record's default
    finally:
        for spec in specs:
            ROLLOUT_ENGINES.unregister(spec.name)


# ------------------------------------------------------------------------------------------------- MoE experts
# SGLang 0.5.16 (`layers/moe/fused_moe_triton/layer.py`) holds a layer's E experts as `experts.w13_weight` [E, 2I, H]
# (expert e: gate rows, then up rows) and `experts.w2_weight` [E, H, I]. A Qwen3-MoE H100 run logged "4 tensor
# checksums equal (0 sharded, 48 unmatched names)": every per-expert tensor was unmatched, no expert ever compared.


def _experts(num_experts=3, inter=2, hidden=4, seed=0):
    """One layer's per-expert checkpoint matrices `{(e, proj): tensor}`: gate/up `[I, H]`, down `[H, I]`."""
    g = torch.Generator().manual_seed(seed)
    return {(e, proj): torch.randn(*((hidden, inter) if proj == "down_proj" else (inter, hidden)), generator=g)
            for e in range(num_experts) for proj in ("gate_proj", "up_proj", "down_proj")}  # fmt: skip


def test_sglang_names_of_moe_experts():
    experts = "model.layers.1.mlp.experts"
    w13, w2 = experts + ".w13_weight", experts + ".w2_weight"
    assert sglang_param_name(experts + ".0.gate_proj.weight", num_experts=8) == (w13, 0, 16)
    assert sglang_param_name(experts + ".3.up_proj.weight", num_experts=8) == (w13, 7, 16)
    assert sglang_param_name(experts + ".7.gate_proj.weight", num_experts=8) == (w13, 14, 16)
    assert sglang_param_name(experts + ".5.down_proj.weight", num_experts=8) == (w2, 5, 8)
    # transformers >= 5's fused expert parameters are the whole SGLang parameter.
    assert sglang_param_name(experts + ".gate_up_proj") == (w13, 0, 1)
    assert sglang_param_name(experts + ".down_proj") == (w2, 0, 1)
    # Without the expert count: the dense mapping, as before (no engine holds it: counted unmatched).
    assert sglang_param_name(experts + ".3.up_proj.weight") == (experts + ".3.gate_up_proj.weight", 1, 2)
    # Not experts: a shared expert and the router keep their names.
    shared = "model.layers.0.mlp.shared_expert.gate_proj.weight"
    assert sglang_param_name(shared, num_experts=8) == ("model.layers.0.mlp.shared_expert.gate_up_proj.weight", 0, 2)
    router = "model.layers.0.mlp.gate.weight"
    assert sglang_param_name(router, num_experts=8) == (router, 0, 1)
    with pytest.raises(ValueError, match=r"experts.8.down_proj.weight: expert 8 of a model with 8 experts"):
        sglang_param_name(experts + ".8.down_proj.weight", num_experts=8)


def test_per_expert_tensors_hash_as_sglangs_fused_moe_parameters():
    mats = _experts()
    # SGLang's layout built independently: w13[e] = [gate_e; up_e] (w1 at offset 0, w3 at offset I), w2[e] = down_e.
    w13 = torch.stack([torch.cat([mats[e, "gate_proj"], mats[e, "up_proj"]]) for e in range(3)])  # [E, 2I, H]
    w2 = torch.stack([mats[e, "down_proj"] for e in range(3)])  # [E, H, I]
    p = "m.layers.0.mlp.experts"
    named = [(f"{p}.{e}.{proj}.weight", t) for (e, proj), t in reversed(mats.items())]  # any order
    got = sglang_checksums(named, dtype=torch.bfloat16, num_experts=3)
    want = {f"{p}.w13_weight": tensor_checksum(w13.to(torch.bfloat16)), f"{p}.w2_weight": tensor_checksum(
        w2.to(torch.bfloat16))}  # fmt: skip
    assert got == want
    fused = sglang_checksums([(f"{p}.gate_up_proj", w13), (f"{p}.down_proj", w2)], dtype=torch.bfloat16)
    assert fused == want  # the reference engine's transformers parameters answer the same
    with pytest.raises(ValueError, match=r"w13_weight: parts \[0, 1, 2, 3, 4\] of 6"):  # expert 2's up missing
        sglang_checksums([n for n in named if n[0] != f"{p}.2.up_proj.weight"], dtype=torch.bfloat16, num_experts=3)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, make_tiny_qwen3_moe):
    """qwen3-moe-tiny's shape (2 layers of 8 experts of 32, hidden 64), fp32; per-expert names on disk."""
    return make_tiny_qwen3_moe(tmp_path_factory.mktemp("weight-check-moe"))


class AppEngine:
    """An engine client over the reference engine's app in-process (`/weights_checker` as the server answers)."""

    url = "http://moe:1"

    def __init__(self, client):
        self.client = client

    async def request(self, method, route, payload=None, **kw):
        reply = self.client.request(method, route, json=payload)
        assert reply.status_code == 200, reply.text
        return reply.json()


def _moe_push(served, seed, swap=None):
    """New weights for every tensor as the trainer pushes them (per-expert names), and as the engine gets them.

    `swap`: two pushed names whose tensors the engine receives under each other's name (a wrong mapping).
    """
    from slime_core.moe_experts import split_experts

    g = torch.Generator().manual_seed(seed)
    state = served.model.state_dict()
    state.pop("lm_head.weight")  # tied: the embedding
    named = [item for k, v in state.items() for item in split_experts(k, v)]
    pushed = [(n, t + 0.1 * torch.randn(t.shape, generator=g)) for n, t in named]
    received = dict(pushed)
    if swap is not None:
        a, b = swap
        received[a], received[b] = received[b], received[a]
    return pushed, list(received.items())


def test_a_pushed_qwen3_moe_checks_equal_on_the_reference_engine_and_a_swapped_expert_is_named(moe_dir):
    from fastapi.testclient import TestClient

    from slime_rollout.engines.reference.model import ReferenceModel
    from slime_rollout.engines.reference.server import build_app

    served = ReferenceModel(str(moe_dir))
    app = build_app(served, max_running_requests=1, random_seed=0, server_args={})
    with TestClient(app) as client:
        engine = AppEngine(client)
        names = set().union(*asyncio.run(engine_checksums(engine)))
        experts = {f"model.layers.{i}.mlp.experts.{w}" for i in (0, 1) for w in ("w13_weight", "w2_weight")}
        assert experts <= names and not any(".gate_up_proj" in n or "experts.down_proj" in n for n in names)
        pushed, received = _moe_push(served, seed=1)
        # Per layer q/k/v/o, 2 qk-norms, 2 layer norms and the router; the embedding and final norm; 2 x 8 x 3 experts.
        assert len(pushed) == 2 * 9 + 2 + 48
        sample = PushChecksums(len(names), seed=0, dtype=torch.float32, engine_names=names, num_experts=8)
        served.weights.load_named_tensors(sample.watch(iter([received])).__next__())  # what the update route does
        assert sample.unmatched == 0 and sample.incomplete == [] and set(sample.checksums) == names
        report = asyncio.run(check_engines([engine], sample.checksums))
        assert (report.checked, report.mismatches) == (len(names), [])
        # Without the expert count (the defect): 48 unmatched, no expert drawn.
        blind = PushChecksums(len(names), seed=0, dtype=torch.float32, engine_names=names)
        list(blind.watch(iter([pushed])))
        assert blind.unmatched == 48 and not experts & set(blind.checksums)

        # Expert 2 and 5 of layer 0 swapped on the way, then gate and up of layer 1's expert 4: one mismatch each.
        for swap, wrong in [
            (("model.layers.0.mlp.experts.2.down_proj.weight", "model.layers.0.mlp.experts.5.down_proj.weight"),
             "model.layers.0.mlp.experts.w2_weight"),
            (("model.layers.1.mlp.experts.4.gate_proj.weight", "model.layers.1.mlp.experts.4.up_proj.weight"),
             "model.layers.1.mlp.experts.w13_weight"),
        ]:  # fmt: skip
            pushed, received = _moe_push(served, seed=2, swap=swap)
            sample = PushChecksums(len(names), seed=0, dtype=torch.float32, engine_names=names, num_experts=8)
            list(sample.watch(iter([pushed])))
            served.weights.load_named_tensors(received)
            report = asyncio.run(check_engines([engine], sample.checksums))
            assert report.checked == len(names) and len(report.mismatches) == 1, report.mismatches
            assert report.mismatches[0].startswith(f"http://moe:1 {wrong}: engine checksum ")
        # A LoRA run's base check reads the checkpoint (per-expert names): it holds other weights than the engine now.
        base = PushChecksums.from_checkpoint(moe_dir, 64, seed=0, dtype=torch.float32, engine_names=names,
                                             num_experts=8)  # fmt: skip
        assert experts <= set(base.checksums) and base.unmatched == 0
        served.weights.load_from_disk(str(moe_dir))
        report = asyncio.run(check_engines([engine], base.checksums))
        assert (report.checked, report.mismatches) == (len(names), [])
