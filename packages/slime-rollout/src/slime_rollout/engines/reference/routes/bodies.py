"""How the reference engine reads a request body: as SGLang 0.5.16 reads it, refusals included.

SGLang declares each body as `obj: Annotated[<Name>ReqInput, Body()]`, a msgspec Struct of `io_struct.py` whose
pydantic schema (`sglang.srt.utils.msgspec_utils.msgspec_struct_pydantic_core_schema`) is a left-to-right union of
"an instance of the class" and "a dict of its fields, extra keys ignored, turned into the class by `build_struct`".
FastAPI validates the parsed JSON with it, and SGLang answers the `RequestValidationError` with its own handler:
HTTP 400 and `ErrorResponse` `{"object": "error", "message", "type": "Bad Request", "param": null, "code": 400}`,
not FastAPI's 422. `parse_request` validates against the same schema built from `SGLANG_BODIES` (so the errors,
their locations and the defaults are SGLang's: `"abort_all_requests": "false"` is False, and an absent one is
SGLang's default, True on `/update_weight_version`), and `validation_error_reply` is the handler. The message differs
from SGLang's in one part only: the endpoint's file and line that FastAPI names are ours here, SGLang's there.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import inspect
import json
import typing
from array import array
from typing import Annotated, Any, Literal

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import PlainValidator, TypeAdapter, ValidationError
from pydantic_core import core_schema

__all__ = [
    "SGLANG_BODIES",
    "GenerateBody",
    "json_or_empty",
    "parse_generate",
    "parse_request",
    "validation_error_reply",
]

_REQUIRED = dataclasses.MISSING


class _Base64Bytes:
    """SGLang's `Base64Bytes` marker: base64 text (or a list of it) becomes bytes before validation."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return core_schema.no_info_before_validator_function(cls._decode, handler(source))

    @classmethod
    def _decode(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except binascii.Error as exc:
                raise ValueError("Expected base64-encoded bytes") from exc
        if isinstance(value, list | tuple):
            return type(value)(cls._decode(item) for item in value)
        return value


_Opt = str | None
# SGLang 0.5.16's request bodies of the routes served here (`io_struct.py`): class name and fields, in order, as
# (name, type, default or _REQUIRED). Every one starts with `BaseReq`'s `rid` and `http_worker_ipc`.
SGLANG_BODIES: dict[str, tuple[str, tuple[tuple[str, Any, Any], ...]]] = {
    "/update_weights_from_disk": ("UpdateWeightFromDiskReqInput", (
        ("model_path", str, _REQUIRED), ("load_format", _Opt, None), ("abort_all_requests", bool, False),
        ("weight_version", _Opt, None), ("is_async", bool, False), ("torch_empty_cache", bool, False),
        ("keep_pause", bool, False), ("recapture_cuda_graph", bool, False), ("token_step", int, 0),
        ("flush_cache", bool, True), ("manifest", dict[str, Any] | None, None),
    )),
    "/update_weights_from_tensor": ("UpdateWeightsFromTensorReqInput", (
        ("serialized_named_tensors", Annotated[list[bytes], _Base64Bytes()], _REQUIRED), ("load_format", _Opt, None),
        ("flush_cache", bool, True), ("abort_all_requests", bool, False), ("weight_version", _Opt, None),
        ("disable_draft_model", bool | None, None), ("torch_empty_cache", bool, False),
    )),
    "/update_weights_from_distributed": ("UpdateWeightsFromDistributedReqInput", (
        ("names", list[str], _REQUIRED), ("dtypes", list[str], _REQUIRED), ("shapes", list[list[int]], _REQUIRED),
        ("group_name", str, "weight_update_group"), ("flush_cache", bool, True), ("abort_all_requests", bool, False),
        ("weight_version", _Opt, None), ("load_format", _Opt, None), ("torch_empty_cache", bool, False),
    )),
    "/init_weights_update_group": ("InitWeightsUpdateGroupReqInput", (
        ("master_address", str, _REQUIRED), ("master_port", int, _REQUIRED), ("rank_offset", int, _REQUIRED),
        ("world_size", int, _REQUIRED), ("group_name", str, "weight_update_group"), ("backend", str, "nccl"),
    )),
    "/destroy_weights_update_group": ("DestroyWeightsUpdateGroupReqInput", (
        ("group_name", str, "weight_update_group"),
    )),
    "/update_weight_version": ("UpdateWeightVersionReqInput", (
        ("new_version", str, _REQUIRED), ("abort_all_requests", bool, True),
    )),
    "/load_lora_adapter": ("LoadLoRAAdapterReqInput", (
        ("lora_name", str, _REQUIRED), ("lora_path", str, _REQUIRED), ("pinned", bool, False), ("lora_id", _Opt, None),
    )),
    "/unload_lora_adapter": ("UnloadLoRAAdapterReqInput", (("lora_name", str, _REQUIRED), ("lora_id", _Opt, None))),
    "/abort_request": ("AbortReq", (
        ("abort_all", bool, False), ("finished_reason", dict[str, str | int | list[int] | None] | None, None),
        ("abort_message", _Opt, None),
    )),
    "/pause_generation": ("PauseGenerationReqInput", (("mode", Literal["abort", "retract", "in_place"], "abort"),)),
    "/continue_generation": ("ContinueGenerationReqInput", (("torch_empty_cache", bool, True),)),
    "/release_memory_occupation": ("ReleaseMemoryOccupationReqInput", (("tags", list[str] | None, None),)),
    "/resume_memory_occupation": ("ResumeMemoryOccupationReqInput", (("tags", list[str] | None, None),)),
}  # fmt: skip
_BASE_REQ = (("rid", _Opt, None), ("http_worker_ipc", _Opt, None))


def _token_ids(value: Any) -> Any:
    """SGLang's check of `input_ids` (`validate_optional_list_i64_1d_2d`, utils/field_validators.py), its messages.

    None, `[]`, a list of int64 ids or a list of such lists; anything else (`[1.5, 2]`, `"12"`) is refused, never
    rounded into another prompt.
    """
    if value is None:
        return value
    if not isinstance(value, list):
        raise ValueError(f"must be list or null; got {type(value).__name__}")
    if not value:
        return value
    if isinstance(value[0], list):
        for i, row in enumerate(value):
            try:
                _id_row(row)
            except ValueError as e:
                raise ValueError(f"row {i}: {e}") from None
        return value
    if not isinstance(value[0], int):
        raise ValueError(f"elements must be int or list; got {type(value[0]).__name__}")
    return _id_row(value)


def _id_row(row: Any) -> list[int]:
    """One prompt's ids, checked as SGLang's `validate_list_i64_1d`."""
    if not isinstance(row, list):
        raise ValueError("must not be None" if row is None else f"must be list; got {type(row).__name__}")
    if row and not isinstance(row[0], int):
        raise ValueError(f"elements must be int; got {type(row[0]).__name__}")
    try:
        array("q", row)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"contains non-int64 element: {e}") from None
    return row


