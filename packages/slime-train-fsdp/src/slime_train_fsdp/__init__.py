"""slime-train-fsdp: the FSDP2 training backend for Hugging Face causal LMs.

`FSDPTrainBackend` implements `slime_core.protocols.TrainBackend`, `FSDPCriticBackend` the PPO critic's
`slime_core.protocols.CriticBackend`; run one instance per rank after `torch.distributed.init_process_group`
(gloo on CPU, nccl on GPU).
"""

from slime_train_fsdp.backend import FSDPTrainBackend
from slime_train_fsdp.critic_backend import FSDPCriticBackend

__version__ = "0.1.0"

__all__ = ["FSDPCriticBackend", "FSDPTrainBackend"]
