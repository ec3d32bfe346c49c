"""Builtins encoding of a `Sample`'s media and tensors, so `Sample.to_dict` output survives JSON.

`to_dict` stores images as PNG `data:` URIs and tensors as `{"dtype", "shape", "data"}`; `from_dict` turns the
tensors back (a tensor in a `torch.save` dump passes through).
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["as_int32", "decode_tensor", "encode_media", "encode_tensor"]


def encode_media(item: Any) -> Any:
    """A `PIL.Image` (what the original's plugins store) as a lossless PNG `data:` URI; anything else as it is.

    So `to_dict` stays JSON-friendly (the partial-rollout buffer is saved as JSON). Duck-typed: core has no Pillow.
    """
    if callable(getattr(item, "save", None)) and hasattr(item, "mode") and hasattr(item, "size"):
        buffer = io.BytesIO()
        item.save(buffer, format="PNG")
        return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return item


def encode_tensor(tensor: Any) -> dict[str, Any]:
    """A tensor as builtins (`{"dtype", "shape", "data"}`, data flattened), so `to_dict` output survives JSON."""
    t = tensor.detach().cpu()
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": t.reshape(-1).tolist()}


def as_int32(value: Any) -> torch.Tensor:
    """Routes given as a tensor or nested int lists, as an int32 tensor."""
    import torch

    return torch.as_tensor(value, dtype=torch.int32)


def decode_tensor(value: Any, field: str = "multimodal_train_inputs") -> torch.Tensor:
    """Inverse of `encode_tensor`; a tensor passes through (dumps made by `torch.save` keep real tensors)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    try:
        dtype = getattr(torch, value["dtype"])
        return torch.tensor(value["data"], dtype=dtype).reshape(value["shape"])
    except (KeyError, TypeError, AttributeError, RuntimeError) as e:
        raise ValueError(f"Sample.from_dict: bad {field} tensor ({e})") from None
