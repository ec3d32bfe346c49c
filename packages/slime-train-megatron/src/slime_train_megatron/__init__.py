"""slime-train-megatron: the megatron-core training backend.

`MegatronTrainBackend` implements `slime_core.protocols.TrainBackend`. It needs the `megatron` extra
(`pip install 'slime-train-megatron[megatron]'`); the package's other modules (settings, packing, TP
shard helpers) import without it, so the export below is resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slime_train_megatron.backend import MegatronTrainBackend

__version__ = "0.1.0"

__all__ = ["MegatronTrainBackend"]


def __getattr__(name: str) -> Any:
    """Imports `MegatronTrainBackend` on first access (PEP 562).

    Raises:
        ImportError: megatron-core is not installed (the message names the extra to install).
        AttributeError: any other name.
    """
    if name != "MegatronTrainBackend":
        raise AttributeError(f"module 'slime_train_megatron' has no attribute {name!r}")
    try:
        from slime_train_megatron.backend import MegatronTrainBackend
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("megatron"):
            raise
        raise ImportError(
            "MegatronTrainBackend needs megatron-core: pip install 'slime-train-megatron[megatron]'"
        ) from exc
    return MegatronTrainBackend
