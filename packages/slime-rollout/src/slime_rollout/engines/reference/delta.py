"""The reference engine's `/update_weights_from_delta`: rebuild, verify, then load a delta push.

slime's own endpoint (SGLang 0.5.16 has none; `slime_rollout.weight_sync.delta_sync` explains the protocol). A request
holds compressed deltas of some tensors against the weights of `base_version`. The engine refuses it unless it holds
that version (or the earlier buckets of this same push have landed), rebuilds every tensor of the request from its
own bytes, checks each one's checksum, and only when all match copies them in: a corrupt request changes nothing.

An FP8-serving engine rebuilds a pushed e4m3 weight or its `weight_scale_inv` from the FP8 tensors it received last
(`fp8.ServedFp8.held`, the bytes SGLang would hold), not from the dequantized weight it computes with, and loads the
rebuilt pair (the unchanged half from what it holds) as an FP8 push.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from slime_core.fp8 import SCALE_SUFFIX
from slime_core.hf_names import to_module_name
from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.weight_delta import COMPRESSION, UpdateWeightsFromDeltaReq, tensor_bytes, verified_apply

__all__ = ["apply_delta_request", "base_refusal"]


def base_refusal(req: UpdateWeightsFromDeltaReq, held_version: str, open_push: str | None) -> str | None:
    """Why the engine cannot apply `req` on what it holds, or None.

    Args:
        req: the request.
        held_version: the engine's reported weight version.
        open_push: the version of the buckets landed since the last fence (None: no push open).
    """
    if open_push is not None and req.weight_version is not None and str(req.weight_version) == open_push:
        return None  # a later bucket of the push whose first buckets already moved the reported version
    if str(req.base_version) != str(held_version):
        return (
            f"/update_weights_from_delta: the delta applies to weight_version {req.base_version!r} but this engine "
            f"holds {held_version!r} (restarted, or missed a push); push the weights in full"
        )
    return None


def apply_delta_request(
    model: ReferenceModel, named_payloads: Iterable[tuple[str, torch.Tensor]], req: UpdateWeightsFromDeltaReq
) -> int:
    """Rebuilds each tensor from the model's bytes and its delta, verifies all checksums, then loads them all.

    Args:
        model: the engine's model.
        named_payloads: `(HF name, [m] uint8 compressed delta)`.
        req: the request (encoding, checksum algorithm, per-tensor checksums).

    Returns:
        Tensors loaded.

    Raises:
        KeyError: a name the model does not have.
        slime_rollout.engines.weight_delta.DeltaChecksumError: a tensor rebuilds to other bytes than the trainer hashed
            (names it); nothing is loaded.
        ValueError: a payload without its checksum, or an unknown compression.
    """
    if req.compression_format != COMPRESSION:
        raise ValueError(f"/update_weights_from_delta: compression {req.compression_format!r}, only zstd is known")
    state = model.model.state_dict()
    fp8_held = model.weights.fp8.held  # name -> the e4m3 weight or float32 scale received last
    rebuilt = []
    fp8_rebuilt: dict[str, torch.Tensor] = {}
    with model.lock, torch.no_grad():
        for name, payload in named_payloads:
            if name not in req.checksums:
                raise ValueError(f"/update_weights_from_delta: no checksum sent for {name!r}")
            if name in fp8_held:
                base = fp8_held[name]
                fp8_rebuilt[name] = _from_bytes(_verified(name, base, payload, req), base)
                continue
            # A per-expert MoE matrix lands in its slice of a fused parameter, as a full push does.
            target = model.weights.target(to_module_name(name, model.model_type), state)
            if target is None:
                raise KeyError(f"update_weights_from_delta: unknown parameter {name!r}")
            rebuilt.append((target, _verified(name, target, payload, req)))
        if fp8_rebuilt:
            # Dequantized and loaded as a pair (checked whole first); the unchanged half is the one held.
            partners = {_fp8_partner(n) for n in fp8_rebuilt} - set(fp8_rebuilt)
            model.weights.load_named_tensors([*fp8_rebuilt.items(), *((n, fp8_held[n]) for n in partners)])
        for target, new in rebuilt:
            target.copy_(_from_bytes(new, target).to(target.device))
    return len(rebuilt) + len(fp8_rebuilt)


def _verified(name: str, base: torch.Tensor, payload: torch.Tensor, req: UpdateWeightsFromDeltaReq) -> Any:
    """The new bytes of `name`, rebuilt from `base`'s bytes and checked against the sent checksum."""
    return verified_apply(
        name, tensor_bytes(base), payload.numpy(), encoding=req.delta_encoding, algorithm=req.checksum_format,
        expected=req.checksums[name],
    )  # fmt: skip


def _from_bytes(new: Any, like: torch.Tensor) -> torch.Tensor:
    """`[n]` uint8 bytes as a CPU tensor of `like`'s dtype and shape."""
    return torch.from_numpy(new).view(like.dtype).reshape(like.shape)


def _fp8_partner(name: str) -> str:
    """The other half of an FP8 pair: `X.weight` <-> `X.weight_scale_inv`."""
    if name.endswith(SCALE_SUFFIX):
        return name.removesuffix(SCALE_SUFFIX) + ".weight"
    return name.removesuffix(".weight") + SCALE_SUFFIX
