"""The weight-update wire format: request records, the named-tensor payload, the broadcast helpers.

The trainer side (`weight_sync`, through `EngineClient`) and the engine side (the reference engine) both use
`slime_rollout.engines.wire`; these tests pin what goes over the wire, independently of either end.
"""

import dataclasses
import types

import pytest
import torch

from slime_rollout.engines import wire
from slime_rollout.engines.process import find_free_port
from slime_rollout.engines.wire import deserialize_named_tensors, init_custom_process_group, serialize_named_tensors
from slime_rollout.weight_sync import updaters as weight_sync

REQUESTS = [
    wire.UpdateWeightsFromDiskReq(model_path="/ckpt/weight_v000003", weight_version="3"),
    wire.UpdateWeightsFromTensorReq(serialized_named_tensors=["abc"], load_format="flattened_bucket"),
    wire.InitWeightsUpdateGroupReq(master_address="h", master_port=9, rank_offset=1, world_size=3, backend="gloo"),
    wire.UpdateWeightsFromDistributedReq(names=["w"], dtypes=["bfloat16"], shapes=[[2, 3]], weight_version="4"),
    wire.DestroyWeightsUpdateGroupReq(group_name="slime-pp_0"),
]


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_request_body_has_every_field(req):
    body = req.to_json()
    assert body == {f.name: getattr(req, f.name) for f in dataclasses.fields(req)}  # every field is a key, nothing else


def test_request_endpoints_and_defaults_are_sglangs():
    assert [r.endpoint for r in REQUESTS] == [
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/init_weights_update_group",
        "/update_weights_from_distributed",
        "/destroy_weights_update_group",
    ]
    # SGLang's default group name when a request names none.
    assert wire.UpdateWeightsFromDistributedReq(names=[], dtypes=[], shapes=[]).group_name == "weight_update_group"
    assert wire.DestroyWeightsUpdateGroupReq().group_name == "weight_update_group"


def test_dtype_names_round_trip():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
        assert wire.dtype_from_name(wire.dtype_name(dtype)) is dtype
    assert wire.dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype 'nn'"):
        wire.dtype_from_name("nn")


def test_nccl_cumem_setting_is_the_users_else_nccls_default(monkeypatch):
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    assert wire.nccl_cumem_enable() == wire.NCCL_CUMEM_DEFAULT == "1"
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    assert wire.nccl_cumem_enable() == "0"


def test_weight_sync_reexports_the_codec():
    assert weight_sync.deserialize_named_tensors is wire.deserialize_named_tensors
    assert weight_sync.serialize_named_tensors is wire.serialize_named_tensors
    assert weight_sync.init_custom_process_group is wire.init_custom_process_group


def test_serialize_round_trip_plain_and_flattened():
    torch.multiprocessing.set_sharing_strategy("file_system")
    a, b = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.tensor([1.5, -2.0])
    got = deserialize_named_tensors(serialize_named_tensors([("a", a.clone()), ("b", b.clone())]), None)
    assert [n for n, _ in got] == ["a", "b"] and torch.equal(got[0][1], a) and torch.equal(got[1][1], b)
    flat = torch.cat([a.flatten(), b])
    meta = [
        {"name": "a", "shape": [2, 3], "dtype": torch.float32, "start_idx": 0, "end_idx": 6},
        {"name": "b", "shape": [2], "dtype": torch.float32, "start_idx": 6, "end_idx": 8},
    ]
    got = deserialize_named_tensors(
        serialize_named_tensors({"flattened_tensor": flat, "metadata": meta}), "flattened_bucket"
    )
    assert torch.equal(got[0][1], a) and torch.equal(got[1][1], b)
    # SGLang >= 0.5 flattens to bytes (uint8, byte offsets) with metadata objects and mixed dtypes.
    c = torch.tensor([[0.25, -1.0]], dtype=torch.bfloat16)
    raw = torch.cat([a.flatten().view(torch.uint8), c.flatten().view(torch.uint8)])
    meta = [
        types.SimpleNamespace(name="a", shape=torch.Size([2, 3]), dtype=torch.float32, start_idx=0, end_idx=24),
        types.SimpleNamespace(name="c", shape=torch.Size([1, 2]), dtype=torch.bfloat16, start_idx=24, end_idx=28),
    ]
    got = deserialize_named_tensors(
        serialize_named_tensors({"flattened_tensor": raw, "metadata": meta}), "flattened_bucket"
    )
    assert torch.equal(got[0][1], a) and torch.equal(got[1][1], c) and got[1][1].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="load_format"):
        deserialize_named_tensors(serialize_named_tensors([]), "bogus")


# The engine side as sglang.srt.utils.common.init_custom_process_group builds it (SGLang 0.5.16): the
# rendezvous store is wrapped in PrefixStore(group_name) before the process group is made.
SGLANG_STYLE_PEER = """
import datetime, os, sys, torch
from torch.distributed import distributed_c10d as c10d
port, name = int(sys.argv[1]), sys.argv[2]
timeout = datetime.timedelta(seconds=30)
store, rank, world = next(c10d.rendezvous(f"tcp://127.0.0.1:{port}", 1, 2, timeout=timeout))
store.set_timeout(timeout)
pg, _ = c10d._new_process_group_helper(
    2, 1, [], c10d.Backend("gloo"), c10d.PrefixStore(name, store), group_name=name, timeout=timeout
)
c10d._world.pg_group_ranks[pg] = {0: 0, 1: 1}
t = torch.zeros(3)
torch.distributed.broadcast(t, group=pg, group_src=0)
print(t.tolist(), flush=True)
os._exit(0)  # gloo's destructors at interpreter exit can abort while the other end still holds the pair
"""


def test_custom_process_group_uses_sglangs_store_prefix():
    """A group made by `init_custom_process_group` talks to one made SGLang's way (a store-prefix mismatch
    made the NCCL weight update hang on GPUs)."""
    import datetime
    import subprocess
    import sys

    # A name of its own: an updater test in this worker may have left a half-made "slime-pp_0" group registered.
    port, name = find_free_port(start=29650), "slime-wire-store-prefix"
    peer = subprocess.Popen(
        [sys.executable, "-c", SGLANG_STYLE_PEER, str(port), name], stdout=subprocess.PIPE, text=True
    )
    try:
        pg = init_custom_process_group(
            backend="gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            world_size=2,
            rank=0,
            group_name=name,
            timeout=datetime.timedelta(seconds=30),
        )
        torch.distributed.broadcast(torch.tensor([1.0, 2.0, 3.0]), group=pg, group_src=0)
        out, _ = peer.communicate(timeout=60)
        torch.distributed.destroy_process_group(pg)
    finally:
        if peer.poll() is None:
            peer.kill()
    assert peer.returncode == 0 and out.strip() == "[1.0, 2.0, 3.0]"
