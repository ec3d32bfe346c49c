"""Malformed requests to the reference engine get SGLang 0.5.16's replies (status codes, keys and error lists).

SGLang 0.5.16 declares every request body as `obj: Annotated[<Name>ReqInput, Body()]`, a msgspec Struct whose pydantic
schema (`msgspec_utils.msgspec_struct_pydantic_core_schema`) is a left-to-right union of "an instance of the class"
and "a dict of its fields (extra ignored) built by `build_struct`"; FastAPI refuses a bad body before the handler
runs, and SGLang's `RequestValidationError` handler answers HTTP 400 with `ErrorResponse` (`object`, `message`,
`type`: "Bad Request", `param`, `code`: 400), not FastAPI's 422. The independent reference here is a FastAPI app
built that way from the fields of SGLang's `io_struct.py` (stand-in classes for the Structs) with that handler: the
reference engine must answer each malformed body as that app does (FastAPI's note of the endpoint's file aside).
"""

import array
import base64
import dataclasses
import pickle
import re
import typing
from typing import Annotated, Any, Dict, List, Literal, Optional, Union  # noqa: UP035 - SGLang's spelling

import pytest

pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi (absent on the GPU trainer path)")
import torch  # noqa: E402
from fastapi import Body, FastAPI  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from pydantic import PlainValidator  # noqa: E402
from pydantic_core import core_schema  # noqa: E402

from slime_rollout.engines.reference.model import ReferenceModel  # noqa: E402
from slime_rollout.engines.reference.server import build_app  # noqa: E402
from slime_rollout.engines.wire import serialize_named_tensors  # noqa: E402


