"""Megatron-LM flag names that `parse_args` accepts and forwards raw to the Megatron backend.

The list is curated from what the original slime's model scripts (`scripts/models/*.sh`) and run
scripts pass: model shape, parallelism, recompute, MoE, optimizer offload, precision and
checkpoint-format flags, plus the slime flags that only the Megatron backend reads. Flags that are
first-class `SlimeArgs` fields (`--lr`, `--seed`, `--micro-batch-size`, `--bf16`, `--optimizer`,
...) are deliberately absent: both backends read them from `args` and the Megatron backend maps them.
"""

from __future__ import annotations

__all__ = ["MEGATRON_FLAGS"]

_MODEL_SHAPE = """
num-layers hidden-size ffn-hidden-size num-attention-heads group-query-attention num-query-groups kv-channels
max-position-embeddings seq-length position-embedding-type use-rotary-position-embeddings rotary-base
rotary-percent rotary-interleaved rotary-scaling-factor rope-scaling-factor use-rope-scaling no-rope-fusion
apply-rope-fusion normalization norm-epsilon apply-layernorm-1p swiglu squared-relu disable-bias-linear
add-qkv-bias add-bias-linear qk-layernorm untie-embeddings-and-output-weights vocab-size padded-vocab-size
make-vocab-size-divisible-by init-method-std attention-dropout hidden-dropout multi-latent-attention
q-lora-rank kv-lora-rank qk-head-dim qk-pos-emb-head-dim v-head-dim mscale mscale-all-dim spec
transformer-impl attention-backend use-flash-attn no-masked-softmax-fusion no-bias-swiglu-fusion
no-bias-dropout-fusion no-gradient-accumulation-fusion cross-entropy-loss-fusion cross-entropy-fusion-impl
use-mcore-models tokenizer-type tokenizer-model no-create-attention-mask-in-dataloader
"""

_MOE = """
num-experts moe-ffn-hidden-size moe-shared-expert-intermediate-size moe-router-topk moe-router-score-function
moe-router-enable-expert-bias moe-router-bias-update-rate moe-router-load-balancing-type
moe-router-topk-scaling-factor moe-router-pre-softmax moe-router-dtype moe-router-num-groups
moe-router-group-topk moe-router-fusion moe-layer-freq moe-grouped-gemm moe-token-dispatcher-type
moe-aux-loss-coeff moe-z-loss-coeff moe-permute-fusion moe-enable-deepep moe-shared-expert-overlap
moe-expert-capacity-factor moe-pad-expert-input-to-capacity moe-layer-recompute
"""

_PARALLEL = """
tensor-model-parallel-size pipeline-model-parallel-size context-parallel-size expert-model-parallel-size
expert-tensor-parallel-size sequence-parallel decoder-first-pipeline-num-layers decoder-last-pipeline-num-layers
num-layers-per-virtual-pipeline-stage num-virtual-stages-per-pipeline-rank account-for-embedding-in-pipeline-split
account-for-loss-in-pipeline-split cp-comm-type use-distributed-optimizer overlap-grad-reduce overlap-param-gather
tp-comm-overlap
"""

_RECOMPUTE_OFFLOAD_PRECISION = """
recompute-granularity recompute-method recompute-num-layers recompute-modules recompute-activations
optimizer-cpu-offload overlap-cpu-optimizer-d2h-h2d use-precision-aware-optimizer optimizer-offload-fraction
main-grads-dtype main-params-dtype exp-avg-dtype exp-avg-sq-dtype accumulate-allreduce-grads-in-fp32
attention-softmax-in-fp32 fp8-format fp8-recipe fp8-param-gather fp8-amax-history-len fp8-amax-compute-algo
"""

_CHECKPOINT_MISC = """
ckpt-format finetune dist-ckpt-strictness use-checkpoint-args auto-detect-ckpt-format ckpt-fully-parallel-save
no-ckpt-fully-parallel-save ckpt-fully-parallel-load use-persistent-ckpt-worker log-interval timing-log-level
manual-gc manual-gc-interval empty-unused-memory-level train-iters
"""

# slime flags that only the Megatron backend reads.
_SLIME_MEGATRON_ONLY = """
megatron-to-hf-mode qwen-gdn-backend allgather-cp freeze-indexer mtp-num-layers mtp-loss-scaling-factor
enable-mtp-training
"""

MEGATRON_FLAGS: frozenset[str] = frozenset(
    "--" + name
    for block in (_MODEL_SHAPE, _MOE, _PARALLEL, _RECOMPUTE_OFFLOAD_PRECISION, _CHECKPOINT_MISC, _SLIME_MEGATRON_ONLY)
    for name in block.split()
)
