"""Every Megatron-LM flag `parse_args` accepts, and what each backend does with it.

The original slime's launch scripts pass Megatron flags (`scripts/models/*.sh` and the `PERF_ARGS`,
`MISC_ARGS` of `scripts/run-*.sh`). `parse_args` collects them raw into `args.megatron_args`; this table says,
per flag and per backend, what happens, so that no flag that changes math, memory or parallelism is accepted
and ignored:

* `check`: an architecture description, compared with the HF config of `--hf-checkpoint` before the run
  (`slime_core.config.architecture`); a mismatch is an error. Both backends build the model from that config.
* `read`: the backend implements it (for Megatron: a `slime_train_megatron.settings.MegatronSettings` field).
* `same`: the backend always behaves as the flag asks (the note says how).
* `neutral`: the backend accepts only the value that equals its fixed behaviour (`neutral`), else an error.
* `recompute`: FSDP maps Megatron's full per-layer recompute to `--gradient-checkpointing`.
* `noop`: no effect on math or memory here, by design (kernel choice, logging, pretraining-only settings);
  listed once in the log.
* `error`: not implemented; setting it stops the run with one line saying what to use instead.

Flags that are `SlimeArgs` fields (`--lr`, `--seed`, `--micro-batch-size`, `--bf16`, ...) are absent: both
backends read them from the config. `MIGRATION.md` renders this table for users.
"""

from __future__ import annotations

import dataclasses

__all__ = ["MEGATRON_FLAGS", "MEGATRON_FLAG_RULES", "FlagRule"]


@dataclasses.dataclass(frozen=True, slots=True)
class FlagRule:
    """What the two backends do with one Megatron flag.

    Attributes:
        megatron: `check`, `read`, `same`, `neutral`, `noop` or `error` (see the module docstring).
        fsdp: `check`, `read`, `same`, `neutral`, `recompute`, `noop` or `error`.
        note: why (`same`, `noop`) or what to use instead (`error`), one clause.
        neutral: for `neutral`: the value (as written on the command line) FSDP's fixed behaviour equals;
            `"off"` for a switch that must be absent.
    """

    megatron: str
    fsdp: str
    note: str = ""
    neutral: str | None = None


ARCH = FlagRule("check", "check")
_KERNEL_NOTE = "a kernel/fusion choice with no effect on the math"


def _kernel(megatron: str = "noop", note: str = _KERNEL_NOTE) -> FlagRule:
    return FlagRule(megatron, "noop", note)


def _fsdp_error(note: str, megatron: str = "read") -> FlagRule:
    return FlagRule(megatron, "error", note)


def _neutral(value: str, note: str) -> FlagRule:
    return FlagRule("read", "neutral", note, neutral=value)


_TP = "FSDP shards parameters over all trainer ranks: use --train-backend megatron for tensor parallelism"
_PP = "FSDP has no pipeline stages: use --train-backend megatron for pipeline parallelism"
_EP = "FSDP runs the HF MoE layers without expert parallelism: use --train-backend megatron"
_OFFLOAD = "use --fsdp-cpu-offload (parameters, gradients and optimizer states on CPU)"
_MOE_AUX = "the HF MoE layers add no router loss under FSDP: use --train-backend megatron"

_ARCH_FLAGS = """
num-layers hidden-size ffn-hidden-size num-attention-heads group-query-attention num-query-groups kv-channels
max-position-embeddings position-embedding-type use-rotary-position-embeddings no-position-embedding rotary-base
rotary-percent rotary-interleaved rotary-scaling-factor rope-scaling-factor use-rope-scaling normalization
norm-epsilon apply-layernorm-1p swiglu squared-relu disable-bias-linear add-qkv-bias add-bias-linear qk-layernorm
untie-embeddings-and-output-weights vocab-size attention-dropout hidden-dropout multi-latent-attention q-lora-rank
kv-lora-rank qk-head-dim qk-pos-emb-head-dim v-head-dim mscale mscale-all-dim post-self-attn-layernorm
post-mlp-layernorm attention-output-gate use-gated-attention num-experts moe-ffn-hidden-size
moe-shared-expert-intermediate-size moe-shared-expert-gate moe-router-topk moe-router-score-function
moe-router-pre-softmax moe-router-enable-expert-bias moe-router-topk-scaling-factor moe-router-num-groups
moe-router-group-topk moe-layer-freq mtp-num-layers
"""