@dataclasses.dataclass
class GenerateBody:
    """The `/generate` fields the reference engine reads, typed as SGLang 0.5.16's `GenerateReqInput` (io_struct.py).

    SGLang's `/generate` takes that dataclass as its body, so FastAPI validates these types (lax: `"false"` is False,
    `5` is no `rid`) before the handler runs, and a mistyped one is its HTTP 400 `ErrorResponse`; other fields are
    ignored here as there (`stream` is refused by the route). Per-prompt lists are for batches.
    """

    rid: str | list[str] | None = None
    # SGLang writes Optional[Union[List[str], str]], but typing's cache hands it rid's equal Optional[Union[str,
    # List[str]]] defined just above: str is tried (and reported) first.
    text: str | list[str] | None = None
    input_ids: Annotated[list[list[int]] | list[int] | None, PlainValidator(_token_ids)] = None
    image_data: Any = None
    sampling_params: list[dict[str, Any]] | dict[str, Any] | None = None
    return_logprob: list[bool] | bool | None = None
    logprob_start_len: list[int] | int | None = None
    top_logprobs_num: list[int] | int | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    lora_path: list[str | None] | str | None = None


_GENERATE = TypeAdapter(GenerateBody)


class _Body:
    """A validated body: SGLang's fields by name, defaults filled in."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]):
        self.fields = fields


def _own_body(record: type) -> tuple[str, tuple[tuple[str, Any, Any], ...]]:
    """The body of a route of ours (not SGLang's): the record's fields, and SGLang's `abort_all_requests` (False)."""
    hints = typing.get_type_hints(record)
    fields = [
        (f.name, hints[f.name], _REQUIRED if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(record)
    ]
    return f"{record.__name__}Input", (*fields, ("abort_all_requests", bool, False))


@functools.cache
def _adapter(record: type) -> TypeAdapter:
    """The validator of `record.endpoint`'s body: SGLang's schema shape, with SGLang's class and function names."""
    name, fields = SGLANG_BODIES.get(record.endpoint) or _own_body(record)
    # The table restates SGLang's fields: a record field it lacks would never be filled in (fail here, not later).
    unknown = {f.name for f in dataclasses.fields(record)} - {field for field, _, _ in (*_BASE_REQ, *fields)}
    if unknown:
        raise TypeError(
            f"{record.__name__} ({record.endpoint}) has field(s) {', '.join(sorted(unknown))} that SGLang's "
            f"{name} lacks: add them to SGLANG_BODIES in {__name__} or drop them from the record"
        )

    def schema(cls: type, source: Any, handler: Any) -> Any:
        typed = {}
        for field, hint, default in (*_BASE_REQ, *fields):
            inner = handler.generate_schema(hint)
            if default is not _REQUIRED:
                inner = core_schema.with_default_schema(inner, default=default)
            typed[field] = core_schema.typed_dict_field(inner, required=default is _REQUIRED)
        as_dict = core_schema.typed_dict_schema(typed, cls_name=name, extra_behavior="ignore", ref=name)

        def build_struct(value: Any) -> Any:  # SGLang's name: it appears in the errors' locations
            return value if isinstance(value, cls) else cls(value)

        built = core_schema.no_info_after_validator_function(build_struct, as_dict)
        either = core_schema.union_schema([core_schema.is_instance_schema(cls), built], mode="left_to_right")
        return core_schema.json_or_python_schema(json_schema=built, python_schema=either)

    body_class = type(name, (_Body,), {"__slots__": (), "__get_pydantic_core_schema__": classmethod(schema)})
    return TypeAdapter(body_class)


def _refusal(request: Request, errors: list[dict[str, Any]], body: Any) -> RequestValidationError:
    """The `RequestValidationError` FastAPI raises for a body param: with the endpoint's function, file, line, route."""
    endpoint, route = request.scope.get("endpoint"), request.scope.get("route")
    ctx: dict[str, Any] = {}
    try:
        ctx = {"file": inspect.getsourcefile(endpoint), "line": inspect.getsourcelines(endpoint)[1]}
        ctx["function"] = endpoint.__name__
    except (TypeError, OSError):  # no Python source to name (as FastAPI, which then names the route only)
        ctx = {}
    if route is not None:
        ctx["path"] = f"{request.method} {getattr(route, 'path', '')}"
    return RequestValidationError(errors, body=body, endpoint_ctx=ctx)  # type: ignore[arg-type]


def _decode(request: Request, raw: bytes) -> Any:
    """`raw` parsed as JSON, a body that does not parse refused as FastAPI refuses it (`json_invalid` at its offset)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        pos, msg = (e.pos, e.msg) if isinstance(e, json.JSONDecodeError) else (e.start, e.reason)
        error = {"type": "json_invalid", "loc": ("body", pos), "msg": "JSON decode error", "input": {}}
        raise _refusal(request, [{**error, "ctx": {"error": msg}}], raw) from e


async def json_or_empty(request: Request) -> dict:
    """The JSON body of `request`, or `{}` when it has none (routes SGLang also serves on GET).

    Raises:
        RequestValidationError: the body does not parse or is not an object (answered by `validation_error_reply`).
    """
    raw = await request.body()
    body = _decode(request, raw) if raw else {}
    if not isinstance(body, dict):
        error = {"type": "dict_type", "loc": ("body",), "msg": "Input should be a valid dictionary", "input": body}
        raise _refusal(request, [error], body)
    return body


async def parse_request[R](request: Request, record: type[R]) -> tuple[R, dict[str, Any]]:
    """The body of `request` validated as SGLang validates `record.endpoint`'s, as `record` and as SGLang's fields.

    Args:
        request: the HTTP request.
        record: a request record with an `endpoint` (`slime_rollout.engines.wire`, or one of our own routes: its
            own fields and `abort_all_requests`).

    Returns:
        `(record built from the validated fields it has, every validated field of SGLang's body by name)`; the
        second holds what `record` lacks, e.g. `abort_all_requests` (a bool, SGLang's default when absent).

    Raises:
        RequestValidationError: no body, one that does not parse, or one SGLang's schema refuses (a missing or
            mistyped field, not an object); `validation_error_reply` answers it.
    """
    raw = await request.body()
    if not raw:
        raise _refusal(request, [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}], None)
    body = _decode(request, raw)
    try:
        fields = _adapter(record).validate_python(body).fields
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        raise _refusal(request, errors, body) from e
    own = {f.name for f in dataclasses.fields(record)}  # type: ignore[arg-type]
    return record(**{k: v for k, v in fields.items() if k in own}), fields


async def parse_generate(request: Request) -> GenerateBody:
    """The body of a `/generate` request, validated as SGLang's `GenerateReqInput`.

    Raises:
        RequestValidationError: a body that does not parse, is not an object, or mistypes a field (answered by
            `validation_error_reply`: HTTP 400, as SGLang).
    """
    body = await json_or_empty(request)
    try:
        return _GENERATE.validate_python(body)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        raise _refusal(request, errors, body) from e


async def validation_error_reply(request: Request, exc: RequestValidationError) -> JSONResponse:
    """SGLang's handler of a refused body: HTTP 400 and its `ErrorResponse` (the error text, then the error list)."""
    exc_str, errors_str = str(exc), str(exc.errors())
    message = f"{exc_str} {errors_str}" if errors_str and errors_str != exc_str else exc_str
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return JSONResponse(body, status_code=400)
