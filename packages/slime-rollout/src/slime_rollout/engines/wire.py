"""The weight-update wire format: what travels between a trainer and an engine, in one place.

Both ends import this module and nothing of each other: the trainer side (`slime_rollout.weight_sync.updaters`, through
`slime_rollout.engines.engine_client.EngineClient`) encodes, the engine side (the CPU reference engine,
`slime_rollout.engines.reference.routes.weights`) decodes; SGLang 0.5.16 is the other engine that reads it. Three parts:

* **Requests**: one frozen dataclass per weight-update endpoint (LoRA adapter loads included) holding the JSON fields
  slime sends, named as
  SGLang's `io_struct.py` names them (`UpdateWeightsFromTensorReqInput`, ...). The sender calls `to_json()`;
  the receiver validates a body against SGLang's types (`slime_rollout.engines.reference.routes.bodies`).
* **Named-tensor payload** of `/update_weights_from_tensor`: `serialize_named_tensors` /
  `deserialize_named_tensors`, SGLang's `MultiprocessingSerializer` format (base64 of a torch `ForkingPickler`
  dump: CUDA tensors as IPC handles, CPU tensors in shared memory), either a plain list of `(name, tensor)` or
  a flattened bucket.
* **Broadcast** of `/update_weights_from_distributed`: dtype names (`dtype_name` / `dtype_from_name`), the
  process group both ends join (`init_custom_process_group`) and the NCCL setting both ends must share
  (`nccl_cumem_enable`).

torch is imported only by the functions that need it, so the HTTP client stays free of it.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import io
import os
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_GROUP_NAME",
    "NCCL_CUMEM_DEFAULT",
    "AbortReq",
    "DestroyWeightsUpdateGroupReq",
    "InitWeightsUpdateGroupReq",
    "LoadLoRAAdapterReq",
    "UnloadLoRAAdapterReq",
    "UpdateWeightsFromDiskReq",
    "UpdateWeightsFromDistributedReq",
    "UpdateWeightsFromTensorReq",
    "UpdateWeightVersionReq",
    "WeightUpdateRequest",
    "deserialize_named_tensors",
    "dtype_from_name",
    "dtype_name",
    "init_custom_process_group",
    "nccl_cumem_enable",
    "serialize_named_tensors",
]

# SGLang's default group name when a request names none (`UpdateWeightsFromDistributedReqInput.group_name`).
DEFAULT_GROUP_NAME = "weight_update_group"


# ---------------------------------------------------------------------------------------------- requests


class WeightUpdateRequest:
    """Base of the request records: the endpoint, and the JSON body with one key per field."""

    endpoint: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """The request body (every field, defaults included)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class UpdateWeightsFromDiskReq(WeightUpdateRequest):
    """`POST /update_weights_from_disk`: reload the weights from an HF checkpoint directory.

    Attributes:
        model_path: directory of `*.safetensors` files the engine can read.
        load_format: SGLang load format (None: the engine's default).
        weight_version: the version the engine reports afterwards (None: unchanged).
    """

    endpoint: ClassVar[str] = "/update_weights_from_disk"

    model_path: str
    load_format: str | None = None
    weight_version: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class UpdateWeightsFromTensorReq(WeightUpdateRequest):
    """`POST /update_weights_from_tensor`: named tensors shared by a colocated trainer.

    Attributes:
        serialized_named_tensors: one `serialize_named_tensors` payload per engine TP rank.
        load_format: None for a plain `[(name, tensor), ...]` list, "flattened_bucket" for SGLang's
            `FlattenedTensorBucket` dict (see `deserialize_named_tensors`).
        flush_cache: flush the engine's prefix cache after loading.
        weight_version: the version the engine reports afterwards (None: unchanged).
    """

    endpoint: ClassVar[str] = "/update_weights_from_tensor"

    serialized_named_tensors: list[str]
    load_format: str | None = None
    flush_cache: bool = False
    weight_version: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class InitWeightsUpdateGroupReq(WeightUpdateRequest):
    """`POST /init_weights_update_group`: the engine's TP ranks join the trainer's broadcast group.

    Attributes:
        master_address: host of the group's TCP store (the trainer's rank 0).
        master_port: port of that store.
        rank_offset: group rank of the engine's first TP rank (the trainer is rank 0).
        world_size: 1 + the number of engine ranks of every engine.
        group_name: name of the group; also the store's key prefix (see `init_custom_process_group`).
        backend: "nccl" on GPUs, "gloo" for CPU tensors.
    """

    endpoint: ClassVar[str] = "/init_weights_update_group"

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "nccl"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class UpdateWeightsFromDistributedReq(WeightUpdateRequest):
    """`POST /update_weights_from_distributed`: announces one bucket that rank 0 then broadcasts, in order.

    Attributes:
        names: HF parameter names, in broadcast order.
        dtypes: `dtype_name` of each tensor ("bfloat16", ...).
        shapes: shape of each tensor.
        group_name: the group made by `/init_weights_update_group`.
        flush_cache: flush the engine's prefix cache after loading.
        weight_version: the version the engine reports afterwards (None: unchanged).
        load_format: SGLang load format (None: the engine's default).
    """

    endpoint: ClassVar[str] = "/update_weights_from_distributed"

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = DEFAULT_GROUP_NAME
    flush_cache: bool = False
    weight_version: str | None = None
    load_format: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DestroyWeightsUpdateGroupReq(WeightUpdateRequest):
    """`POST /destroy_weights_update_group`.

    Attributes:
        group_name: the group to tear down.
    """

    endpoint: ClassVar[str] = "/destroy_weights_update_group"

    group_name: str = DEFAULT_GROUP_NAME


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class UpdateWeightVersionReq(WeightUpdateRequest):
    """`POST /update_weight_version`: the fence that ends a push, setting the version the engine reports.

    Attributes:
        new_version: the version `/model_info` reports afterwards.
        abort_all_requests: abort every running request first (SGLang's field; slime sends False).
    """

    endpoint: ClassVar[str] = "/update_weight_version"

    new_version: str
    abort_all_requests: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LoadLoRAAdapterReq(WeightUpdateRequest):
    """`POST /load_lora_adapter` (SGLang's `LoadLoRAAdapterReqInput`): load an adapter's files under a name.

    Attributes:
        lora_name: the name requests give as `lora_path` of `/generate`.
        lora_path: the adapter directory (PEFT's `adapter_config.json` + `adapter_model.safetensors`).
        pinned: keep the adapter resident in SGLang's LoRA memory pool (not read by the reference engine).
        lora_id: SGLang's internal id (not read).
    """

    endpoint: ClassVar[str] = "/load_lora_adapter"

    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class UnloadLoRAAdapterReq(WeightUpdateRequest):
    """`POST /unload_lora_adapter` (SGLang's `UnloadLoRAAdapterReqInput`).

    Attributes:
        lora_name: the adapter to unload.
        lora_id: SGLang's internal id (not read).
    """

    endpoint: ClassVar[str] = "/unload_lora_adapter"

    lora_name: str
    lora_id: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AbortReq(WeightUpdateRequest):
    """`POST /abort_request` (SGLang's `AbortReq`): abort one request, or every one.

    Attributes:
        rid: the request to abort (SGLang's `BaseReq.rid`; None or "" names none).
        abort_all: abort every running and waiting request.
    """

    endpoint: ClassVar[str] = "/abort_request"

    rid: str | None = None
    abort_all: bool = False