class _Struct:
    """A msgspec Struct's pydantic face in SGLang 0.5.16 (`msgspec_struct_pydantic_core_schema`), on a dataclass."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = {}
        for f in dataclasses.fields(cls):
            schema = handler.generate_schema(hints[f.name])
            if f.default is not dataclasses.MISSING:
                schema = core_schema.with_default_schema(schema, default=f.default)
            fields[f.name] = core_schema.typed_dict_field(schema, required=f.default is dataclasses.MISSING)
        typed = core_schema.typed_dict_schema(fields, cls_name=cls.__name__, extra_behavior="ignore", ref=cls.__name__)

        def build_struct(value):
            return value if isinstance(value, cls) else cls(**value)

        built = core_schema.no_info_after_validator_function(build_struct, typed)
        return core_schema.json_or_python_schema(
            json_schema=built,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), built], mode="left_to_right"),
        )


class Base64Bytes:
    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        def decode(value):
            if isinstance(value, str):
                try:
                    return base64.b64decode(value, validate=True)
                except ValueError as exc:
                    raise ValueError("Expected base64-encoded bytes") from exc
            return [decode(v) for v in value] if isinstance(value, list) else value

        return core_schema.no_info_before_validator_function(decode, handler(source))


@dataclasses.dataclass(kw_only=True)
class BaseReq(_Struct):
    rid: Optional[str] = None  # noqa: UP045 - SGLang's spelling
    http_worker_ipc: Optional[str] = None  # noqa: UP045


@dataclasses.dataclass(kw_only=True)
class UpdateWeightVersionReqInput(BaseReq):
    new_version: str
    abort_all_requests: bool = True


@dataclasses.dataclass(kw_only=True)
class UpdateWeightFromDiskReqInput(BaseReq):
    model_path: str
    load_format: Optional[str] = None  # noqa: UP045
    abort_all_requests: bool = False
    weight_version: Optional[str] = None  # noqa: UP045
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    flush_cache: bool = True
    manifest: Optional[dict[str, Any]] = None  # noqa: UP045


@dataclasses.dataclass(kw_only=True)
class UpdateWeightsFromTensorReqInput(BaseReq):
    serialized_named_tensors: Annotated[list[bytes], Base64Bytes()]
    load_format: Optional[str] = None  # noqa: UP045
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None  # noqa: UP045
    disable_draft_model: Optional[bool] = None  # noqa: UP045
    torch_empty_cache: bool = False


@dataclasses.dataclass(kw_only=True)
class UpdateWeightsFromDistributedReqInput(BaseReq):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None  # noqa: UP045
    load_format: Optional[str] = None  # noqa: UP045
    torch_empty_cache: bool = False


@dataclasses.dataclass(kw_only=True)
class InitWeightsUpdateGroupReqInput(BaseReq):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


@dataclasses.dataclass(kw_only=True)
class DestroyWeightsUpdateGroupReqInput(BaseReq):
    group_name: str = "weight_update_group"


@dataclasses.dataclass(kw_only=True)
class LoadLoRAAdapterReqInput(BaseReq):
    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: Optional[str] = None  # noqa: UP045


@dataclasses.dataclass(kw_only=True)
class AbortReq(BaseReq):
    abort_all: bool = False
    finished_reason: Optional[dict[str, Optional[str | int | list[int]]]] = None  # noqa: UP045
    abort_message: Optional[str] = None  # noqa: UP045


@dataclasses.dataclass(kw_only=True)
class UnloadLoRAAdapterReqInput(BaseReq):
    lora_name: str
    lora_id: Optional[str] = None  # noqa: UP045


@dataclasses.dataclass(kw_only=True)
class PauseGenerationReqInput(BaseReq):
    mode: Literal["abort", "retract", "in_place"] = "abort"


@dataclasses.dataclass(kw_only=True)
class ContinueGenerationReqInput(BaseReq):
    torch_empty_cache: bool = True


@dataclasses.dataclass(kw_only=True)
class ReleaseMemoryOccupationReqInput(BaseReq):
    tags: Optional[List[str]] = None  # noqa: UP006, UP045


@dataclasses.dataclass(kw_only=True)
class ResumeMemoryOccupationReqInput(BaseReq):
    tags: Optional[List[str]] = None  # noqa: UP006, UP045


SGLANG_TYPES = {
    "/update_weight_version": UpdateWeightVersionReqInput,
    "/update_weights_from_disk": UpdateWeightFromDiskReqInput,
    "/update_weights_from_tensor": UpdateWeightsFromTensorReqInput,
    "/update_weights_from_distributed": UpdateWeightsFromDistributedReqInput,
    "/init_weights_update_group": InitWeightsUpdateGroupReqInput,
    "/destroy_weights_update_group": DestroyWeightsUpdateGroupReqInput,
    "/load_lora_adapter": LoadLoRAAdapterReqInput,
    "/unload_lora_adapter": UnloadLoRAAdapterReqInput,
    "/abort_request": AbortReq,
    # Control routes, typed as well: a body is required, a mistyped field refused (issue 27: they were served).
    "/pause_generation": PauseGenerationReqInput,
    "/continue_generation": ContinueGenerationReqInput,
    "/release_memory_occupation": ReleaseMemoryOccupationReqInput,
    "/resume_memory_occupation": ResumeMemoryOccupationReqInput,
}
EVERY_FIELD_DEFAULTED = ("/destroy_weights_update_group", "/abort_request", "/pause_generation", "/continue_generation",
                         "/release_memory_occupation", "/resume_memory_occupation")  # fmt: skip


def _sglang_ids(v):
    # sglang/srt/utils/field_validators.py validate_optional_list_i64_1d_2d (0.5.16), restated.
    def row(r):
        if r is None:
            raise ValueError("must not be None")
        if not isinstance(r, list):
            raise ValueError(f"must be list; got {type(r).__name__}")
        if r and not isinstance(r[0], int):
            raise ValueError(f"elements must be int; got {type(r[0]).__name__}")
        try:
            array.array("q", r)
        except (TypeError, OverflowError) as e:
            raise ValueError(f"contains non-int64 element: {e}") from None
        return r

    if v is None or v == []:
        return v
    if not isinstance(v, list):
        raise ValueError(f"must be list or null; got {type(v).__name__}")
    if isinstance(v[0], int):
        return row(v)
    if not isinstance(v[0], list):
        raise ValueError(f"elements must be int or list; got {type(v[0]).__name__}")
    for i, r in enumerate(v):
        try:
            row(r)
        except ValueError as e:
            raise ValueError(f"row {i}: {e}") from None
    return v


@dataclasses.dataclass
class GenerateReqInput:  # a plain dataclass in io_struct.py (not a Struct); the fields the reference engine reads
    rid: Optional[Union[str, List[str]]] = dataclasses.field(default=None, kw_only=True)  # noqa: UP006, UP007, UP045
    text: Optional[Union[List[str], str]] = None  # noqa: UP006, UP007, UP045
    input_ids: Annotated[Optional[Union[List[List[int]], List[int]]], PlainValidator(_sglang_ids)] = None  # noqa: UP006, UP007, UP045
    image_data: Any = None
    sampling_params: Optional[Union[List[Dict[str, Any]], Dict[str, Any]]] = None  # noqa: UP006, UP007, UP045
    return_logprob: Optional[Union[List[bool], bool]] = None  # noqa: UP006, UP007, UP045
    logprob_start_len: Optional[Union[List[int], int]] = None  # noqa: UP006, UP007, UP045
    top_logprobs_num: Optional[Union[List[int], int]] = None  # noqa: UP006, UP007, UP045
    return_text_in_logprobs: bool = False
    stream: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    lora_path: Optional[Union[List[Optional[str]], str]] = None  # noqa: UP006, UP007, UP045


def _sglang_typed_app() -> FastAPI:
    app = FastAPI()

    @app.exception_handler(RequestValidationError)
    async def validation_exception_handler(request, exc):  # SGLang 0.5.16's, for routes outside /v1
        exc_str, errors_str = str(exc), str(exc.errors())
        message = f"{exc_str} {errors_str}" if errors_str and errors_str != exc_str else exc_str
        content = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
        return JSONResponse(content, status_code=400)

    for route, record in SGLANG_TYPES.items():

        async def handler(obj) -> dict:
            return {"success": True, "abort_all_requests": getattr(obj, "abort_all_requests", None)}

        handler.__annotations__["obj"] = Annotated[record, Body()]
        handler.__name__ = route.removeprefix("/")  # SGLang's function names: FastAPI's message names them
        app.post(route)(handler)

    @app.post("/generate")
    async def generate_request(obj: GenerateReqInput):
        return {"success": True}

    return app


def _without_endpoint(reply: dict) -> dict:
    """The reply without the endpoint's source file and line in FastAPI's message (SGLang's own file there)."""
    return {**reply, "message": re.sub(r'File "[^"]*", line \d+', "File <f>, line <n>", reply.get("message", ""))}


MALFORMED = [
    (route, body)
    for route in SGLANG_TYPES
    for body in (
        "not json", "", "[1]", "null", '{"group_name": 5, "rid": 5}',
        *(('{"abort_all": "maybe", "finished_reason": 3}',) if route == "/abort_request" else ()),
        *(('{"mode": "bogus", "tags": "weights", "torch_empty_cache": "maybe"}',) if route in EVERY_FIELD_DEFAULTED[2:]
          else ()),
        *(() if route in EVERY_FIELD_DEFAULTED else (
            "{}", '{"new_version": 5, "model_path": 5, "names": "a", "lora_name": 7}',
            '{"new_version": "v", "model_path": "/m", "abort_all_requests": "maybe", "rid": 5}',
            '{"serialized_named_tensors": ["not base64!"], "names": [], "dtypes": [], "shapes": [[1, "x"]]}',
        )),
    )
]  # fmt: skip


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
    # Was FastAPI's 422 `{"detail": [...]}` (and, before that, HTTP 500 for a body that does not parse); SGLang
    # 0.5.16 answers 400 with its ErrorResponse, whose message lists the union's errors.
    assert expected.status_code == 400, expected.text
    assert (got.status_code, _without_endpoint(got.json())) == (400, _without_endpoint(expected.json()))


GENERATE_MALFORMED = [
    '{"input_ids": [1.5, 2]}', '{"input_ids": "12"}', '{"input_ids": [[785], [2, "x"]]}', '{"input_ids": [[1], null]}',
    '{"input_ids": [99999999999999999999]}', '{"input_ids": [1], "rid": 5}', '{"text": 5}', '{"text": ["a", 5]}',
    '{"input_ids": [1], "sampling_params": "x"}', '{"input_ids": [1], "return_logprob": "maybe"}',
    '{"input_ids": [1], "return_logprob": true, "logprob_start_len": 1.5, "top_logprobs_num": "a"}',
    '{"input_ids": [1], "stream": "sometimes", "return_routed_experts": 3, "lora_path": 7}',
]  # fmt: skip


@pytest.mark.parametrize("body", GENERATE_MALFORMED)
def test_a_mistyped_generate_body_is_answered_as_sglang_answers_it(engine_client, body):
    # SGLang's /generate takes GenerateReqInput (a dataclass) as its body: FastAPI refuses a mistyped field with
    # SGLang's 400. Was: ids 1.5 read as 1 (a 200 for another prompt), a rid 5 kept as an int, 400s or 500s whose
    # text came from int() or dict().
    headers = {"content-type": "application/json"}
    expected = TestClient(_sglang_typed_app()).post("/generate", content=body, headers=headers)
    got = engine_client.post("/generate", content=body, headers=headers)
    assert expected.status_code == 400, expected.text
    assert (got.status_code, _without_endpoint(got.json())) == (400, _without_endpoint(expected.json()))


def test_generate_reads_sglangs_lax_bools(engine_client):
    # "false" is False for FastAPI (was: a truthy string, so log-probs came back unasked).
    reply = engine_client.post("/generate", json={"input_ids": [785, 4226], "return_logprob": "false",
                                                  "sampling_params": {"max_new_tokens": 1}})  # fmt: skip
    assert reply.status_code == 200 and "output_token_logprobs" not in reply.json()["meta_info"]


def test_exact_reply_to_a_missing_version(engine_client):
    got = engine_client.post("/update_weight_version", json={})
    assert got.status_code == 400
    errors = (
        "[{'type': 'is_instance_of', 'loc': ('body', 'is-instance[UpdateWeightVersionReqInput]'), "
        "'msg': 'Input should be an instance of UpdateWeightVersionReqInput', 'input': {}, "
        "'ctx': {'class': 'UpdateWeightVersionReqInput'}}, {'type': 'missing', 'loc': ('body', "
        "'function-after[build_struct(), UpdateWeightVersionReqInput]', 'new_version'), 'msg': 'Field required', "
        "'input': {}}]"
    )
    message = got.json().pop("message")
    assert got.json() | {"message": None} == {
        "object": "error", "message": None, "type": "Bad Request", "param": None, "code": 400,
    }  # fmt: skip
    assert message.startswith("2 validation errors:\n") and message.endswith(f"POST /update_weight_version {errors}")


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/update_weights_from_disk", {"model_path": "/nonexistent", "weight_version": "x"}),
        # A payload that is base64 but no pickle: the load fails after the abort, as in SGLang.
        ("/update_weights_from_tensor", {"serialized_named_tensors": [base64.b64encode(b"x").decode()]}),
        ("/update_weights_from_delta", {"serialized_named_tensors": [], "checksums": {}, "base_version": "x"}),
    ],
)
@pytest.mark.parametrize(("flag", "aborts"), [("false", False), ("true", True), (0, False), (None, False)])
def test_abort_all_requests_is_read_as_sglangs_bool(engine_client, monkeypatch, route, body, flag, aborts):
    # Was `bool(body.get("abort_all_requests"))`: the string "false" aborted every running request on 4 routes.
    scheduler = engine_client.app.state.engine.scheduler
    calls = []
    monkeypatch.setattr(scheduler, "abort", lambda **kw: calls.append(kw))
    extra = {} if flag is None else {"abort_all_requests": flag}
    engine_client.post(route, json={**body, **extra})
    assert calls == ([{"abort_all": True}] if aborts else [])


