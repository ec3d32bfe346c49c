"""The pieces a megatron-core trainer is built from, shared by the actor (`backend.py`) and the critic.

Each backend owns its model and calls these: the parallel groups and the DDP-wrapped `GPTModel` stage
(`build_parallel_model`, with a value head for the critic), the distributed optimizer with the LR schedule and the
model-config hooks megatron-core's schedule calls, the resume from a torch_dist `--load`, the optimizer step, the
data-parallel reductions of the shared steps, and `Residency` (sleep/wake through host memory).

Loss scaling (both backends): megatron-core divides every micro-batch loss by the micro-batch count and DDP averages
gradients over DP×CP ranks (`calculate_per_token_loss=False`, the original's default, which also scales the MoE
router's aux and z losses as the original's); `pipeline.PipelineRunner.run` multiplies the main loss back, so a
micro-batch loss divided by the step's global denominator sums to the global-batch mean.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

from slime_convert import ModelArgs
from slime_core.config import SlimeArgs
from slime_core.host_to_device import to_device
from slime_core.param_filter import frozen_parameter_names
from slime_core.step_metrics import sum_over_ranks
from slime_train_megatron.attention import AttentionKind, attention_kind
from slime_train_megatron.checkpoint import is_megatron_checkpoint, load_checkpoint
from slime_train_megatron.lr_schedule import build_lr_scheduler
from slime_train_megatron.model import (
    build_gpt_model,
    build_transformer_config,
    compile_decoder_layers,
    use_transformer_engine,
)
from slime_train_megatron.settings import MegatronSettings, compiles_layers
from slime_train_megatron.sleep import host_buffers, offload_to_cpu, reload_from_cpu
from slime_train_megatron.torch_optimizer import use_foreach_grad_norm, use_foreach_param_copy, use_torch_fused_adam

__all__ = [
    "ParallelModel",
    "Residency",
    "all_reduce_sum",
    "build_optimizer",
    "build_parallel_model",
    "optimizer_step",
    "reduce_metric_sums",
    "resume",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class ParallelModel:
    """This rank's model stage: the transformer config, how attention runs, the `GPTModel` and its DDP wrapper."""

    config: Any
    attention: AttentionKind
    module: Any
    model: Any


def build_parallel_model(
    cfg: SlimeArgs, settings: MegatronSettings, model_args: ModelArgs, *, value_head: bool = False
) -> ParallelModel:
    """Initializes the parallel groups (once per process) and builds this rank's DDP-wrapped `GPTModel` stage.

    The `--*-params-name-list` parameters are frozen before DDP (no grad buffer; the optimizer skips them);
    `--megatron-compile-layers` compiles the decoder layers (`model.compile_decoder_layers`).

    Args:
        cfg: the run (or critic) config.
        settings: the Megatron settings of `cfg` (`MegatronSettings.from_config`).
        model_args: the architecture (`ModelArgs.from_hf_dir(--hf-checkpoint)`).
        value_head: the critic's `ValueHead` as output layer (untied embeddings) instead of the LM head.

    Raises:
        ValueError: a parallel layout that does not divide the world size, or the model's layers or experts.
    """
    s = settings
    s.check_model_split(model_args.num_layers, model_args.num_experts)
    s.world_layout(dist.get_world_size())
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(**s.parallel_state_kwargs())
    cuda = torch.cuda.is_available()
    if cuda:
        tensor_parallel.model_parallel_cuda_manual_seed(s.seed)
    torch.manual_seed(s.seed)
    config = build_transformer_config(model_args, s, cpu=not cuda)
    # "packed"/"transformer_engine" take THD rows; "dense" (megatron-core's DotProductAttention) a [T, T] mask.
    attention = attention_kind(s, use_transformer_engine(s))
    module = build_gpt_model(model_args, s, config, value_head=value_head)
    if cuda:
        module.cuda(torch.cuda.current_device())
    explicit = s.megatron_compile_layers is not None
    # Resolved once here; the pipeline reads it (RoPE's boundaries as the compiled layers want them).
    s.megatron_compile_layers = compiles_layers(
        s,
        cuda=cuda,
        transformer_engine=use_transformer_engine(s),
        moe=bool(model_args.num_experts),
        dense_attention=attention == "dense",
    )
    if s.megatron_compile_layers:
        compile_decoder_layers(module)
        if not explicit:
            logger.info("decoder layers compiled (the default on CUDA; --no-megatron-compile-layers keeps them eager)")
    frozen = frozen_parameter_names([n for n, _ in module.named_parameters()], cfg)
    for name, param in module.named_parameters():
        if name in frozen:
            param.requires_grad_(False)  # before DDP: no grad buffer, and the optimizer skips it
    # No `check_for_nan_in_grad` (Megatron-LM passes its --check-for-nan-in-loss-and-grad there): it reads every
    # bucket's norm per step; the shared step stops the run on a non-finite norm after the last step instead
    # (`slime_core.step_metrics.check_grad_norms`), before the weights are saved or sent.
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=s.use_distributed_optimizer
    )
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=module)
    return ParallelModel(config=config, attention=attention, module=module, model=model)


