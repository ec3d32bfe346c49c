"""`MegatronCriticBackend`: the PPO critic on megatron-core (implements `slime_core.protocols.CriticBackend`).

The value model is the policy's `GPTModel` with a `ValueHead` as `output_layer` (untied embeddings). Parallel
layout, DDP, the distributed optimizer, checkpoints and offloading come from the same pieces as the actor's
(`trainer_parts`, `pipeline`, `checkpoint`), composed here rather than inherited: the critic has only the critic's
methods. `train_critic` is the shared critic step (`slime_core.critic.train_critic_on_rollout`), for which this
class supplies the value forward/backward through megatron-core's pipeline schedule.

Where the critic starts (`cfg` is `slime_core.critic.critic_config(run config)`, so the settings' `load` is
`--critic-load` or `<--load>/critic`): a critic torch_dist checkpoint there is resumed; an HF directory there
initializes the backbone (and the head, if it has one); otherwise the backbone comes from `--hf-checkpoint` and
the head is drawn fresh (N(0, init_method_std), bias 0).
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import torch
from megatron.core import parallel_state

from slime_convert import ModelArgs
from slime_convert.torch_dist import resolve_iteration_dir
from slime_convert.vocab_padding import check_torch_dist_padding
from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.critic import ValueLoss, train_critic_on_rollout
from slime_train_megatron.checkpoint import check_value_head_checkpoint, is_megatron_checkpoint, save_checkpoint
from slime_train_megatron.model import load_hf_weights
from slime_train_megatron.optimizer_state import reset_adam_moments
from slime_train_megatron.pipeline import MicroBatch, PipelineRunner
from slime_train_megatron.settings import MegatronSettings
from slime_train_megatron.trainer_parts import (
    Residency,
    all_reduce_sum,
    build_optimizer,
    build_parallel_model,
    optimizer_step,
    reduce_metric_sums,
    resume,
)

logger = logging.getLogger(__name__)

__all__ = ["MegatronCriticBackend"]


class MegatronCriticBackend:
    """megatron-core value model for PPO; one instance per rank, `torch.distributed` set up by the caller.

    Implements `slime_core.protocols.CriticBackend` and `slime_core.critic.CriticStepBackend` and nothing else: it
    owns its model stage, optimizer, checkpoints and residency (built from `trainer_parts.py` and run through
    `pipeline.PipelineRunner`, as the actor is) and has no log-probs, no RL `train`, no HF export and no weight push.
    """

    def __init__(self) -> None:
        """Creates an uninitialized critic; call `init`."""
        self.cfg: SlimeArgs | None = None
        self.settings: MegatronSettings | None = None
        self.model_args: ModelArgs | None = None
        self.model: Any = None  # DDP-wrapped
        self.module: Any = None  # the GPTModel with a ValueHead as output layer
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.runner: PipelineRunner | None = None
        self.residency: Residency | None = None
        self.global_step = 0
        self.step_metrics: list[dict[str, float]] = []
        self.compile_layers_flag: str | None = None  # set by `init` (`CriticBackend.compile_layers_flag`)

    def init(self, cfg: SlimeArgs) -> int:
        """Builds the value model, optimizer and schedule; resumes a critic checkpoint (collective).

        Args:
            cfg: the critic's config (`slime_core.critic.critic_config`).

        Returns:
            The rollout id to start from.

        Raises:
            ValueError: bad settings, no `--hf-checkpoint`, or a `--critic-load` that is neither a checkpoint nor an
                HF dir, or a checkpoint without a value head (an actor's).
        """
        self.cfg = cfg
        s = self.settings = MegatronSettings.from_config(cfg)
        if not cfg.hf_checkpoint:
            raise ValueError("--hf-checkpoint is required (model architecture and tokenizer)")
        self.model_args = ModelArgs.from_hf_dir(
            cfg.hf_checkpoint, make_vocab_size_divisible_by=s.make_vocab_size_divisible_by
        )
        if s.load and is_megatron_checkpoint(s.load):  # before any GPU work
            flag = "--critic-load" if cfg.critic_load else "--load"
            check_value_head_checkpoint(flag, s.load, s.ckpt_step, self.model_args.hidden_size)
            check_torch_dist_padding(f"{flag} {s.load}", resolve_iteration_dir(s.load, s.ckpt_step), self.model_args,
                                     s.tensor_model_parallel_size, value_head=True)  # fmt: skip
        parts = build_parallel_model(cfg, s, self.model_args, value_head=True)
        self.module, self.model = parts.module, parts.model
        # As `build_parallel_model` resolved it (`settings.compiles_layers`), as the actor reports it.
        self.compile_layers_flag = "--megatron-compile-layers" if s.megatron_compile_layers else None
        self.optimizer, self.scheduler = build_optimizer(parts, s, cfg)
        self.runner = PipelineRunner(self.model, self.module, s, parts.attention)
        self.residency = Residency(self.model, self.optimizer, cfg.offload_train_pin_memory)
        return self._load_initial_weights()

    def _load_initial_weights(self) -> int:
        s, cfg = self.settings, self.cfg
        if s.load and is_megatron_checkpoint(s.load):
            return resume(s, self.module, self.optimizer, self.scheduler)  # model, optimizer, schedule, RNG
        source = cfg.hf_checkpoint
        if s.load and (pathlib.Path(s.load) / "config.json").exists():
            source = s.load
        elif cfg.critic_load:
            raise ValueError(
                f"--critic-load {s.load}: neither a critic torch_dist checkpoint nor an HF directory (config.json)"
            )
        elif s.load:
            logger.info("no critic checkpoint in %s: the critic starts from %s", s.load, source)
        load_hf_weights(self.module, source, self.model_args, s, value_head=True)
        self.optimizer.reload_model_params()
        return 0

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank (megatron-core's parallel state)."""
        return parallel_state.get_data_parallel_rank()

    # ---------------------------------------------------------------- values
    def _response_values(self, output: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        """Values `[R]` of a micro-batch's response tokens from this rank's head output `[1, T_local, 1]`."""
        values = output[0, :, 0]
        if self.settings.context_parallel_size == 1:
            # On the device since the step's slots were built: a blocking `.to(device)` here waited for the forward.
            return values[mb.rows.logit_index]
        return self.runner.gather_cp(values, mb)  # each CP rank holds its zigzag positions

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """Per-sample values `[L_i]` float32 (CPU) of the response tokens, on every rank (collective).

        Raises:
            RuntimeError: called while asleep.
            ValueError: a sample in no micro-batch of the schedule.
        """
        self.residency.require_awake("compute_values")
        return self.runner.forward_only_per_sample(batch, self._response_values)

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: ValueLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Step `step`'s micro-batches with the value loss through megatron-core's schedule (`CriticStepBackend`).

        Scaled and kept collective like the actor's (`MegatronTrainBackend.forward_backward`): loss / denominator,
        summed over micro-batches and DP (`PipelineRunner.run`); empty slots run a dummy with a zero loss.
        """

        def mb_loss(output, mb):
            values = self._response_values(output, mb)
            if mb.dummy:
                return output.sum() * 0.0, {}
            loss, metrics = loss_fn(mb.ids, list(values.split(mb.packed.response_lengths)))
            return loss / denominator + output.sum() * 0.0, {k: v.detach().double() for k, v in metrics.items()}

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        return [m for m in self.runner.run(batch, step, mb_loss, forward_only=False) if m]

    def optimizer_step(self) -> tuple[float | torch.Tensor, float]:
        """Steps the megatron optimizer (it clips) and the LR schedule; returns (grad norm, this step's rate)."""
        norm, lr = optimizer_step(
            self.optimizer, self.scheduler, skip_non_finite=not self.settings.check_for_nan_in_loss_and_grad
        )
        self.global_step += 1
        return norm, lr

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of `tensor` over the data-parallel group, returned on CPU."""
        return all_reduce_sum(tensor, self.runner.device)

    def reduce_metric_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Sums over DP on the last pipeline stage, then broadcast to every stage."""
        return reduce_metric_sums(sums, self.runner.device, self.runner.broadcast_from_last_stage)

    def reset_optimizer_states(self) -> None:
        """Zeroes the Adam moments and step counts (`--reset-optimizer-states`)."""
        reset_adam_moments(self.optimizer)

    def train_critic(self, rollout_id: int, batch: RolloutBatch) -> tuple[dict[str, float], list[torch.Tensor]]:
        """The shared critic step (`slime_core.critic.train_critic_on_rollout`; collective).

        Returns:
            `(train/critic-* metrics, N [L_i] float32 values before the update)` on every rank.

        Raises:
            RuntimeError: called while asleep.
        """
        self.residency.require_awake("train_critic")
        metrics, values = train_critic_on_rollout(self.cfg, self, rollout_id, batch)
        self.step_metrics = [metrics]
        return metrics, values

    # ---------------------------------------------------------------- checkpoints, memory
    def save(self, rollout_id: int) -> None:
        """Writes `<--critic-save>/iter_{rollout_id:07d}` (model, optimizer, scheduler, RNG) atomically.

        Raises:
            ValueError: no `--critic-save` / `--save`.
        """
        if not self.settings.save:
            raise ValueError("save() needs --critic-save or --save")
        s = self.settings
        save_checkpoint(s.save, rollout_id, self.module, self.optimizer, self.scheduler, save_optim=not s.no_save_optim,
                        make_vocab_size_divisible_by=s.make_vocab_size_divisible_by)  # fmt: skip

    def sleep(self) -> None:
        """Moves parameters, gradient buffers and optimizer state to CPU and frees accelerator memory."""
        self.residency.sleep()

    def wake_up(self) -> None:
        """Restores what `sleep` moved out."""
        self.residency.wake_up()
