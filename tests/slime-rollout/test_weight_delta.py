"""Delta weight sync: the codec (hand-computed bytes) and delta pushes into the reference engine (tensor and disk)."""

import asyncio
import dataclasses
import re
import zlib

import numpy as np
import pytest
import torch
import xxhash
import zstandard

from slime_core.config import SlimeArgs
from slime_rollout.engines.client import EngineClient, RolloutClient
from slime_rollout.engines.weight_checksum import sglang_checksums, sglang_param_name, tensor_checksum
from slime_rollout.engines.weight_delta import (
    DeltaBase,
    DeltaChecksumError,
    checksum,
    decode,
    encode,
    verified_apply,
)
from slime_rollout.weight_sync.check import engine_checksums
from slime_rollout.weight_sync.delta_sync import (
    DeltaDiskWeightUpdater,
    DeltaTensorWeightUpdater,
    apply_delta_dir,
    read_local_version,
)
from slime_rollout.weight_sync.updaters import WeightPushError


def _cfg(**fields):
    base = {"rollout_batch_size": 1, "num_rollout": 1, "rollout_engine": "reference", "update_weight_mode": "delta"}
    return SlimeArgs.from_dict({**base, **fields})


# ------------------------------------------------------------------------------------------------ codec


def _raw(payload):
    return np.frombuffer(zstandard.ZstdDecompressor().decompress(payload.tobytes()), dtype=np.uint8)


def test_xor_and_overwrite_payloads_hold_the_hand_computed_bytes():
    old = np.array([1, 2, 0, 4, 9], dtype=np.uint8)
    new = np.array([1, 2, 3, 4, 8], dtype=np.uint8)
    xor, changed = encode(new, old, "xor")
    assert changed == 2
    assert _raw(xor).tolist() == [0, 0, 3, 0, 1]  # 0^3, 9^8
    over, changed = encode(new, old, "overwrite")
    assert changed == 2
    # <u4 count 2, <u4 positions 2 and 4, then the new values 3 and 8
    assert _raw(over).tolist() == [2, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 3, 8]
    for payload, enc in ((xor, "xor"), (over, "overwrite")):
        assert decode(old, payload, enc).tolist() == new.tolist()
    assert encode(old.copy(), old, "xor") == (None, 0)


def test_overwrite_is_idempotent_and_xor_reverts_when_applied_twice():
    old = np.arange(16, dtype=np.uint8)
    new = old.copy()
    new[[3, 7]] = 200
    over, _ = encode(new, old, "overwrite")
    assert decode(decode(old, over, "overwrite"), over, "overwrite").tolist() == new.tolist()
    xor, _ = encode(new, old, "xor")
    assert decode(decode(old, xor, "xor"), xor, "xor").tolist() == old.tolist()


def test_checksums_match_independent_implementations():
    data = np.frombuffer(b"abc", dtype=np.uint8)
    assert checksum("adler32", data) == "024d0127"  # Adler-32 of "abc" (RFC 1950's example family)
    assert checksum("adler32", data) == f"{zlib.adler32(b'abc'):08x}"
    assert checksum("xxh3-128", data) == xxhash.xxh3_128_hexdigest(b"abc")
    with pytest.raises(ValueError, match="unknown algorithm 'md5'"):
        checksum("md5", data)


def test_a_corrupt_payload_or_a_wrong_base_is_named_and_refused():
    old = np.zeros(8, dtype=np.uint8)
    new = np.arange(8, dtype=np.uint8)
    payload, _ = encode(new, old, "xor")
    good = checksum("xxh3-128", new)
    assert verified_apply("w", old, payload, encoding="xor", algorithm="xxh3-128", expected=good).tolist() == list(
        range(8)
    )
    with pytest.raises(DeltaChecksumError, match="'layers.0.w'.*checksum"):
        verified_apply("layers.0.w", old + 1, payload, encoding="xor", algorithm="xxh3-128", expected=good)
    bad = payload.copy()
    bad[-1] ^= 0xFF
    with pytest.raises(DeltaChecksumError, match="'layers.0.w'"):
        verified_apply("layers.0.w", old, bad, encoding="xor", algorithm="xxh3-128", expected=good)