MEGATRON_FLAG_RULES: dict[str, FlagRule] = {f"--{name}": ARCH for name in _ARCH_FLAGS.split()}
MEGATRON_FLAG_RULES.update({
    # -- parallelism ------------------------------------------------------------------------------------------
    "--tensor-model-parallel-size": _neutral("1", _TP),
    "--pipeline-model-parallel-size": _neutral("1", _PP),
    "--expert-model-parallel-size": _neutral("1", _EP),
    "--expert-tensor-parallel-size": _neutral("1", _EP),
    "--context-parallel-size": FlagRule("read", "read"),  # FSDP: Ulysses all-to-all around attention
    "--sequence-parallel": FlagRule("read", "noop", "shards activations over TP ranks; FSDP has no TP (as Megatron "
                                    "at TP=1)"),
    "--decoder-first-pipeline-num-layers": _fsdp_error(_PP),
    "--decoder-last-pipeline-num-layers": _fsdp_error(_PP),
    "--num-layers-per-virtual-pipeline-stage": FlagRule("error", "error", "no interleaved (virtual) pipeline "
                                                        "schedule; drop it"),
    "--num-virtual-stages-per-pipeline-rank": FlagRule("error", "error", "no interleaved (virtual) pipeline schedule; "
                                                       "drop it"),
    "--account-for-embedding-in-pipeline-split": FlagRule("error", "error", "use --decoder-first-pipeline-num-layers"),
    "--account-for-loss-in-pipeline-split": FlagRule("error", "error", "use --decoder-last-pipeline-num-layers"),
    "--cp-comm-type": FlagRule("error", "error", "Megatron's context parallelism is Transformer Engine's p2p ring; "
                               "drop it"),
    "--allgather-cp": FlagRule("error", "error", "context parallelism is the ring (Megatron) or all-to-all (FSDP); "
                               "drop it"),
    "--use-distributed-optimizer": FlagRule("read", "same", "FSDP always shards optimizer states"),
    "--no-use-distributed-optimizer": _fsdp_error("FSDP always shards optimizer states"),
    "--overlap-grad-reduce": _kernel(),
    "--overlap-param-gather": _kernel(),
    "--tp-comm-overlap": _kernel(),
    # -- memory: recompute and offload ------------------------------------------------------------------------
    "--recompute-granularity": FlagRule("read", "recompute"),
    "--recompute-method": FlagRule("read", "recompute"),
    "--recompute-num-layers": FlagRule("read", "recompute"),
    "--recompute-activations": FlagRule("error", "error", "use --recompute-granularity full (Megatron) or "
                                        "--gradient-checkpointing (FSDP)"),
    "--recompute-modules": FlagRule("error", "error", "use --recompute-granularity full"),
    "--moe-layer-recompute": FlagRule("error", "error", "use --recompute-granularity full"),
    "--optimizer-cpu-offload": _fsdp_error(_OFFLOAD),
    "--overlap-cpu-optimizer-d2h-h2d": _fsdp_error(_OFFLOAD),
    "--optimizer-offload-fraction": _fsdp_error(_OFFLOAD),
    "--use-precision-aware-optimizer": _fsdp_error("FSDP keeps fp32 optimizer states; drop it"),
    "--main-grads-dtype": FlagRule("error", "error", "gradients are reduced and kept in fp32; drop it"),
    "--main-params-dtype": FlagRule("error", "error", "master weights are fp32; drop it"),
    "--exp-avg-dtype": FlagRule("error", "error", "Adam moments are fp32; drop it"),
    "--exp-avg-sq-dtype": FlagRule("error", "error", "Adam moments are fp32; drop it"),
    # -- precision --------------------------------------------------------------------------------------------
    "--accumulate-allreduce-grads-in-fp32": FlagRule("same", "same", "gradients are always reduced in fp32"),
    "--attention-softmax-in-fp32": FlagRule("read", "same", "the attention kernels compute the softmax in fp32"),
    "--fp8-format": FlagRule("error", "error", "no FP8 training; train in bf16 (FP8 rollout: an FP8 --hf-checkpoint "
                             "and the bf16 --ref-load)"),
    "--fp8-recipe": FlagRule("error", "error", "no FP8 training; drop it"),
    "--fp8-param-gather": FlagRule("error", "error", "no FP8 training; drop it"),
    "--fp8-amax-history-len": FlagRule("error", "error", "no FP8 training; drop it"),
    "--fp8-amax-compute-algo": FlagRule("error", "error", "no FP8 training; drop it"),
    # -- MoE training -----------------------------------------------------------------------------------------
    "--moe-aux-loss-coeff": _neutral("0", _MOE_AUX),
    "--moe-z-loss-coeff": _neutral("0", _MOE_AUX),
    "--moe-router-load-balancing-type": FlagRule("read", "noop", "only weights the router loss, which FSDP does "
                                                 "not add (--moe-aux-loss-coeff must be 0)"),
    "--moe-router-bias-update-rate": _neutral("0", "the HF MoE layers do not update expert biases under FSDP: use "
                                              "--train-backend megatron"),
    "--moe-router-dtype": _fsdp_error("the HF router runs in the model's dtype under FSDP: drop it or use "
                                      "--train-backend megatron"),
    "--moe-token-drop-policy": _neutral("probs", "the HF MoE layers drop no tokens (Megatron's default 'probs' "
                                        "without a capacity factor)"),
    "--moe-expert-capacity-factor": _fsdp_error("the HF MoE layers drop no tokens: use --train-backend megatron"),
    "--moe-pad-expert-input-to-capacity": _fsdp_error("the HF MoE layers drop no tokens: use --train-backend "
                                                      "megatron"),
    "--moe-token-dispatcher-type": _kernel("read"),
    "--moe-grouped-gemm": _kernel("read"),
    "--moe-permute-fusion": _kernel("read"),
    "--moe-enable-deepep": _kernel("read"),
    "--moe-router-fusion": _kernel(),
    "--moe-shared-expert-overlap": _kernel(),
    # -- kernels, fusions, layer implementation ---------------------------------------------------------------
    "--transformer-impl": _kernel("read"),
    "--attention-backend": _kernel("read", "an attention kernel choice (FSDP: --attn-implementation)"),
    "--use-flash-attn": _kernel(note="an attention kernel choice (FSDP: --attn-implementation)"),
    "--no-rope-fusion": FlagRule("same", "noop", "RoPE is never fused"),
    "--apply-rope-fusion": _kernel(),
    "--no-masked-softmax-fusion": FlagRule("same", "noop", "the masked softmax is never fused"),
    "--no-bias-swiglu-fusion": FlagRule("same", "noop", "bias-SwiGLU is not fused unless --bias-swiglu-fusion"),
    "--no-bias-dropout-fusion": FlagRule("same", "noop", "bias-dropout is not fused unless --bias-dropout-fusion"),
    # Megatron-LM's defaults (its dest names); off by default here since they compile at first use.
    "--bias-swiglu-fusion": _kernel("read"),
    "--bias-dropout-fusion": _kernel("read"),
    "--megatron-compile-layers": FlagRule("read", "noop", "FSDP: --fsdp-compile-layers"),
    "--no-megatron-compile-layers": FlagRule("read", "noop", "FSDP: --no-fsdp-compile-layers"),
    "--no-gradient-accumulation-fusion": FlagRule("same", "noop", "gradient accumulation is never fused"),
    "--cross-entropy-loss-fusion": _kernel(),
    "--cross-entropy-fusion-impl": _kernel(),
    "--qwen-gdn-backend": _kernel(),
    "--spec": FlagRule("check", "noop", "names a Megatron layer spec: the Megatron backend builds its layers from "
                       "config.json (Qwen2/Qwen3/Llama/Qwen3-MoE: megatron-core's GPT layer; GLM4: the original's "
                       "slime_plugins.models.glm4 get_glm_spec) and checks that the spec names that layer; under "
                       "FSDP the HF model is the spec"),
    "--make-vocab-size-divisible-by": FlagRule("read", "noop", "Megatron pads the embedding/output rows to a multiple "
                                               "of it × TP (recorded in torch_dist checkpoints; padding rows never "
                                               "reach the log-probs or the engines); FSDP keeps the HF vocabulary "
                                               "and never pads"),
    "--padded-vocab-size": FlagRule("error", "error", "use --make-vocab-size-divisible-by"),
    # -- checkpoints ------------------------------------------------------------------------------------------
    "--finetune": FlagRule("read", "error", "FSDP resumes from --load; to start fresh, leave --load out"),
    "--ckpt-format": FlagRule("neutral", "neutral", "checkpoints are torch_dist (Megatron) and DCP (FSDP)",
                              neutral="torch_dist"),
    "--use-checkpoint-args": FlagRule("error", "error", "the architecture comes from --hf-checkpoint's config.json"),
    "--dist-ckpt-strictness": _kernel(note="checkpoint loading detail"),
    "--auto-detect-ckpt-format": _kernel(note="checkpoint loading detail"),
    "--ckpt-fully-parallel-save": _kernel(note="checkpoint I/O detail"),
    "--no-ckpt-fully-parallel-save": _kernel(note="checkpoint I/O detail"),
    "--ckpt-fully-parallel-load": _kernel(note="checkpoint I/O detail"),
    "--use-persistent-ckpt-worker": _kernel(note="checkpoint I/O detail"),
    # -- settings of Megatron's pretraining loop that slime's loop replaces -----------------------------------
    "--seq-length": _kernel(note="slime packs by --max-tokens-per-gpu, not a fixed sequence length"),
    "--train-iters": _kernel(note="the run length is --num-rollout × --num-steps-per-rollout"),
    "--init-method-std": _kernel(note="weights are loaded, never initialized"),
    "--use-mcore-models": _kernel(note="megatron-core models are the only kind"),
    "--tokenizer-type": _kernel(note="the tokenizer is --hf-checkpoint's"),
    "--tokenizer-model": _kernel(note="the tokenizer is --hf-checkpoint's"),
    "--no-create-attention-mask-in-dataloader": _kernel(note="packed batches carry no attention mask"),
    "--log-interval": _kernel(note="metrics are logged once per rollout"),
    "--timing-log-level": _kernel(note="timings are logged as perf/* metrics"),
    "--manual-gc": _kernel(note="a Python GC schedule"),
    "--manual-gc-interval": _kernel(note="a Python GC schedule"),
    "--empty-unused-memory-level": _kernel(note="an allocator cache setting"),
    "--enable-experimental": _kernel(note="enables no slime feature"),
    # Off (the flag given), an optimizer step whose gradient norm is NaN/inf is skipped (optimizer and LR schedule);
    # on, such a gradient stops the run. Both backends read it (`SlimeArgs.check_for_nan_in_loss_and_grad`).
    "--no-check-for-nan-in-loss-and-grad": FlagRule(
        "read", "read", "given, an optimizer step whose gradient norm is not finite is skipped; else it stops the run"
    ),
    # -- slime's own Megatron-only flags ----------------------------------------------------------------------
    "--megatron-to-hf-mode": FlagRule("error", "error", "HF names come from slime-convert's mapping tables"),
    # Without Transformer Engine or Apex megatron-core falls back to torch's AdamW and a per-parameter grad norm
    # (slime_train_megatron.torch_optimizer); these make those fallbacks fast, and are on by default (megatron-core
    # with Apex or TE runs fused kernels there too); the `--no-` forms turn them off. FSDP's AdamW is fused on CUDA
    # and its grad norm is torch's multi-tensor one, whatever is asked.
    "--use-torch-fused-adam": FlagRule("read", "same", "FSDP's AdamW is torch's fused kernel on CUDA"),
    "--use-foreach-grad-norm": FlagRule("read", "same", "FSDP's grad norm and clipping are torch's multi-tensor ones"),
    "--no-use-torch-fused-adam": _fsdp_error("FSDP's AdamW is always torch's fused kernel on CUDA"),
    "--no-use-foreach-grad-norm": _fsdp_error("FSDP's grad norm and clipping are always torch's multi-tensor ones"),
    "--freeze-indexer": FlagRule("error", "error", "use --freeze-params-name-list"),
    "--enable-mtp-training": FlagRule("error", "error", "multi-token-prediction layers are not trained"),
    "--mtp-loss-scaling-factor": FlagRule("error", "error", "multi-token-prediction layers are not trained"),
})  # fmt: skip

#: Every Megatron flag `parse_args` accepts (collected raw into `args.megatron_args`).
MEGATRON_FLAGS: frozenset[str] = frozenset(MEGATRON_FLAG_RULES)
