"""slime-train-megatron: the megatron-core training backend.

`MegatronTrainBackend` implements `slime_core.protocols.TrainBackend`, `MegatronCriticBackend` the PPO critic's
`slime_core.protocols.CriticBackend`. They need the `megatron` extra (`pip install 'slime-train-megatron[megatron]'`);
the package's other modules (settings, packing, TP shard helpers) import without it, so the exports below are
resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slime_train_megatron.backend import MegatronTrainBackend
    from slime_train_megatron.critic_backend import MegatronCriticBackend

__version__ = "0.1.0"

__all__ = ["MegatronCriticBackend", "MegatronTrainBackend"]

_EXPORTS = {
    "MegatronTrainBackend": "slime_train_megatron.backend",
    "MegatronCriticBackend": "slime_train_megatron.critic_backend",
}


def __getattr__(name: str) -> Any:
    """Imports `MegatronTrainBackend` / `MegatronCriticBackend` on first access (PEP 562).

    Raises:
        ImportError: megatron-core is not installed (the message names the extra to install).
        AttributeError: any other name.
    """
    if name not in _EXPORTS:
        raise AttributeError(f"module 'slime_train_megatron' has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(_EXPORTS[name])
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("megatron"):
            raise
        raise ImportError(f"{name} needs megatron-core: pip install 'slime-train-megatron[megatron]'") from exc
    return getattr(module, name)