# ----------------------------------------------------------------------------------- named-tensor payload


def serialize_named_tensors(obj: Any) -> str:
    """SGLang's `MultiprocessingSerializer.serialize(obj, output_str=True)` format: base64 of a ForkingPickler dump.

    CPU tensors are moved to shared memory by torch's reducers; call `torch.multiprocessing.set_sharing_strategy(
    "file_system")` first (done by `TensorWeightUpdater`) so that an unrelated process can open them.

    Args:
        obj: a list of `(name, tensor)`, or a flattened bucket `{"flattened_tensor", "metadata"}`.

    Returns:
        ASCII text for `UpdateWeightsFromTensorReq.serialized_named_tensors`.
    """
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def deserialize_named_tensors(payload: str | bytes, load_format: str | None) -> list[tuple[str, torch.Tensor]]:
    """Decodes one entry of `serialized_named_tensors` (SGLang's `MultiprocessingSerializer` format).

    Args:
        payload: base64 text (or raw bytes) of a torch `ForkingPickler` dump.
        load_format: None/"direct" for a list of `(name, tensor)`; "flattened_bucket" for
            `{"flattened_tensor": [N] tensor, "metadata": [objects or dicts with name, shape, dtype,
            start_idx, end_idx]}` (SGLang >= 0.5 flattens to uint8 with byte offsets and mixed dtypes).

    Returns:
        The named tensors (views into shared memory: copy before the caller frees them).

    Raises:
        ValueError: unknown load format or a malformed payload.
    """
    raw = base64.b64decode(payload, validate=True) if isinstance(payload, str) else payload
    obj = ForkingPickler.loads(raw)
    if load_format in (None, "direct"):
        if not isinstance(obj, list | tuple):
            raise ValueError(f"update_weights_from_tensor: expected a list of (name, tensor), got {type(obj)}")
        return [(str(n), t) for n, t in obj]
    if load_format == "flattened_bucket":
        flat = obj["flattened_tensor"]
        out = []
        for meta in obj["metadata"]:
            get = meta.get if isinstance(meta, dict) else lambda k, m=meta: getattr(m, k)
            start, end = int(get("start_idx")), int(get("end_idx"))
            out.append((get("name"), flat[start:end].view(get("dtype")).reshape(tuple(get("shape")))))
        return out
    raise ValueError(f"update_weights_from_tensor: unsupported load_format {load_format!r}")


