"""Config groups for the RL algorithm and loss, the optimizer, the FSDP backend and checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from slime_core.config.base import ArgsGroup, arg, check_registered

__all__ = ["LORA_TARGET_MODULES", "AlgorithmArgs", "CheckpointArgs", "FsdpArgs", "LoraArgs", "OptimizerArgs"]

#: The linear layers an adapter may target: the HF names of the attention and MLP projections, which SGLang
#: adapts (stacking q/k/v and gate/up) and the trainer's peft wraps. `all-linear` (the original's `--target-modules`
#: default, peft's shorthand) and SGLang's `all` stand for all of them.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

KlType = Literal["k1", "k2", "k3", "low_var_kl"]


class AlgorithmArgs(ArgsGroup):
    """Advantages, policy loss, KL, importance sampling."""

    advantage_estimator: str = arg(
        "grpo",
        "Advantage estimator (its needs and default policy loss: slime_core.estimators).",
        registry="slime.advantage_estimators",
    )

    @field_validator("advantage_estimator")
    @classmethod
    def _registered_estimator(cls, value: str) -> str:
        # Checked against the registry when the config is built: one registered later (a test, a notebook)
        # is accepted from then on.
        return check_registered(value, group="slime.advantage_estimators", flag="--advantage-estimator")

    loss_type: Literal["policy_loss", "sft_loss", "custom_loss"] = arg(
        "policy_loss",
        "Training loss: policy_loss (per --advantage-estimator), sft_loss (masked NLL of the response tokens) or "
        "custom_loss (--custom-loss-function-path).",
    )
    custom_loss_function_path: str | None = arg(
        None,
        "Import path of fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics) for custom_loss; `logits` is "
        "{'log_probs', 'entropy'} of the current policy at the response tokens (N x [L_i], with grad).",
    )
    disable_compute_advantages_and_returns: bool = arg(
        False, "Skip advantage computation (with --loss-type sft_loss / custom_loss: advantages are None)."
    )
    custom_advantage_function_path: str | None = arg(
        None, "Import path of fn(args, rollout_data) setting advantages and returns."
    )
    eps_clip: float = arg(0.2, "PPO clip range epsilon (lower).", ge=0)
    eps_clip_high: float | None = arg(None, "PPO clip range upper epsilon (default: --eps-clip).", ge=0)
    eps_clip_c: float | None = arg(None, "Dual-clip constant c (> 1) bounding the loss for negative advantages.")
    value_clip: float = arg(0.2, "Value-function clip range for the critic.", ge=0)
    kl_coef: float = arg(
        0.0,
        "KL penalty coefficient in the reward (reward shaping) of rloo, REINFORCE++ and PPO; non-zero with another "
        "estimator: a one-line warning (it has no effect there, as in the original).",
        ge=0,
    )
    use_kl_loss: bool = arg(False, "Add a KL(actor || ref) loss term.")
    kl_loss_coef: float = arg(0.0, "Coefficient of the KL loss term.", ge=0)
    kl_loss_type: KlType = arg("k1", "KL estimator: k1, k2, k3 or low_var_kl (clamped k3).")
    use_unbiased_kl: bool = arg(False, "Importance-weight the KL estimate by exp(logp - logp_old) (DeepSeek-V3.2).")
    ref_update_interval: int | None = arg(
        None, "Copy actor weights into the ref model every this many rollouts (>= 1).", ge=1
    )
    # Any sign, as the original: a negative coefficient penalizes entropy (entropy minimization).
    entropy_coef: float = arg(0.0, "Entropy bonus coefficient (negative: an entropy penalty).")
    gamma: float = arg(
        1.0,
        "Discount factor for PPO / REINFORCE++ returns; set away from 1.0 with another estimator: a one-line warning "
        "(it has no effect there).",
        ge=0,
        le=1,
    )
    lambd: float = arg(
        1.0,
        "GAE lambda (PPO); set away from 1.0 with another estimator: a one-line warning (it has no effect there).",
        ge=0,
        le=1,
    )
    normalize_advantages: bool = arg(False, "Whiten advantages over the batch (masked mean/std).")
    disable_grpo_std_normalization: bool = arg(False, "GRPO: only subtract the group mean (Dr.GRPO).")
    disable_rewards_normalization: bool = arg(False, "Do not group-normalize rewards.")
    use_rollout_entropy: bool = arg(False, "Report the entropy of the rollout engine distribution.")
    get_mismatch_metrics: bool = arg(
        False,
        "Log the train/inference mismatch metrics (train/mis_kl, mis_k3_kl, mis_*_ppl, mis_chi2_*, ois) without "
        "changing the loss; with --custom-tis-function-path that function is called for them, as in the original.",
    )
    use_rollout_logprobs: bool = arg(False, "Use engine log-probs as the old policy instead of recomputing.")
    use_tis: bool = arg(False, "Truncated importance sampling for the train/inference mismatch.")
    tis_clip: float = arg(2.0, "Upper clip of the TIS weight.", gt=0)
    tis_clip_low: float = arg(0.0, "Lower clip of the TIS weight.", ge=0)
    tis_mode: Literal["truncate", "icepop", "clip", "mask"] = arg(
        "truncate",
        "TIS weighting: truncate (clamp to [low, high]), icepop (zero outside the range; token level only), clip "
        "or mask (the MIS helper's: clamp to, or reject tokens outside, [--tis-lower-bound, --tis-upper-bound]).",
    )
    custom_tis_function_path: str | None = arg(
        None, "Import path of a custom TIS/MIS weighting function, called with --use-tis or --get-mismatch-metrics."
    )
    custom_pg_loss_reducer_function_path: str | None = arg(
        None, "Import path of get_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)."
    )
    calculate_per_token_loss: bool = arg(False, "Average the loss over all tokens instead of per sample.")
    use_opsm: bool = arg(False, "Off-policy sequence masking of negative-advantage tokens.")
    opsm_delta: float = arg(1e-4, "OPSM sequence-KL threshold.", ge=0)
    use_routing_replay: bool = arg(
        False,
        "MoE: the old-log-prob forward records each MoE layer's top-k experts and the training forwards replay them "
        "(combine weights from the current router logits); FSDP backend, train/routing_replay_mismatch.",
    )
    use_rollout_routing_replay: bool = arg(
        False,
        "MoE (R3): every actor forward, old log-probs included, replays the experts the engine routed to "
        "(SGLang --enable-return-routed-experts, meta_info.routed_experts); implies --use-routing-replay.",
    )
    num_critic_only_steps: int = arg(
        0, "Rollouts that train only the critic at the start (PPO); >= --num-rollout trains the critic only.", ge=0
    )
    use_opd: bool = arg(
        False, "On-policy distillation: subtract --opd-kl-coef x (student - teacher log-prob) from the advantages."
    )
    opd_type: str | None = arg(
        None,
        "Where the OPD teacher runs: sglang (an engine at --rm-url scores prompt+response during the rollout), "
        "or the trainer, which holds the teacher weights of --opd-teacher-load: the --train-backend's name (fsdp, "
        "megatron, or a package's backend whose record sets supports_opd_teacher) or megatron with any such "
        "backend, as in original launch scripts.",
    )
    opd_kl_coef: float = arg(1.0, "Weight of the OPD reverse-KL term in the advantages.", ge=0)
    opd_teacher_load: str | None = arg(
        None,
        "Teacher checkpoint for a trainer-side teacher: an HF directory, or the backend's own checkpoint (a torch_dist "
        "one with megatron, an FSDP one with fsdp).",
    )
    opd_teacher_ckpt_step: int | None = arg(
        None, "Iteration of a checkpoint --opd-teacher-load (torch_dist or FSDP) to load (default: latest)."
    )
    true_on_policy_mode: bool = arg(
        False,
        "Trainer log-probs bit-identical to SGLang's (FSDP, dense Qwen3, 1-GPU engines; exact on CUDA): engines get "
        "--rl-on-policy-target fsdp --enable-deterministic-inference --attention-backend triton, the trainer "
        "replays their op order and kernels (slime_train_fsdp.true_on_policy)",
    )


class OptimizerArgs(ArgsGroup):
    """Optimizer and LR schedule (both backends read these; Megatron gets them mapped)."""

    lr: float = arg(1e-6, "Learning rate.", gt=0)
    min_lr: float = arg(0.0, "Minimum learning rate of the decay schedule.", ge=0)
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = arg(
        "constant", "Learning-rate decay style."
    )
    lr_decay_iters: int | None = arg(None, "Decay iterations (default: all training steps).", ge=1)
    lr_wsd_decay_iters: int | None = arg(
        None,
        "--lr-decay-style WSD: optimizer steps of the anneal, the last ones before --lr-decay-iters (or the run's "
        "end); the rate holds --lr until then (megatron-core's OptimizerParamScheduler).",
        ge=1,
    )
    lr_wsd_decay_style: Literal["exponential", "linear", "cosine", "minus_sqrt"] = arg(
        "exponential", "--lr-decay-style WSD: the anneal's shape from --lr down to --min-lr (Megatron-LM's choices)."
    )
    lr_warmup_iters: int = arg(0, "Warmup steps.", ge=0)
    lr_warmup_fraction: float | None = arg(
        None, "Warmup as a fraction of the decay steps (not rounded; exclusive with --lr-warmup-iters).", ge=0, le=1
    )
    lr_warmup_init: float = arg(0.0, "Learning rate the warmup starts from.", ge=0)
    optimizer: Literal["adam", "sgd"] = arg(
        "adam", "Optimizer: adam (AdamW with --adam-*, --weight-decay); sgd is parsed and refused (no backend has it)."
    )
    weight_decay: float = arg(0.0, "Weight decay.", ge=0)
    adam_beta1: float = arg(0.9, "Adam beta1.", ge=0, lt=1)
    adam_beta2: float = arg(0.95, "Adam beta2.", ge=0, lt=1)
    adam_eps: float = arg(1e-8, "Adam epsilon.", gt=0)
    clip_grad: float = arg(1.0, "Gradient-norm clip (0: off).", ge=0)
    seed: int = arg(1234, "Random seed of the trainer.")
    critic_lr: float | None = arg(None, "Learning rate of the PPO critic (default: --lr).", gt=0)
    critic_lr_warmup_iters: int | None = arg(
        None,
        "Warmup steps of the critic's learning rate; given, it replaces the actor's --lr-warmup-fraction too "
        "(default: the actor's --lr-warmup-iters or --lr-warmup-fraction).",
        ge=0,
    )
    reset_optimizer_states: bool = arg(False, "Zero the optimizer moments at every rollout.")
    use_stateless_adam: bool = arg(False, "Adam without persisted moments.")
    bf16: bool = arg(False, "Train in bfloat16 (mixed precision).")
    fp16: bool = arg(
        False, "Train in float16 (mixed precision, loss scaling; --train-backend megatron only, FSDP refuses it)."
    )
    # nargs "*" as in the original: a script's empty pattern variable gives the flag no value (nothing frozen).
    only_train_params_name_list: list[str] | None = arg(
        None, "Regexes (re.search on the backend's parameter names) of the only parameters to train.", nargs="*"
    )
    freeze_params_name_list: list[str] | None = arg(
        None, "Regexes (re.search on the backend's parameter names) of parameters to freeze.", nargs="*"
    )
    log_probs_chunk_size: int = arg(
        -1,
        "Response tokens per chunk of the log-prob/entropy computation (the FSDP heads and Megatron's --log-probs-head "
        "fused chunk the lm_head, -1: 1024, slime_core.algorithms.fused_head.DEFAULT_CHUNK; Megatron's default head "
        "chunks the log-softmax over its logits, -1: all rows at once, as the original).",
    )
    recompute_loss_function: bool = arg(False, "Activation-checkpoint the loss function.")


class FsdpArgs(ArgsGroup):
    """FSDP2 backend specifics."""

    attn_implementation: (
        Literal["auto", "slime_varlen", "slime_flex", "sdpa", "eager", "flash_attention_2", "flash_attention_3"] | None
    ) = arg(
        None,
        "Attention for packed micro-batches: slime_varlen (flash varlen, no mask; the GPU default), slime_flex "
        "(compiled flex_attention), sdpa (dense block mask; the CPU default), eager, flash_attention_2, "
        "flash_attention_3 (each needs its package); auto: default. FSDP only.",
    )
    log_probs_head: Literal["fp32", "tf32", "fp32out", "fused", "bf16", "liger"] | None = arg(
        None,
        "lm_head + log-softmax of the log-probs/entropy: fused (GPU default: fp32out's numbers with a compiled stats "
        "function and a hand-written backward; qwen3-0.6b on one H200: 1.14 s per train() against fp32out's 1.55 s, "
        "30.5 against 50.6 GiB peak; with --rollout-top-p < 1 it runs fp32out, logged), fp32 (exact; CPU default), "
        "fp32out (bf16 tensor cores, fp32 accumulation and logits, autograd backward), tf32, bf16 (bf16 matmul and "
        "logits, fp32 softmax), liger (liger-kernel fused linear cross-entropy, optional dependency; not with "
        "--rollout-top-p < 1). "
        "--train-backend megatron: fused = the same fused head on the response rows' final hidden states (needs "
        "--tensor-model-parallel-size 1; the default on GPUs at TP 1), else megatron-core's bf16 logits on every "
        "position (unset on CPU or at TP > 1); the others are refused.",
    )
    fsdp_compile_layers: bool | None = arg(
        None,
        "torch.compile every decoder layer (regional compilation, dynamic shapes; compiled once per run). "
        "Default: on with CUDA, off on CPU and with --lora-rank (the qwen3-0.6b LoRA acceptance run spent 83 s "
        "compiling the peft-wrapped layers in its first compiled step, against 3.7 s eager steps; no warm-up then "
        "starts); an explicit value wins.",
    )
    fsdp_compile_warmup: bool = arg(
        True,
        "With compiled decoder layers: a side process compiles a one-layer stand-in of the model while the engines "
        "start (colocated: after they release their memory), so the first step loads the graphs from inductor's "
        "cache instead of compiling them; steps run the layers eagerly while it still compiles, never wait for it "
        "(slime_train_fsdp.compile_warmup; --no-fsdp-compile-warmup turns it off).",
    )
    gradient_checkpointing: bool = arg(
        False, "HF gradient checkpointing (FSDP; with Megatron use --recompute-granularity full, this is refused)."
    )
    freeze_vision_tower: bool = arg(
        False, "Vision-language models: keep the vision tower (and its merger) frozen; only the language model trains."
    )
    fsdp_cpu_offload: bool = arg(
        False,
        "Keep parameters, gradients and optimizer states on CPU (FSDP2 offload; with Megatron use "
        "--optimizer-cpu-offload, this is refused).",
    )
    fsdp_state_dict_cpu_offload: bool = arg(False, "Gather full state dicts to CPU.")
    fsdp_cpu_backend: str = arg("gloo", "Process-group backend for CPU tensors.")
    deterministic_mode: bool = arg(
        False,
        "Deterministic trainer kernels: torch deterministic algorithms, cuBLAS workspace config, NCCL ring, Megatron's "
        "deterministic mode (with --sglang-enable-deterministic-inference for reproducible runs).",
    )


class CheckpointArgs(ArgsGroup):
    """Loading and saving."""

    load: str | None = arg(None, "Checkpoint directory to resume the actor from.")
    ref_load: str | None = arg(None, "Reference model checkpoint (default: --hf-checkpoint).")
    ref_ckpt_step: int | None = arg(None, "Step of the reference checkpoint to load.")
    ckpt_step: int | None = arg(None, "Step of the --load checkpoint to load (default: latest).")
    save: str | None = arg(None, "Directory for checkpoints.")
    save_interval: int | None = arg(None, "Save every this many rollouts (needs --save).", ge=1)
    async_save: bool = arg(False, "Save checkpoints asynchronously.")
    no_save_optim: bool = arg(False, "Do not save optimizer state.")
    no_load_optim: bool = arg(False, "Do not load optimizer state.")
    no_load_rng: bool = arg(False, "Do not load RNG state.")
    critic_load: str | None = arg(
        None,
        "PPO critic to start from: a critic checkpoint directory (resumed), or an HF directory whose backbone "
        "initializes the value model (default: <--load>/critic if present, else --hf-checkpoint).",
    )
    critic_save: str | None = arg(None, "Directory for critic checkpoints (default: <--save>/critic).")
    save_hf: str | None = arg(
        None,
        "Export an HF checkpoint to this path at every save (each --save-interval, each epoch's end, the last "
        "rollout; without --save only the last), {rollout_id} filled in (the only field). Written to <path>.tmp, then "
        "swapped in by renames (the old export goes to <path>.old until the new one is in place); only a folder "
        "slime wrote (a .slime_export file in it) or an empty one is replaced. Refused: a path that is empty or "
        "holds a control character; an existing file, link or non-empty folder slime did not write; one that is, "
        "contains or lies inside a checkpoint or model directory (--save, --load, --hf-checkpoint, --ref-load, "
        "...); one that is or contains the data, output or config paths, the working or the home directory "
        "(slime_core.config.save_hf).",
    )
    release_train: bool = arg(False, "Kill and recreate trainer processes from the saved checkpoint every step.")
    megatron_config_path: str | None = arg(None, "YAML with Megatron settings for multi-model setups.")
    custom_model_provider_path: str | None = arg(None, "Import path of a custom Megatron model provider.")
    custom_megatron_init_path: str | None = arg(None, "Import path of a hook run after Megatron initialization.")
    custom_megatron_before_log_prob_hook_path: str | None = arg(None, "Import path of a hook before log-probs.")
    custom_megatron_before_train_step_hook_path: str | None = arg(None, "Import path of a hook before train steps.")


class LoraArgs(ArgsGroup):
    """LoRA RL (FSDP backend, peft): train a low-rank adapter; the engines serve the base model plus the adapter."""

    lora_rank: int = arg(0, "LoRA rank r (0: full fine-tuning).", ge=0)
    lora_alpha: float = arg(16.0, "LoRA alpha: the adapter's update is scaled by alpha / r.", gt=0)
    lora_target_modules: list[str] = arg(
        list(LORA_TARGET_MODULES),
        "Names of the linear modules that get an adapter (peft target_modules; SGLang --lora-target-modules), "
        f"of {', '.join(LORA_TARGET_MODULES)}; space- or comma-separated, all-linear (or all) for every one. "
        "--target-modules is the original's name of this flag.",
        aliases=("--target-modules",),
    )
    lora_exclude_modules: list[str] = arg(
        [],
        "Module names taken out of --lora-target-modules (the original's --exclude-modules: --target-modules "
        "all-linear --exclude-modules o_proj); space- or comma-separated.",
        aliases=("--exclude-modules",),
    )
    lora_dropout: float = arg(
        0.0, "Dropout on the adapter's input (the original's Megatron-Bridge flag); only 0 is implemented.", ge=0, lt=1
    )
    lora_save_merged: bool = arg(
        False, "With --save-hf: also write the merged model (base + adapter) to <save-hf>/merged."
    )
