"""Malformed requests to the reference engine's weight routes get SGLang's replies (status codes and keys).

SGLang 0.5.16 declares every request body as a typed parameter (`obj: UpdateWeightFromDiskReqInput`), so FastAPI
refuses a bad body before the handler runs: HTTP 422 `{"detail": [{"type", "loc", "msg", "input", ...}]}`. The
independent reference here is a FastAPI app with SGLang's request dataclasses (the fields of its `io_struct.py`):
the reference engine must answer each malformed body as that app does (class names in the messages aside).
"""

import base64
import dataclasses
import pickle

import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient

from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.reference.server import build_app
from slime_rollout.engines.wire import serialize_named_tensors


@dataclasses.dataclass
class UpdateWeightVersionReqInput:
    new_version: str
    abort_all_requests: bool = False


@dataclasses.dataclass
class UpdateWeightFromDiskReqInput:
    model_path: str
    load_format: str | None = None
    weight_version: str | None = None


@dataclasses.dataclass
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list[str | bytes]
    load_format: str | None = None
    flush_cache: bool = True
    weight_version: str | None = None


@dataclasses.dataclass
class UpdateWeightsFromDistributedReqInput:
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    weight_version: str | None = None


@dataclasses.dataclass
class InitWeightsUpdateGroupReqInput:
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


def _sglang_typed_app() -> FastAPI:
    app = FastAPI()
    for route, record in {
        "/update_weight_version": UpdateWeightVersionReqInput,
        "/update_weights_from_disk": UpdateWeightFromDiskReqInput,
        "/update_weights_from_tensor": UpdateWeightsFromTensorReqInput,
        "/update_weights_from_distributed": UpdateWeightsFromDistributedReqInput,
        "/init_weights_update_group": InitWeightsUpdateGroupReqInput,
    }.items():

        async def handler(obj) -> dict:
            return {"success": True}

        handler.__annotations__["obj"] = record
        app.post(route)(handler)
    return app


def _without_class_names(reply: dict) -> dict:
    for error in reply.get("detail", []):
        error.get("ctx", {}).pop("class_name", None)
        if error["type"] == "dataclass_type":
            error["msg"] = error["msg"].rsplit(" ", 1)[0]  # "... an instance of <class name>"
    return reply


MALFORMED = [
    (route, body)
    for route in (
        "/update_weight_version",
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/init_weights_update_group",
    )
    for body in ("not json", "", "[1]", "null", "{}", '{"new_version": 5, "model_path": 5, "names": "a"}')
]


@pytest.fixture(scope="module")
def engine_client(tiny_qwen3_dir):
    app = build_app(ReferenceModel(str(tiny_qwen3_dir)), max_running_requests=2, random_seed=0, server_args={})
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize(("route", "body"), MALFORMED)
def test_a_malformed_body_is_answered_as_sglang_answers_it(engine_client, route, body):
    headers = {"content-type": "application/json"}
    expected = TestClient(_sglang_typed_app()).post(route, content=body, headers=headers)
    got = engine_client.post(route, content=body, headers=headers)
    # Was HTTP 500 (no JSON body) for a body that does not parse and for /update_weight_version without
    # new_version; 400 with slime's own keys for a missing model_path or serialized_named_tensors.
    assert expected.status_code == 422
    assert (got.status_code, _without_class_names(got.json())) == (422, _without_class_names(expected.json()))


def test_exact_reply_to_a_missing_version(engine_client):
    got = engine_client.post("/update_weight_version", json={})
    assert got.status_code == 422
    assert got.json() == {"detail": [{"type": "missing", "loc": ["body", "new_version"], "msg": "Field required",
                                      "input": {}}]}  # fmt: skip


@pytest.mark.parametrize(
    "payload",
    [
        base64.b64encode(b"not a pickle").decode(),  # UnpicklingError: was HTTP 500
        base64.b64encode(pickle.dumps([("model.norm.weight", 5)])).decode(),  # no tensor: was AttributeError, 500
        "garbage",  # not base64: already 400
    ],
)
def test_a_tensor_payload_that_does_not_load_is_400_and_changes_nothing(engine_client, payload):
    before = engine_client.post("/weights_checker", json={"action": "checksum"}).json()["per_engine_checksum"]
    got = engine_client.post(
        "/update_weights_from_tensor", json={"serialized_named_tensors": [payload], "weight_version": "bad"}
    )
    assert got.status_code == 400
    assert set(got.json()) == {"success", "message"} and got.json()["success"] is False
    assert engine_client.get("/model_info").json()["weight_version"] == "default"
    assert engine_client.post("/weights_checker", json={"action": "checksum"}).json()["per_engine_checksum"] == before
    # The engine is not wedged: a valid push of another version lands.
    norm = torch.full((64,), 0.5)
    bucket = serialize_named_tensors([("model.norm.weight", norm)])
    ok = engine_client.post(
        "/update_weights_from_tensor", json={"serialized_named_tensors": [bucket], "weight_version": "v1"}
    )
    assert ok.status_code == 200 and ok.json()["success"] is True
    assert engine_client.post("/update_weight_version", json={"new_version": "default"}).status_code == 200


@pytest.mark.parametrize("damage", ["shape", "truncated"])
def test_a_disk_checkpoint_bad_in_a_later_shard_changes_no_weight(engine_client, tiny_qwen3_dir, tmp_path, damage):
    from safetensors.torch import load_file, save_file

    # Two shards: the first is a good new model (every weight one value), the second (sorted last) is broken.
    state = load_file(str(next(tiny_qwen3_dir.glob("*.safetensors"))))
    names = sorted(state)
    fill = {"shape": 0.25, "truncated": 0.5}[damage]  # differs per case: the engine is shared by the module
    first = {n: torch.full_like(state[n], fill) for n in names[:-1]}
    save_file(first, str(tmp_path / "model-00001-of-00002.safetensors"))
    last = names[-1]
    bad = torch.zeros(3, 3) if damage == "shape" else state[last]  # another model size / a cut copy
    save_file({last: bad}, str(tmp_path / "model-00002-of-00002.safetensors"))
    if damage == "truncated":
        shard = tmp_path / "model-00002-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:100])
    checksum = engine_client.post("/weights_checker", json={"action": "checksum"}).json()["per_engine_checksum"]
    got = engine_client.post("/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "x"})
    assert got.status_code == 400 and got.json()["success"] is False
    assert set(got.json()) == {"success", "message", "num_paused_requests"}
    # Shard 1 was applied before shard 2 failed: the engine served a mix of two models under its old version.
    assert engine_client.post("/weights_checker", json={"action": "checksum"}).json()["per_engine_checksum"] == checksum
    assert engine_client.get("/model_info").json()["weight_version"] == "default"