def build_optimizer(parts: ParallelModel, settings: MegatronSettings, cfg: SlimeArgs) -> tuple[Any, Any]:
    """The distributed Adam and the LR schedule; installs the model-config hooks megatron-core's schedule calls.

    `--use-torch-fused-adam` / `--use-foreach-grad-norm` (on by default) and the foreach parameter copy (always)
    speed up megatron-core's fallbacks without TE/Apex (`torch_optimizer.py`).

    Returns:
        `(optimizer, scheduler)`.

    Raises:
        ValueError: `--use-precision-aware-optimizer` without Transformer Engine.
    """
    s = settings
    if s.use_precision_aware_optimizer and not s.optimizer_cpu_offload and not use_transformer_engine(s):
        # megatron-core's OptimizerConfig fails in its TE version check (TypeError about NoneType); its CPU offload
        # (HybridDeviceOptimizer) skips that check.
        raise ValueError(
            "--use-precision-aware-optimizer needs Transformer Engine's FusedAdam (not installed, or "
            "--transformer-impl local): drop it (without TE, --use-torch-fused-adam speeds up torch's AdamW)"
        )
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=s.lr,
        min_lr=s.min_lr,
        weight_decay=s.weight_decay,
        adam_beta1=s.adam_beta1,
        adam_beta2=s.adam_beta2,
        adam_eps=s.adam_eps,
        clip_grad=s.clip_grad,
        bf16=s.bf16,
        fp16=s.fp16,
        params_dtype=parts.config.params_dtype,
        use_distributed_optimizer=s.use_distributed_optimizer,
        optimizer_cpu_offload=s.optimizer_cpu_offload,
        overlap_cpu_optimizer_d2h_h2d=s.overlap_cpu_optimizer_d2h_h2d,
        optimizer_offload_fraction=s.optimizer_offload_fraction,
        use_precision_aware_optimizer=s.use_precision_aware_optimizer,
    )
    optimizer = get_megatron_optimizer(opt_config, [parts.model])
    use_foreach_param_copy(True)  # the same copies as megatron-core's, one launch instead of one per parameter
    if s.use_torch_fused_adam:
        use_torch_fused_adam(optimizer, True)
    if s.use_foreach_grad_norm:
        use_foreach_grad_norm(True)
    scheduler = build_lr_scheduler(optimizer, s, cfg)
    config = parts.config
    config.finalize_model_grads_func = finalize_model_grads  # DP×CP averaging (see the module docstring)
    config.grad_scale_func = optimizer.scale_loss
    config.no_sync_func = parts.model.no_sync
    return optimizer, scheduler


def resume(settings: MegatronSettings, module: Any, optimizer: Any, scheduler: Any) -> int:
    """Loads `--load` when it is a torch_dist checkpoint (`--ckpt-step`, `--no-load-optim`, `--finetune`, ...).

    Returns:
        The rollout id to start from: the checkpoint's + 1, or 0 (no checkpoint, or `--finetune`).
    """
    s = settings
    if not (s.load and is_megatron_checkpoint(s.load)):
        return 0
    rollout_id = load_checkpoint(
        s.load,
        module,
        None if (s.no_load_optim or s.finetune) else optimizer,
        scheduler,
        load_rng=not (s.no_load_rng or s.finetune),
        ckpt_step=s.ckpt_step,
    )
    if s.no_load_optim or s.finetune or rollout_id is None:
        optimizer.reload_model_params()
    if s.use_torch_fused_adam:  # loading restored the saved parameter-group options (fused off)
        use_torch_fused_adam(optimizer, True)
    return 0 if (rollout_id is None or s.finetune) else rollout_id + 1


