"""Trainer flags the backend must honour or refuse, part of `derive_and_validate` (issue 27).

No flag that changes the math, memory or parallelism of training is accepted and ignored: a value the
`--train-backend` does not implement (its capability record, `slime_core.extensions.TrainBackendSpec`) is one
`ConfigError` naming the flag and the backend; a flag another flag overrides, as in the original, says so once.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, field_to_flag, non_default, warn_once
from slime_core.extensions import train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["check_trainer_flags"]


def check_trainer_flags(args: SlimeArgs) -> None:
    """Checks the optimizer, precision and micro-batching flags against the backend.

    Args:
        args: the config under validation.

    Raises:
        ConfigError: `--lr-decay-style`, `--optimizer` or `--fp16` the backend does not implement; WSD without
            `--lr-wsd-decay-iters`; `--use-dynamic-batch-size` without `--max-tokens-per-gpu`; `--balance-by-flops`
            without it (with it, `--balance-data` is turned on, as in the original);
            `--attn-implementation` with Megatron, unknown, or needing a package that is not installed;
            FSDP's memory flags (`--gradient-checkpointing`, `--fsdp-cpu-offload`) with a megatron-core backend;
            `--log-probs-head liger` without liger-kernel or with `--rollout-top-p` < 1; `--min-lr` (or a Megatron
            warmup's `--lr-warmup-init`) above `--lr` / `--critic-lr`.
    """
    spec = train_backend_spec(args)
    styles = spec.lr_decay_styles
    if args.lr_decay_style not in styles:
        raise ConfigError(
            f"--lr-decay-style {args.lr_decay_style} is not implemented with --train-backend {args.train_backend}; use "
            f"{', '.join(styles[:-1])} or {styles[-1]}"
        )
    _wsd(args)
    if args.optimizer not in spec.optimizers:  # both backends build AdamW: sgd would train with Adam, unannounced
        raise ConfigError(
            f"--optimizer {args.optimizer} is not implemented with --train-backend {args.train_backend}; use "
            f"--optimizer {' or '.join(spec.optimizers)}"
        )
    if args.fp16 and not spec.supports_fp16:  # FSDP computes in bf16 on GPU, fp32 on CPU: fp16 was never used
        raise ConfigError(
            f"--fp16 is not implemented with --train-backend {args.train_backend} (no float16 training with loss "
            "scaling); use --bf16, or --train-backend megatron"
        )
    _micro_batching(args)
    _lr_bounds(args)
    _schedule_flags_without_effect(args)
    _attention(args)
    _log_probs_head(args)
    _fsdp_flags(args)


def _wsd(args: SlimeArgs) -> None:
    """`--lr-decay-style WSD` needs its anneal length; the anneal flags do nothing under another style.

    megatron-core's `OptimizerParamScheduler` asserts a WSD anneal length when the trainer builds it, after Ray and the
    engines started (a bare AssertionError); Megatron-LM reads `--lr-wsd-*` only under WSD, with no word otherwise.
    """
    if args.lr_decay_style == "WSD":
        if args.lr_wsd_decay_iters is None:
            raise ConfigError(
                "--lr-decay-style WSD needs --lr-wsd-decay-iters N: the optimizer steps of the anneal from --lr to "
                "--min-lr, which ends at --lr-decay-iters (or the run's last step)"
            )
        return
    given = non_default(args, ("lr_wsd_decay_iters", "lr_wsd_decay_style"))
    if given:
        warn_once(
            "lr_wsd_without_wsd",
            f"{' and '.join(map(field_to_flag, given))} have no effect with --lr-decay-style {args.lr_decay_style} "
            "(they shape the anneal of --lr-decay-style WSD)",
        )


# FSDP's memory flags -> what a megatron-core backend (`TrainBackendSpec.megatron_native`) uses instead: it builds no HF
# model and no FSDP2 wrapper, so it never reads them (the run kept every activation / every state on the GPU).
_FSDP_MEMORY_FLAGS = {
    "gradient_checkpointing": "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    "fsdp_cpu_offload": "--optimizer-cpu-offload (optimizer states on CPU)",
}


def _fsdp_flags(args: SlimeArgs) -> None:
    if not train_backend_spec(args).megatron_native:
        return
    for name, instead in _FSDP_MEMORY_FLAGS.items():
        if getattr(args, name):
            raise ConfigError(
                f"{field_to_flag(name)} is an FSDP flag, not read by --train-backend {args.train_backend}; use "
                f"{instead}"
            )
    if args.fsdp_compile_layers is not None:  # a kernel choice, as --megatron-compile-layers is under FSDP
        warn_once(
            "fsdp_compile_layers",
            f"--fsdp-compile-layers has no effect with --train-backend {args.train_backend} (use "
            "--megatron-compile-layers)",
        )


# The package each --attn-implementation value (the config's Literal) needs beyond torch and transformers; checked
# here, so a value the GPU node cannot build fails at --dry-run, not after the engines started.
_ATTN_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _attention(args: SlimeArgs) -> None:
    attn = args.attn_implementation
    if attn in (None, "auto"):
        return
    if args.train_backend == "megatron":
        raise ConfigError(
            f"--attn-implementation {attn} is an FSDP flag, not read by --train-backend megatron (its attention is "
            "Megatron's --attention-backend)"
        )
    module = _ATTN_PACKAGES.get(attn)
    if module is not None and importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"--attn-implementation {attn} needs the {module} package, which is not installed here; slime_varlen "
            "(the GPU default) runs torch's own varlen flash attention"
        )


def _lr_bounds(args: SlimeArgs) -> None:
    """`--min-lr` / `--lr-warmup-init` above a learning rate the schedule decays from or warms up to.

    megatron-core's `OptimizerParamScheduler` asserts `min_lr <= max_lr` and `init_lr <= max_lr` when the trainer
    starts (after the engines; a bare AssertionError); FSDP's decay raised the rate towards `--min-lr` instead. With
    `--lr-decay-style constant` FSDP reads neither bound, so that stays accepted there.
    """
    megatron = train_backend_spec(args).megatron_native
    rates = [("--lr", args.lr)]
    if args.use_critic and args.critic_lr is not None:  # the critic's schedule has the same bounds
        rates.append(("--critic-lr", args.critic_lr))
    for flag, rate in rates:
        if args.min_lr > rate and (megatron or args.lr_decay_style != "constant"):
            raise ConfigError(
                f"--min-lr {args.min_lr:g} is above {flag} {rate:g}: the {args.lr_decay_style} schedule decays from "
                f"{flag} down to --min-lr; lower --min-lr"
            )
        warmup = args.lr_warmup_iters or args.lr_warmup_fraction
        if megatron and warmup and args.lr_warmup_init > rate:
            raise ConfigError(
                f"--lr-warmup-init {args.lr_warmup_init:g} is above {flag} {rate:g}: the warmup rises from it to "
                f"{flag} (megatron-core refuses the schedule); lower --lr-warmup-init"
            )


def _schedule_flags_without_effect(args: SlimeArgs) -> None:
    """Warns once about LR-schedule flags the schedule never reads (both backends; the original is as silent).

    megatron-core's `OptimizerParamScheduler.get_lr` (and FSDP's `lr_at_step`, its copy) returns `--lr` after the
    warmup under `--lr-decay-style constant`, so `--min-lr` and `--lr-decay-iters` change no rate there; and
    `--lr-warmup-init` is the first rate of a warmup: with none configured it is never used.
    """
    if args.lr_decay_style == "constant":
        unread = [f"--min-lr {args.min_lr:g}"] if args.min_lr else []
        unread += [f"--lr-decay-iters {args.lr_decay_iters}"] if args.lr_decay_iters is not None else []
        if unread:
            warn_once(
                "constant_schedule",
                f"{' and '.join(unread)} {'has' if len(unread) == 1 else 'have'} no effect with --lr-decay-style "
                "constant: the learning rate stays --lr after the warmup",
            )
    critic_warmup = args.use_critic and bool(args.critic_lr_warmup_iters)
    if args.lr_warmup_init and not (args.lr_warmup_iters or args.lr_warmup_fraction or critic_warmup):
        warn_once(
            "lr_warmup_init",
            f"--lr-warmup-init {args.lr_warmup_init:g} has no effect without a warmup (--lr-warmup-iters or "
            "--lr-warmup-fraction): the first step runs at --lr",
        )


def _log_probs_head(args: SlimeArgs) -> None:
    """`--log-probs-head liger` (FSDP; a megatron-core backend's preflight refuses it): its package and top-p replay.

    Both failed at the first log-prob forward, after the engines and the first rollout: liger-kernel's fused loss is
    an optional dependency, and it computes the full softmax, so it cannot replay the engine's nucleus, which the
    default generate function asks for with `--rollout-top-p` < 1.
    """
    if args.log_probs_head != "liger" or train_backend_spec(args).megatron_native:
        return
    if importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError(
            "--log-probs-head liger needs the liger-kernel package, which is not installed here; fused (the GPU "
            "default) or fp32out need nothing more"
        )
    if args.rollout_top_p < 1:
        raise ConfigError(
            f"--log-probs-head liger with --rollout-top-p {args.rollout_top_p}: liger computes the full softmax and "
            "cannot replay the engine's top-p sets; use --log-probs-head fused (or fp32out, fp32, tf32, bf16)"
        )


def _micro_batching(args: SlimeArgs) -> None:
    if args.use_dynamic_batch_size and args.max_tokens_per_gpu is None:
        raise ConfigError("--use-dynamic-batch-size requires --max-tokens-per-gpu")
    if args.max_tokens_per_gpu is not None and not args.use_dynamic_batch_size:  # as in the original: unused
        warn_once(
            "max_tokens_static",
            "--max-tokens-per-gpu has no effect without --use-dynamic-batch-size: micro-batches hold "
            f"--micro-batch-size {args.micro_batch_size} samples",
        )
    if args.use_dynamic_batch_size and args.micro_batch_size != 1:  # the original's precedence: token budget wins
        warn_once(
            "micro_batch_dynamic",
            f"--micro-batch-size {args.micro_batch_size} has no effect with --use-dynamic-batch-size: micro-batches "
            "are packed up to --max-tokens-per-gpu",
        )
    if args.balance_by_flops and not args.use_dynamic_batch_size:
        raise ConfigError("--balance-by-flops requires --use-dynamic-batch-size")
    if args.balance_by_flops:
        # The original's validation turns --balance-data on with it: the FLOPs-balanced micro-batches are then
        # spread over the data-parallel ranks by cost too (Karmarkar-Karp), not round-robin.
        args.balance_data = True
