"""`--true-on-policy-mode` for the FSDP trainer: log-probs bit-identical to SGLang's for dense Qwen3 models.

Modules: `ops` (SGLang's row-wise ops restated: RMSNorm, RoPE, SiLU-mul, the sampler's log-softmax), `attention`
(prefill/decode kernels per position, SDPA backward), `kernels` (lazy, CUDA-only SGLang imports and its
batch-invariant matmuls), `qwen3` (the mirrored decoder forward over the HF model's weights).
"""

from slime_train_fsdp.true_on_policy.qwen3 import check_single_turn, install_mirrored_qwen3, mirrored_response_forward

__all__ = ["check_single_turn", "install_mirrored_qwen3", "mirrored_response_forward"]