# ------------------------------------------------------------------------------------------- broadcast


def broadcast_buffer(tensor: torch.Tensor, backend: str) -> torch.Tensor:
    """What to pass to `broadcast` for `tensor`: gloo has no float8 type, so an FP8 tensor goes as its uint8 view.

    The view shares the tensor's storage, so receiving into it fills the FP8 tensor; the bytes on the wire are the
    same either way (NCCL, which SGLang uses, takes the FP8 tensor itself).
    """
    import torch

    if backend == "gloo" and tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return tensor.view(torch.uint8)
    return tensor


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16": how `UpdateWeightsFromDistributedReq.dtypes` names a dtype."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """`"bfloat16"` -> `torch.bfloat16` (the inverse of `dtype_name`).

    Raises:
        ValueError: `name` is not a torch dtype.
    """
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"update_weights_from_distributed: unknown dtype {name!r}")
    return dtype


# NCCL's own default (cuMem buffers), the value both ends of a weight-update group run with unless the user sets
# NCCL_CUMEM_ENABLE.
NCCL_CUMEM_DEFAULT = "1"


def nccl_cumem_enable() -> str:
    """The `NCCL_CUMEM_ENABLE` every slime process and engine runs with: the user's, else `NCCL_CUMEM_DEFAULT`.

    NCCL in the trainer and in the engines must agree on cuMem vs legacy CUDA-IPC buffers, or the NCCL
    weight-update broadcast between them never completes; SGLang would switch its own processes to 0.
    """
    return os.environ.get("NCCL_CUMEM_ENABLE", NCCL_CUMEM_DEFAULT)


def init_custom_process_group(
    *,
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: datetime.timedelta | None = None,
) -> torch.distributed.ProcessGroup:
    """A process group outside the default one (the engines and the trainer's rank 0), as SGLang builds it.

    Mirrors `sglang.srt.utils.common.init_custom_process_group`: torch's rendezvous, the TCP store wrapped in
    `PrefixStore(group_name, ...)`, then `_new_process_group_helper`. Both ends must use the same key prefix,
    or NCCL's unique-id exchange waits forever (the symptom: the first broadcast hangs). `torch.distributed`
    need not be initialized.

    Args:
        backend: "nccl" or "gloo".
        init_method: `tcp://host:port` of the group's store (rank 0 hosts it).
        world_size: number of ranks in the group.
        rank: this process's rank.
        group_name: the group's name and store key prefix.
        timeout: rendezvous and collective timeout (default 10 minutes).

    Returns:
        The process group (ranks are group ranks: `group_src=0` is the trainer).
    """
    from torch.distributed import distributed_c10d as c10d

    timeout = timeout or datetime.timedelta(minutes=10)
    store, rank, world_size = next(c10d.rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    pg, _ = c10d._new_process_group_helper(
        world_size, rank, [], c10d.Backend(backend), store, group_name=group_name, timeout=timeout
    )
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg
