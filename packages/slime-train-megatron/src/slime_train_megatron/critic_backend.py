"""`MegatronCriticBackend`: the PPO critic on megatron-core (implements `slime_core.protocols.CriticBackend`).

The value model is the policy's `GPTModel` with a `ValueHead` as `output_layer` (untied embeddings). Parallel
layout, DDP, the distributed optimizer, checkpoints and offloading are the actor's (`MegatronTrainBackend`,
whose machinery it inherits); `train_critic` is the shared critic step (`slime_core.critic.train_critic_on_rollout`),
for which this class supplies the value forward/backward through megatron-core's pipeline schedule.

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

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.critic import ActorMethodsRefused, ValueLoss, train_critic_on_rollout
from slime_train_megatron.backend import MegatronTrainBackend, _GatherCP, _MicroBatch
from slime_train_megatron.checkpoint import is_megatron_checkpoint
from slime_train_megatron.model import build_gpt_model, load_hf_weights
from slime_train_megatron.packing import cp_zigzag_indices

logger = logging.getLogger(__name__)

__all__ = ["MegatronCriticBackend"]


class MegatronCriticBackend(ActorMethodsRefused, MegatronTrainBackend):
    """megatron-core value model for PPO; one instance per rank, `torch.distributed` set up by the caller."""

    def init(self, cfg: SlimeArgs, *, with_ref: bool = False) -> int:
        """Builds the value model, optimizer and schedule; resumes a critic checkpoint (collective).

        Args:
            cfg: the critic's config (`slime_core.critic.critic_config`).
            with_ref: must be False (a critic has no reference model).

        Returns:
            The rollout id to start from.

        Raises:
            ValueError: `with_ref`, bad settings, or a `--critic-load` that is neither a checkpoint nor an HF dir.
        """
        if with_ref:
            raise ValueError("a critic has no reference model (with_ref=True)")
        return super().init(cfg, with_ref=False)

    def _build_module(self, config: Any) -> Any:
        return build_gpt_model(self.model_args, self.settings, config, value_head=True)

    def _load_initial_weights(self, with_ref: bool) -> int:
        s, cfg = self.settings, self.cfg
        if s.load and is_megatron_checkpoint(s.load):
            return self._resume()  # a critic checkpoint: model, optimizer, schedule, RNG
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

    # ---------------------------------------------------------------- values
    def _response_values(self, output: torch.Tensor, mb: _MicroBatch) -> torch.Tensor:
        """Values `[R]` of a micro-batch's response tokens from this rank's head output `[1, T_local, 1]`."""
        p = mb.packed
        values = output[0, :, 0]
        device = values.device
        cp = self.settings.context_parallel_size
        if cp == 1:
            return values[p.logit_index.to(device)]
        # Each CP rank holds its zigzag positions; gather them all, then pick the response-predicting ones.
        group, rank = parallel_state.get_context_parallel_group(), parallel_state.get_context_parallel_rank()
        order = torch.cat([cp_zigzag_indices(p.cu_seqlens, r, cp) for r in range(cp)]).to(device)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=device)
        return _GatherCP.apply(values, group, cp, rank)[inverse[p.logit_index.to(device)]]

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """Per-sample values `[L_i]` float32 (CPU) of the response tokens, on every rank (collective).

        Raises:
            RuntimeError: called while asleep.
            ValueError: a sample in no micro-batch of the schedule.
        """
        if self._asleep:
            raise RuntimeError("compute_values() called while asleep; call wake_up() first")
        self.model.eval()
        try:
            out: dict[int, torch.Tensor] = {}
            for step in range(batch.num_steps):

                def loss_fn(output, mb):
                    values = self._response_values(output, mb)
                    return torch.zeros((), device=values.device), (mb, values.float().cpu())

                results = self._run(batch, step, loss_fn, forward_only=True)
                pairs = [(mb.ids, mb.packed.response_lengths, v) for mb, v in results if not mb.dummy]
                for ids, lens, values in self._broadcast_from_last_stage(pairs):
                    for i, piece in zip(ids, values.split(lens), strict=True):
                        out[i] = piece
        finally:
            self.model.train()
        missing = [i for i in range(batch.num_samples) if i not in out]
        if missing:
            raise ValueError(f"samples {missing[:5]} are in no micro-batch of the schedule")
        return [out[i] for i in range(batch.num_samples)]

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: ValueLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Step `step`'s micro-batches with the value loss through megatron-core's schedule (`CriticStepBackend`).

        Scaled and kept collective like the actor's (`MegatronTrainBackend.forward_backward`).
        """

        def mb_loss(output, mb):
            values = self._response_values(output, mb)
            if mb.dummy:
                return output.sum() * 0.0, {}
            loss, metrics = loss_fn(mb.ids, list(values.split(mb.packed.response_lengths)))
            return loss / denominator + output.sum() * 0.0, {k: v.detach().double() for k, v in metrics.items()}

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        return [m for m in self._run(batch, step, mb_loss, forward_only=False) if m]

    def train_critic(self, rollout_id: int, batch: RolloutBatch) -> tuple[dict[str, float], list[torch.Tensor]]:
        """The shared critic step (`slime_core.critic.train_critic_on_rollout`; collective).

        Returns:
            `(train/critic-* metrics, N [L_i] float32 values before the update)` on every rank.

        Raises:
            RuntimeError: called while asleep.
        """
        if self._asleep:
            raise RuntimeError("train_critic() called while asleep; call wake_up() first")
        metrics, values = train_critic_on_rollout(self.cfg, self, rollout_id, batch)
        self.step_metrics = [metrics]
        return metrics, values
