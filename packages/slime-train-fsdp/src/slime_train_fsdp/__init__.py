"""slime-train-fsdp: the FSDP2 training backend for Hugging Face causal LMs.

`FSDPTrainBackend` implements `slime_core.protocols.TrainBackend`, `FSDPCriticBackend` the PPO critic's
`slime_core.protocols.CriticBackend`; run one instance per rank after `torch.distributed.init_process_group`
(gloo on CPU, nccl on GPU). The exports are imported on first use so that the capability record
(`slime_train_fsdp.spec`, read when the config is validated) does not import torch's FSDP and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slime_train_fsdp.backend import FSDPTrainBackend
    from slime_train_fsdp.critic_backend import FSDPCriticBackend

__version__ = "0.1.0"

__all__ = ["FSDPCriticBackend", "FSDPTrainBackend"]

_EXPORTS = {"FSDPTrainBackend": "slime_train_fsdp.backend", "FSDPCriticBackend": "slime_train_fsdp.critic_backend"}


def __getattr__(name: str) -> Any:
    """Imports `FSDPTrainBackend` / `FSDPCriticBackend` on first access (PEP 562).

    Raises:
        AttributeError: any other name.
    """
    if name not in _EXPORTS:
        raise AttributeError(f"module 'slime_train_fsdp' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