def optimizer_step(
    optimizer: Any, scheduler: Any, *, skip_non_finite: bool = False
) -> tuple[float | torch.Tensor, float]:
    """Steps the megatron optimizer (it clips to `--clip-grad`) and the LR schedule.

    With `skip_non_finite` (`--no-check-for-nan-in-loss-and-grad`) a step whose gradients hold an inf, or whose
    norm is not finite, steps neither the optimizer nor the schedule (logged), as the original's `train_step` (a
    host read of the norm per step, as there): megatron-core's own `step()` would write NaN into every weight.
    Without it such a step is taken, and the shared step stops the run when it reads the norms after the last step
    (`slime_core.step_metrics.check_grad_norms`).

    Returns:
        `(grad norm, NaN when the optimizer reports none; rate of this step)`. The norm is a `[]` device tensor
        under `--use-foreach-grad-norm` (read with the step's other metrics after the last step), else a float.
    """
    lr = float(optimizer.param_groups[0]["lr"])
    if skip_non_finite:
        norm = float("inf") if optimizer.prepare_grads() else optimizer.get_grad_norm()
        if norm is not None and not math.isfinite(float(norm)):  # a host read, as the original's check
            logger.warning(
                "optimizer step skipped: the gradient norm is %s (--no-check-for-nan-in-loss-and-grad); the weights, "
                "the optimizer state and the LR schedule are unchanged",
                float(norm),
            )
            return float(norm), lr
    _, grad_norm, _ = optimizer.step()
    scheduler.step(increment=1)
    if grad_norm is None:
        return float("nan"), lr
    return (grad_norm.detach().reshape(()) if torch.is_tensor(grad_norm) else float(grad_norm)), lr


def all_reduce_sum(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum of `tensor` over the data-parallel group, returned on CPU."""
    reduced = to_device(tensor, device).clone()  # clone: on CPU `to_device` hands back the caller's tensor
    dist.all_reduce(reduced, group=parallel_state.get_data_parallel_group())
    return reduced.cpu()


def reduce_metric_sums(sums: dict[str, float], device: torch.device, broadcast) -> dict[str, float]:
    """Sums over DP on the last pipeline stage (the only one with losses), then `broadcast` to every stage.

    Args:
        sums: this rank's metric sums.
        device: this rank's device.
        broadcast: `PipelineRunner.broadcast_from_last_stage`.
    """
    if not parallel_state.is_pipeline_last_stage():
        return broadcast(dict(sums))  # the last stage's sums replace these
    # Names agreed over DP first (a rank without samples in a step has none of its names): `sum_over_ranks`.
    return broadcast(sum_over_ranks(sums, device, parallel_state.get_data_parallel_group()))


class Residency:
    """Where a trainer's state lives: on the GPU (awake) or in host memory (asleep, `--colocate` / a shared critic).

    Args:
        model: the DDP-wrapped model (parameters and its contiguous gradient buffers move).
        optimizer: the megatron optimizer (its states move).
        keep_host_buffers: `--offload-train-pin-memory`: the pinned host buffers stay allocated while awake and the
            next sleep reuses them (`sleep.py`); else each wake-up frees them.
    """

    def __init__(self, model: Any, optimizer: Any, keep_host_buffers: bool = False) -> None:
        """Starts awake."""
        self.model, self.optimizer = model, optimizer
        self.state: Any = None  # what `offload_to_cpu` moved, while asleep
        self.keep_host_buffers = keep_host_buffers
        self.kept: list[Any] | None = None  # the pinned buffers of the last sleep, while awake with the flag

    @property
    def asleep(self) -> bool:
        """Whether the state is in host memory."""
        return self.state is not None

    def require_awake(self, what: str) -> None:
        """Raises `RuntimeError` naming `what` while asleep."""
        if self.asleep:
            raise RuntimeError(f"{what}() called while asleep; call wake_up() first")

    def sleep(self) -> None:
        """Moves parameters, gradient buffers and optimizer state to CPU and frees accelerator memory."""
        if not self.asleep:
            self.state = offload_to_cpu(self.model, self.optimizer, self.kept)
            self.kept = None

    def wake_up(self) -> None:
        """Restores what `sleep` moved out."""
        if self.asleep:
            reload_from_cpu(self.state)
            self.kept = host_buffers(self.state) if self.keep_host_buffers else None
            self.state = None