def test_delta_base_sends_only_changed_tensors_and_counts_bytes():
    base = DeltaBase(encoding="xor", algorithm="xxh3-128", dtype=torch.bfloat16)
    a, b = torch.ones(4, 4), torch.zeros(8)
    assert base.begin() is False  # nothing acknowledged yet: full
    base.record_full([("a", a), ("b", b)])
    assert base.stats.wire_bytes == (16 + 8) * 2 and base.nbytes == 48
    assert base.begin() is False  # recorded but not committed: still full
    base.commit("1")
    assert base.begin() is True
    deltas = base.encode_bucket([("a", a), ("b", b + 1)])  # a frozen, b changed
    assert [d.name for d in deltas] == ["b"]
    s = base.stats
    # b: bf16 0 -> 1.0 (0x0000 -> 0x3F80) changes both bytes of all 8 elements
    assert (s.num_tensors, s.num_sent, s.total_bytes, s.changed_bytes) == (2, 1, 48, 16)
    assert s.metrics()["perf/update_weights_sent_fraction"] == 0.5
    base.invalidate()
    assert base.begin() is False


# ------------------------------------------------------------------------------------- reference engine


@pytest.fixture(scope="module")
def model_state(tiny_qwen3_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")  # as the trainers' named_hf_weights: the tied head is the embedding
    return state


def _train_step(state, seed, frozen=("embed_tokens", "mlp")):
    """A stand-in optimizer step: every tensor moves except the frozen ones."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: v if any(f in k for f in frozen) else v + 0.01 * torch.randn(v.shape, generator=g) for k, v in state.items()
    }


def _buckets(state, size=4):
    items = list(state.items())
    return iter([items[i : i + size] for i in range(0, len(items), size)])


# (name, id(tensor)) -> (tensor, checksum): an unchanged tensor (the frozen 9.7M-entry embedding) is hashed once; the
# tensor is kept so that its id is not reused.
_TRAINER_SUMS: dict = {}


def _engine_matches(url, state):
    """Weight-content check: the engine's checksum of every parameter equals the trainer's, exactly."""

    async def go():
        engine = EngineClient(url, timeout=120.0)
        try:
            return await engine_checksums(engine)
        finally:
            await engine.aclose()

    held = asyncio.run(go())[0]
    # Projections together: SGLang's fused qkv_proj / gate_up_proj need all their parts.
    want = sglang_checksums([(n, t) for n, t in state.items() if "proj" in n], dtype=torch.float32)
    for name, tensor in state.items():
        if "proj" not in name:
            key = (name, id(tensor))
            if key not in _TRAINER_SUMS:
                _TRAINER_SUMS[key] = (tensor, tensor_checksum(tensor.to(torch.float32)))
            want[sglang_param_name(name)[0]] = _TRAINER_SUMS[key][1]
    assert len(want) > 10 and {k: held[k] for k in want} == want


def _flipped(delta):
    """The delta with one payload byte flipped (a bit error on the wire or the shared filesystem)."""
    payload = delta.payload.copy()
    payload[len(payload) // 2] ^= 0x5A
    return dataclasses.replace(delta, payload=payload)


def _restore(url, tiny_qwen3_dir):
    client = RolloutClient([url])
    asyncio.run(client.broadcast("update_weights_from_disk", model_path=str(tiny_qwen3_dir), weight_version="default"))
    asyncio.run(client.broadcast("continue_generation"))


@pytest.mark.slow  # 5-12 s: runs in the full suite, not in the per-package isolation run
def test_tensor_delta_push_sends_less_and_the_engine_holds_the_trainer_weights(
    reference_engine, model_state, tiny_qwen3_dir
):
    url = reference_engine.urls[0]
    cfg = _cfg(weight_sync="tensor")
    updater = DeltaTensorWeightUpdater(cfg, RolloutClient([url]))
    try:
        v1 = _train_step(model_state, 1)
        updater.update(_buckets(v1), "1")
        full = updater.delta_stats
        assert full.full and full.num_sent == full.num_tensors == len(model_state)

        v2 = _train_step(v1, 2)
        updater.update(_buckets(v2), "2")
        delta = updater.delta_stats
        frozen = sum(("embed_tokens" in k or "mlp" in k) for k in model_state)
        assert not delta.full and delta.num_sent == len(model_state) - frozen
        assert delta.wire_bytes < full.wire_bytes
        _engine_matches(url, v2)
        assert asyncio.run(RolloutClient([url]).get_weight_versions()) == ["2"]

        # A corrupted payload: the engine refuses the request naming the tensor, and the next push goes in full.
        v3 = _train_step(v2, 3)
        real_encode = updater.base.encode_bucket

        def corrupt(bucket):
            return [_flipped(d) for d in real_encode(bucket)]

        updater.base.encode_bucket = corrupt
        with pytest.raises(WeightPushError, match=r"delta for 'model\..*'"):
            updater.update(_buckets(v3), "3")
        assert not updater.base.valid
        del updater.base.encode_bucket
        updater.update(_buckets(v3), "4")
        assert updater.delta_stats.full
        _engine_matches(url, v3)

        # A resumed run (a new updater) pushes in full first.
        resumed = DeltaTensorWeightUpdater(cfg, RolloutClient([url]))
        resumed.update(_buckets(v3), "5")
        assert resumed.delta_stats.full
    finally:
        _restore(url, tiny_qwen3_dir)


def test_a_restarted_engine_gets_a_full_push_and_refuses_a_delta_on_another_base(
    reference_engine, model_state, tiny_qwen3_dir
):
    from slime_rollout.engines.transport import EngineError
    from slime_rollout.engines.weight_delta import UpdateWeightsFromDeltaReq, encode, tensor_bytes
    from slime_rollout.engines.wire import serialize_named_tensors

    url = reference_engine.urls[0]
    updater = DeltaTensorWeightUpdater(_cfg(weight_sync="tensor"), RolloutClient([url]))
    try:
        updater.update(_buckets(model_state), "7")
        # The engine restarts in place (its version is back at the checkpoint's) while the trainer's base is v7.
        _restore(url, tiny_qwen3_dir)
        v8 = _train_step(model_state, 8)
        updater.update(_buckets(v8), "8")
        assert updater.delta_stats.full
        _engine_matches(url, v8)

        # The engine's own guard: a delta on a base it does not hold is refused, naming both versions.
        name = "model.norm.weight"
        old = tensor_bytes(v8[name])
        new = tensor_bytes(v8[name] + 1)
        payload, _ = encode(new, old, "xor")
        req = UpdateWeightsFromDeltaReq(
            serialized_named_tensors=[serialize_named_tensors([(name, torch.from_numpy(payload.copy()))])],
            checksums={name: checksum("xxh3-128", new)},
            base_version="7",
            weight_version="9",
        )

        async def send():
            engine = EngineClient(url, timeout=60.0)
            try:
                return await engine.update_weights_from_delta(req)
            finally:
                await engine.aclose()

        with pytest.raises(EngineError, match="applies to weight_version '7' but this engine holds '8'"):
            asyncio.run(send())
        _engine_matches(url, v8)  # nothing applied
    finally:
        _restore(url, tiny_qwen3_dir)


def test_disk_delta_push_patches_the_local_checkpoint_verified(reference_engine, model_state, tiny_qwen3_dir, tmp_path):
    url = reference_engine.urls[0]
    cfg = _cfg(weight_sync="disk", update_weight_disk_dir=str(tmp_path / "shared"), hf_checkpoint=str(tiny_qwen3_dir))
    assert cfg.update_weight_local_checkpoint_dir == str(tmp_path / "shared" / "local")
    updater = DeltaDiskWeightUpdater(cfg, RolloutClient([url]))
    local = tmp_path / "shared" / "local"
    try:
        v1 = _train_step(model_state, 1)
        updater.update(_buckets(v1), "1")
        assert updater.delta_stats.full and read_local_version(local) == "1"

        v2 = _train_step(v1, 2)
        updater.update(_buckets(v2), "2")
        s = updater.delta_stats
        assert not s.full and 0 < s.wire_bytes < s.total_bytes and s.num_sent < s.num_tensors
        assert read_local_version(local) == "2"
        assert not (tmp_path / "shared" / "delta_v2").exists()  # cleaned up (no --update-weight-disk-keep-files)
        _engine_matches(url, v2)

        # A delta file corrupted on the shared filesystem: the apply names the tensor; the next push is full.
        import slime_rollout.weight_sync.delta_sync as wds

        real_write = wds.write_delta_dir

        def corrupting_write(deltas, out_dir, metadata):
            return real_write([_flipped(deltas[0]), *deltas[1:]], out_dir, metadata)

        wds.write_delta_dir = corrupting_write
        try:
            with pytest.raises(DeltaChecksumError, match=r"delta for 'model\."):
                updater.update(_buckets(_train_step(v2, 3)), "3")
        finally:
            wds.write_delta_dir = real_write
        assert read_local_version(local) is None and not updater.base.valid
        v4 = _train_step(v2, 4)
        updater.update(_buckets(v4), "4")
        assert updater.delta_stats.full and read_local_version(local) == "4"
        _engine_matches(url, v4)
    finally:
        _restore(url, tiny_qwen3_dir)


def test_a_delta_dir_applies_only_on_its_base_version(tmp_path, model_state, tiny_qwen3_dir):
    from slime_rollout.weight_sync.delta_sync import VERSION_FILE, write_delta_dir

    (tmp_path / "local").mkdir()
    (tmp_path / "local" / VERSION_FILE).write_text("5")
    meta = {"version": "7", "base_version": "6", "delta_encoding": "xor", "checksum_format": "xxh3-128"}
    write_delta_dir([], tmp_path / "d7", meta)
    with pytest.raises(DeltaChecksumError, match="on top of v6, but .* holds v5"):
        apply_delta_dir(tmp_path / "d7", tmp_path / "local")


def test_a_delta_dir_has_the_push_files_mode_and_a_failed_write_leaves_none(tmp_path, monkeypatch):
    # Its payload file was 0600 (safetensors >= 0.8) beside a 0644 index and 0644 full pushes; a full disk mid-write
    # left a delta_v<N> folder without index that no later push removed.
    import errno
    import stat

    from slime_core.safetensors_io import new_file_mode
    from slime_rollout.weight_sync import delta_sync

    base = DeltaBase(encoding="xor", algorithm="xxh3-128")
    base.record_full([("w", torch.zeros(8))])
    deltas = base.encode_bucket([("w", torch.arange(8.0))])
    meta = {"version": "2", "base_version": "1", "delta_encoding": "xor", "checksum_format": "xxh3-128"}
    delta_sync.write_delta_dir(deltas, tmp_path / "d2", meta)
    for f in ("model-00001.safetensors", "model.safetensors.index.json"):
        assert stat.S_IMODE((tmp_path / "d2" / f).stat().st_mode) == new_file_mode(), f

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(delta_sync, "save_safetensors", disk_full)
    with pytest.raises(OSError, match="No space left"):
        delta_sync.write_delta_dir(deltas, tmp_path / "d3", meta)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d2"]


def test_a_foreign_local_checkpoint_folder_is_refused_naming_its_own_flag(tmp_path):
    # The refusal named --update-weight-disk-dir for the folder --update-weight-local-checkpoint-dir gave.
    from slime_core.dir_swap import ReplaceRefused

    local = tmp_path / "mine"
    local.mkdir()
    (local / "notes.txt").write_text("the user's own files")
    cfg = _cfg(weight_sync="disk", update_weight_disk_dir=str(tmp_path / "push"),
               update_weight_local_checkpoint_dir=str(local))  # fmt: skip
    updater = DeltaDiskWeightUpdater(cfg, RolloutClient(["http://127.0.0.1:9"]))  # refused before any engine call
    updater.base.begin()  # the first push of an updater goes in full
    refused = rf"^--update-weight-local-checkpoint-dir {re.escape(str(local))}: is a non-empty folder"
    with pytest.raises(ReplaceRefused, match=refused):
        asyncio.run(updater._send(iter([[("w", torch.zeros(2))]]), "1"))
    assert (local / "notes.txt").read_text() == "the user's own files"


def test_a_delta_index_naming_a_shard_outside_its_dir_patches_nothing(tmp_path):
    # Issue 27: the shard names of the delta's index were joined with its folder as given ('../x' read elsewhere),
    # and the local checkpoint had lost its version file before that load failed or not.
    import json

    from slime_rollout.weight_sync.delta_sync import VERSION_FILE, write_delta_dir

    (tmp_path / "local").mkdir()
    (tmp_path / "local" / VERSION_FILE).write_text("6")
    meta = {"version": "7", "base_version": "6", "delta_encoding": "xor", "checksum_format": "xxh3-128"}
    write_delta_dir([], tmp_path / "d7", meta)
    index = tmp_path / "d7" / "model.safetensors.index.json"
    body = json.loads(index.read_text())
    index.write_text(json.dumps({**body, "weight_map": {"w": "../elsewhere.safetensors"}}))
    with pytest.raises(ValueError) as e:
        apply_delta_dir(tmp_path / "d7", tmp_path / "local")
    assert str(e.value) == f"{index}: weight_map['w'] = '../elsewhere.safetensors' leads out of the folder ('..')"
    assert (tmp_path / "local" / VERSION_FILE).read_text() == "6"  # still a valid base: nothing was touched


def test_delta_config_is_validated():
    from slime_core.config import ConfigError

    with pytest.raises(ConfigError, match="--weight-sync distributed has no delta path"):
        _cfg(weight_sync="distributed")
    with pytest.raises(ConfigError, match="--rollout-engine sglang cannot verify and apply an encoded delta"):
        _cfg(weight_sync="tensor", rollout_engine="sglang")
    cfg = _cfg(weight_sync="disk", update_weight_delta_encoding="overwrite", update_weight_delta_checksum="adler32")
    assert cfg.update_weight_local_checkpoint_dir.endswith("local")
    # LoRA syncs the adapter only: the refusal said "use --weight-sync disk", which --lora-rank then refused.
    lora = r"^--update-weight-mode delta with --lora-rank: .* use --update-weight-mode full$"
    with pytest.raises(ConfigError, match=lora):
        _cfg(lora_rank=8, lora_target_modules=["q_proj"], train_backend="fsdp", n_samples_per_prompt=2)


def test_delta_request_body_defaults():
    from slime_rollout.engines.weight_delta import UpdateWeightsFromDeltaReq

    req = UpdateWeightsFromDeltaReq(serialized_named_tensors=["x"], checksums={"w": "ab"}, base_version="3")
    body = req.to_json()
    assert body["delta_encoding"] == "xor" and body["compression_format"] == "zstd"


def test_engines_that_release_memory_keep_their_weights_for_tensor_deltas():
    """A colocated engine's weights are lost on a memory release unless backed up; a delta applies to them."""
    from slime_rollout.engines.launch.reference import build_reference_command

    def backup(**fields):
        cmd = build_reference_command(_cfg(**fields), host="h", port=1, random_seed=0, memory_saver=True)
        return "--enable-weights-cpu-backup" in cmd

    assert backup(weight_sync="tensor")
    assert not backup(weight_sync="tensor", update_weight_mode="full")
    assert not backup(weight_sync="disk")  # a disk delta reloads the whole local checkpoint


def test_a_delta_reaches_an_expert_inside_transformers_fused_moe_parameters(tmp_path, make_tiny_qwen3_moe):
    # The trainer pushes per-expert checkpoint names (as SGLang loads them); transformers holds one fused
    # `experts.gate_up_proj` / `experts.down_proj` per layer. A full push lands them (`load_named_tensors` maps each
    # to its slice), but a delta was refused as "unknown parameter": every delta push of a MoE model failed.
    from slime_rollout.engines.reference.delta import apply_delta_request
    from slime_rollout.engines.reference.model import ReferenceModel
    from slime_rollout.engines.weight_delta import UpdateWeightsFromDeltaReq

    served = ReferenceModel(str(make_tiny_qwen3_moe(tmp_path / "moe")))
    state = served.model.state_dict()
    down, up = "model.layers.0.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.experts.5.up_proj.weight"
    old = {down: state["model.layers.0.mlp.experts.down_proj"][3].clone(),
           up: state["model.layers.1.mlp.experts.gate_up_proj"][5].chunk(2, dim=0)[1].clone()}  # fmt: skip
    gate_before = state["model.layers.1.mlp.experts.gate_up_proj"][5].chunk(2, dim=0)[0].clone()
    base = DeltaBase(encoding="xor", algorithm="xxh3-128")
    base.record_full(old.items())
    base.commit("1")
    new = {name: t + 0.25 for name, t in old.items()}
    deltas = base.encode_bucket(new.items())
    req = UpdateWeightsFromDeltaReq(
        serialized_named_tensors=[""], checksums={d.name: d.checksum for d in deltas}, base_version="1",
        weight_version="2",
    )  # fmt: skip
    named = [(d.name, torch.from_numpy(d.payload.copy())) for d in deltas]
    assert apply_delta_request(served, named, req) == 2
    state = served.model.state_dict()
    assert torch.equal(state["model.layers.0.mlp.experts.down_proj"][3], new[down])
    up_gate = state["model.layers.1.mlp.experts.gate_up_proj"][5].chunk(2, dim=0)
    assert torch.equal(up_gate[1], new[up])
    assert torch.equal(up_gate[0], gate_before)  # the other half of the fused row block is untouched