@pytest.mark.parametrize(("flag", "aborts"), [("false", False), ("true", True), (None, False)])
def test_abort_request_reads_abort_all_as_sglangs_bool(engine_client, monkeypatch, flag, aborts):
    # Was `bool(body.get("abort_all"))`: `{"abort_all": "false"}` aborted every request.
    scheduler = engine_client.app.state.engine.scheduler
    calls = []
    monkeypatch.setattr(scheduler, "abort", lambda **kw: calls.append(kw))
    extra = {} if flag is None else {"abort_all": flag}
    assert engine_client.post("/abort_request", json={"rid": "r1", **extra}).status_code == 200
    assert calls == [{"rid": "r1", "abort_all": aborts}]


@pytest.mark.parametrize(("flag", "aborts"), [("false", False), (None, True)])
def test_update_weight_version_aborts_by_default_as_sglang_does(engine_client, monkeypatch, flag, aborts):
    # SGLang 0.5.16: `UpdateWeightVersionReqInput.abort_all_requests: bool = True`; slime always sends False.
    scheduler = engine_client.app.state.engine.scheduler
    calls = []
    monkeypatch.setattr(scheduler, "abort", lambda **kw: calls.append(kw))
    extra = {} if flag is None else {"abort_all_requests": flag}
    version = engine_client.app.state.engine.weight_version
    reply = engine_client.post("/update_weight_version", json={"new_version": version, **extra})
    assert reply.status_code == 200 and calls == ([{"abort_all": True}] if aborts else [])
    expected = TestClient(_sglang_typed_app()).post("/update_weight_version", json={"new_version": "v", **extra})
    assert expected.json()["abort_all_requests"] is aborts  # the independent reference agrees


