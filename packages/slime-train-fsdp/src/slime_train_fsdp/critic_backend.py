"""`FSDPCriticBackend`: the PPO critic on FSDP2 (implements `slime_core.protocols.CriticBackend`).

The value model (`value_model.py`: the policy's decoder with a scalar head) is built, sharded, optimized,
checkpointed and offloaded by the same pieces as the actor (`model_loading.build_fsdp_model`, `trainer_parts`,
`checkpoint`), composed here rather than inherited: the critic has only the critic's methods. `train_critic` is the
shared critic step (`slime_core.critic.train_critic_on_rollout`), for which this class supplies the value
forward/backward.

Where the critic starts (`cfg` is `slime_core.critic.critic_config(run config)`, so `cfg.load` is `--critic-load`
or `<--load>/critic`): a critic checkpoint there is resumed (model, optimizer, schedule, RNG); an HF directory
there initializes the backbone (and the head, if it has one); otherwise the backbone comes from
`--hf-checkpoint` and the head is drawn fresh.
"""

from __future__ import annotations

import logging
import pathlib

import torch
import torch.distributed as dist

from slime_core.batch import RolloutBatch
from slime_core.checkpoint_dirs import TRACKER_FILE, iteration_name
from slime_core.config import SlimeArgs
from slime_core.critic import ValueLoss, train_critic_on_rollout
from slime_core.host_to_device import per_sample_on_host
from slime_train_fsdp.checkpoint import check_critic_checkpoint, save_checkpoint
from slime_train_fsdp.model_loading import build_fsdp_model, compiles_layers, default_device
from slime_train_fsdp.packing import pack_micro_batch, split_by_lengths
from slime_train_fsdp.trainer_parts import (
    Residency,
    all_reduce_sum,
    build_optimizer,
    clip_and_step,
    cp_size,
    reduce_metric_sums,
    resume,
)
from slime_train_fsdp.value_model import (
    construct_value_model,
    fill_value_head,
    install_value_forward,
    response_values,
)
from slime_train_fsdp.vision import frozen_vision_tower

logger = logging.getLogger(__name__)

__all__ = ["FSDPCriticBackend"]


def _critic_source(cfg: SlimeArgs) -> tuple[str, bool]:
    """(HF directory the value model is built from, whether `cfg.load` holds a critic checkpoint to resume).

    Raises:
        ValueError: an explicit `--critic-load` that is neither a critic checkpoint nor an HF directory.
    """
    load = pathlib.Path(cfg.load) if cfg.load else None
    if load is not None:
        step_dir = load / iteration_name(cfg.ckpt_step) if cfg.ckpt_step is not None else None
        if (load / TRACKER_FILE).exists() or (step_dir is not None and step_dir.is_dir()):
            return str(cfg.hf_checkpoint), True
        if (load / "config.json").exists():
            return str(load), False
        if cfg.critic_load:
            raise ValueError(
                f"--critic-load {load}: neither a critic checkpoint ({TRACKER_FILE}) nor an HF directory (config.json)"
            )
        logger.info("no critic checkpoint in %s: the critic starts from %s", load, cfg.hf_checkpoint)
    return str(cfg.hf_checkpoint), False


