"""The FSDP trainer's load log line names the log-prob head that actually runs (`model_loading.loaded_message`).

Under `--true-on-policy-mode` on CUDA the default `--log-probs-head` resolves to `fused`, and the line said
`head=fused` while every forward ran the mode's own head (SGLang's bf16 lm_head and sampler log-softmax).
"""

import torch

from slime_core.config import SlimeArgs
from slime_train_fsdp.model_loading import _forward_options, loaded_message

BASE = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp"}
CUDA = torch.device("cuda")  # a device name only: nothing here touches a GPU


def _message(**fields) -> str:
    options = _forward_options(SlimeArgs.from_dict({**BASE, **fields}), CUDA, "slime_varlen", False)
    return loaded_message("/models/qwen3", "Qwen3ForCausalLM", "slime_varlen", options, 1, 8)


def test_true_on_policy_mode_logs_its_own_head_not_the_default_one():
    assert _message(true_on_policy_mode=True) == (
        "loaded /models/qwen3 (Qwen3ForCausalLM, attn=slime_varlen, head=true-on-policy (SGLang's bf16 lm_head), "
        "cp=1) sharded over 8 ranks"
    )


def test_without_the_mode_the_configured_head_is_logged():
    assert "head=fused," in _message()
    assert "head=fp32out," in _message(log_probs_head="fp32out")