@pytest.mark.parametrize(
    "body", ["not json", "[1]", "{}", '{"serialized_named_tensors": "x", "checksums": {}, "base_version": 5}']
)
def test_a_malformed_delta_body_is_refused_as_the_sglang_routes_refuse_one(engine_client, body):
    # Was HTTP 400 `{"success": false, "message": "/update_weights_from_delta: missing field(s) ..."}` (its own
    # parser), where every other update route answers SGLang's validation reply.
    got = engine_client.post("/update_weights_from_delta", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 400
    reply = got.json()
    assert set(reply) == {"object", "message", "type", "param", "code"} and reply["type"] == "Bad Request"
    assert re.match(r"\d+ validation errors?:\n", reply["message"]), reply["message"]


@pytest.mark.parametrize(
    ("payload", "keys"),
    [
        # UnpicklingError: was HTTP 500
        (base64.b64encode(b"not a pickle").decode(), {"success", "message"}),
        # no tensor: was AttributeError, 500
        (base64.b64encode(pickle.dumps([("model.norm.weight", 5)])).decode(), {"success", "message"}),
        # not base64: SGLang's `Base64Bytes` refuses it while validating the body (its ErrorResponse)
        ("garbage", {"object", "message", "type", "param", "code"}),
    ],
)
def test_a_tensor_payload_that_does_not_load_is_400_and_changes_nothing(engine_client, payload, keys):
    before = engine_client.post("/weights_checker", json={"action": "checksum"}).json()["per_engine_checksum"]
    got = engine_client.post(
        "/update_weights_from_tensor", json={"serialized_named_tensors": [payload], "weight_version": "bad"}
    )
    assert got.status_code == 400
    assert set(got.json()) == keys and got.json().get("success") in (False, None)
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


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input_ids": []}, "input_ids cannot be empty."),
        ({"text": ""}, "texts cannot be empty and tokenizer must be initialized"),
        ({}, "Either text, input_ids or input_embeds should be provided."),
    ],
)
def test_an_empty_prompt_gets_sglangs_message(engine_client, body, message):
    # io_struct.py _validate_inputs / _determine_batch_size, tokenizer_manager.py _tokenize_texts (was "the prompt is
    # empty" for the first two).
    reply = engine_client.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 1}})
    assert (reply.status_code, reply.json()) == (400, {"error": {"message": message}})