class FSDPCriticBackend:
    """FSDP2 value model for PPO; one instance per rank, `torch.distributed` set up by the caller.

    Implements `slime_core.protocols.CriticBackend` and `slime_core.critic.CriticStepBackend` and nothing else: it
    owns its value model, optimizer, checkpoints and residency (built from `trainer_parts.py`, as the actor is)
    and has no log-probs, no RL `train`, no HF export and no weight push.

    Example:
        >>> critic = FSDPCriticBackend()
        >>> start = critic.init(critic_config(cfg))  # doctest: +SKIP
        >>> metrics, values = critic.train_critic(start, batch)  # doctest: +SKIP
    """

    def __init__(self) -> None:
        """Creates an uninitialized critic; call `init`."""
        self.cfg: SlimeArgs | None = None
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.device = torch.device("cpu")
        self.global_step = 0
        self.residency: Residency | None = None
        self.step_metrics: list[dict[str, float]] = []
        self.compile_layers_flag: str | None = None  # set by `init` (`CriticBackend.compile_layers_flag`)

    def init(self, cfg: SlimeArgs) -> int:
        """Builds the value model, optimizer and schedule; resumes a critic checkpoint (collective).

        Args:
            cfg: the critic's config (`slime_core.critic.critic_config`).

        Returns:
            The rollout id to start from (`next_rollout_id` of a resumed checkpoint, else `--start-rollout-id`
            or 0).

        Raises:
            ValueError: missing `--hf-checkpoint`, no process group, `--freeze-vision-tower` without a vision tower,
                a bad `--critic-load`, or a checkpoint without a value head (an actor's; names the flag given).
        """
        if not cfg.hf_checkpoint:
            raise ValueError("--hf-checkpoint is required by the FSDP backend")
        if not dist.is_initialized():
            raise ValueError("torch.distributed must be initialized before FSDPCriticBackend.init")
        self.cfg = cfg
        self.device = default_device()
        torch.manual_seed(cfg.seed)
        source, resume_ckpt = _critic_source(cfg)
        flag = "--critic-load" if cfg.critic_load else "--load"  # `cfg.load` is the critic's folder either way
        if resume_ckpt:
            check_critic_checkpoint(flag, cfg.load, cfg.ckpt_step)
        self.model, self.config = build_fsdp_model(
            cfg, source, self.device, construct=construct_value_model, fill_missing=fill_value_head,
            install=install_value_forward,
            flag="--hf-checkpoint" if source == str(cfg.hf_checkpoint) else "--critic-load",
        )  # fmt: skip
        # The rule `build_fsdp_model` applied to the layers (the critic's config keeps the actor's compile flags).
        self.compile_layers_flag = "--fsdp-compile-layers" if compiles_layers(cfg, self.device) else None
        self.optimizer, self.scheduler = build_optimizer(
            self.model, cfg, self.device, frozen_vision_tower(self.model, cfg)
        )
        self.residency = Residency(self.model, self.optimizer, self.device, cpu_offload=cfg.fsdp_cpu_offload,
                                   pin_memory=cfg.offload_train_pin_memory)  # fmt: skip
        if not resume_ckpt:
            return cfg.start_rollout_id or 0
        start, self.global_step, _ = resume(cfg, self.model, self.optimizer, self.scheduler, None, flag)  # no LoRA
        return start

    @property
    def dp_size(self) -> int:
        """Number of ranks FSDP2 averages gradients over: all critic ranks (data-parallel × context-parallel)."""
        return dist.get_world_size()

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank (the actor's layout: ranks `d·C .. d·C + C-1` form DP group d)."""
        return dist.get_rank() // cp_size(self.model)

    # ---------------------------------------------------------------- values
    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """Per-sample values of the response tokens with the current weights (collective).

        Args:
            batch: this rank's data.

        Returns:
            N tensors `[L_i]` float32 on CPU.

        Raises:
            ValueError: a sample in no micro-batch of the schedule.
            RuntimeError: while asleep.
        """
        self.residency.require_awake("compute_values")
        rows = []
        for step in batch.micro_batches:
            for ids in step:
                mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, self.device)
                # On the device until the one copy after the last forward.
                rows.append((mb.sample_ids, mb.response_lengths, response_values(self.model, mb)[0]))
        return per_sample_on_host(rows, batch.num_samples)

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: ValueLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Forward + backward of step `step`'s micro-batches with the value loss (`CriticStepBackend`).

        Scaled like the actor's (`FSDPTrainBackend.forward_backward`: FSDP2 averages gradients over ranks, so the
        loss is multiplied by the DP size); empty micro-batches still run a forward and back-propagate its zero
        anchor so FSDP's collectives line up.
        """
        self.optimizer.zero_grad(set_to_none=True)
        metrics = []
        for ids in batch.micro_batches[step]:
            mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, self.device)
            values, anchor = response_values(self.model, mb)
            if not ids:
                anchor.backward()
                continue
            loss, mb_metrics = loss_fn(ids, split_by_lengths(values, mb.response_lengths))
            (loss * (self.dp_size / denominator) + anchor).backward()
            metrics.append(mb_metrics)
        return metrics

    def optimizer_step(self) -> tuple[torch.Tensor, float]:
        """Clips (`--clip-grad`), steps AdamW and the LR schedule; returns (pre-clip grad norm, this step's rate).

        The norm is a 0-d tensor on the device, read with the other steps' after the last one (no sync per step);
        with `--no-check-for-nan-in-loss-and-grad` it is read here, to skip a step whose norm is not finite.
        """
        norm, lr = clip_and_step(self.model, self.optimizer, self.scheduler, self.cfg.clip_grad,
                                 skip_non_finite=not self.cfg.check_for_nan_in_loss_and_grad)  # fmt: skip
        self.global_step += 1
        return norm, lr

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of `tensor` over the critic's data-parallel ranks (each CP group counted once), returned on CPU."""
        return all_reduce_sum(tensor, self.device, cp_size(self.model))

    def reduce_metric_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Metric sums over data-parallel ranks (see `trainer_parts.reduce_metric_sums`)."""
        return reduce_metric_sums(sums, self.device, cp_size(self.model))

    def reset_optimizer_states(self) -> None:
        """Drops AdamW's moments and step counts (`--reset-optimizer-states`)."""
        self.optimizer.state.clear()

    def train_critic(self, rollout_id: int, batch: RolloutBatch) -> tuple[dict[str, float], list[torch.Tensor]]:
        """The shared critic step (`slime_core.critic.train_critic_on_rollout`; collective).

        Returns:
            `(train/critic-* metrics, N [L_i] float32 values before the update)`.

        Raises:
            RuntimeError: while asleep.
        """
        self.residency.require_awake("train_critic")
        metrics, values = train_critic_on_rollout(self.cfg, self, rollout_id, batch)
        self.step_metrics = [metrics]
        return metrics, values

    # ------------------------------------------------------- checkpoints, memory
    def save(self, rollout_id: int) -> None:
        """Writes `{--critic-save}/iter_{rollout_id+1:07d}` atomically (collective); see `checkpoint.py`.

        Raises:
            ValueError: no `--critic-save` / `--save`.
            RuntimeError: while asleep.
        """
        self.residency.require_awake("save")
        if not self.cfg.save:
            raise ValueError("save() needs --critic-save or --save")
        save_checkpoint(self.cfg.save, rollout_id=rollout_id, global_step=self.global_step, model=self.model,
                        optimizer=self.optimizer, scheduler=self.scheduler,
                        save_optim=not self.cfg.no_save_optim)  # fmt: skip

    def sleep(self) -> None:
        """Moves parameters, buffers and optimizer states to host memory and frees accelerator memory."""
        self.residency.sleep()

    def wake_up(self) -> None:
        """Moves what `sleep` offloaded back to this rank's device."""
        self.residency.wake_up()
