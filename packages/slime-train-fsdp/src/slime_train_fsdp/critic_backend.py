"""`FSDPCriticBackend`: the PPO critic on FSDP2 (implements `slime_core.protocols.CriticBackend`).

The value model (`value_model.py`: the policy's decoder with a scalar head) is sharded, optimized,
checkpointed and offloaded exactly like the actor (`FSDPTrainBackend`, whose machinery it inherits);
`train_critic` is the shared critic step (`slime_core.critic.train_critic_on_rollout`), for which this class
supplies the value forward/backward.

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
from slime_core.config import SlimeArgs
from slime_core.critic import ActorMethodsRefused, ValueLoss, train_critic_on_rollout
from slime_train_fsdp.backend import FSDPTrainBackend
from slime_train_fsdp.checkpoint import TRACKER
from slime_train_fsdp.model_loading import build_fsdp_model, default_device
from slime_train_fsdp.packing import pack_micro_batch, split_by_lengths
from slime_train_fsdp.value_model import (
    construct_value_model,
    fill_value_head,
    install_value_forward,
    response_values,
)

logger = logging.getLogger(__name__)

__all__ = ["FSDPCriticBackend"]


def _critic_source(cfg: SlimeArgs) -> tuple[str, bool]:
    """(HF directory the value model is built from, whether `cfg.load` holds a critic checkpoint to resume).

    Raises:
        ValueError: an explicit `--critic-load` that is neither a critic checkpoint nor an HF directory.
    """
    load = pathlib.Path(cfg.load) if cfg.load else None
    if load is not None:
        step_dir = load / f"iter_{cfg.ckpt_step:07d}" if cfg.ckpt_step is not None else None
        if (load / TRACKER).exists() or (step_dir is not None and step_dir.is_dir()):
            return str(cfg.hf_checkpoint), True
        if (load / "config.json").exists():
            return str(load), False
        if cfg.critic_load:
            raise ValueError(
                f"--critic-load {load}: neither a critic checkpoint ({TRACKER}) nor an HF directory (config.json)"
            )
        logger.info("no critic checkpoint in %s: the critic starts from %s", load, cfg.hf_checkpoint)
    return str(cfg.hf_checkpoint), False


class FSDPCriticBackend(ActorMethodsRefused, FSDPTrainBackend):
    """FSDP2 value model for PPO; one instance per rank, `torch.distributed` set up by the caller.

    Example:
        >>> critic = FSDPCriticBackend()
        >>> start = critic.init(critic_config(cfg))  # doctest: +SKIP
        >>> metrics, values = critic.train_critic(start, batch)  # doctest: +SKIP
    """

    def init(self, cfg: SlimeArgs, *, with_ref: bool = False) -> int:
        """Builds the value model, optimizer and schedule; resumes a critic checkpoint (collective).

        Args:
            cfg: the critic's config (`slime_core.critic.critic_config`).
            with_ref: must be False (a critic has no reference model).

        Returns:
            The rollout id to start from (`next_rollout_id` of a resumed checkpoint, else `--start-rollout-id`
            or 0).

        Raises:
            ValueError: missing `--hf-checkpoint`, `with_ref`, or a bad `--critic-load`.
        """
        if with_ref:
            raise ValueError("a critic has no reference model (with_ref=True)")
        if not cfg.hf_checkpoint:
            raise ValueError("--hf-checkpoint is required by the FSDP backend")
        if not dist.is_initialized():
            raise ValueError("torch.distributed must be initialized before FSDPCriticBackend.init")
        self.cfg = cfg
        self.device = default_device()
        torch.manual_seed(cfg.seed)
        source, resume = _critic_source(cfg)
        self.model, self.config = build_fsdp_model(
            cfg, source, self.device, construct=construct_value_model, fill_missing=fill_value_head,
            install=install_value_forward,
        )  # fmt: skip
        self._build_optimizer(cfg)
        return self._load_checkpoint(cfg) if resume else (cfg.start_rollout_id or 0)

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
        self._require_awake("compute_values")
        out: list[torch.Tensor | None] = [None] * batch.num_samples
        for step in batch.micro_batches:
            for ids in step:
                mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, self.device)
                values, _ = response_values(self.model, mb)
                for i, v in zip(ids, split_by_lengths(values, mb.response_lengths), strict=True):
                    out[i] = v.float().cpu()
        missing = [i for i, t in enumerate(out) if t is None]
        if missing:
            raise ValueError(f"samples {missing[:5]} are in no micro-batch of the schedule")
        return out  # type: ignore[return-value]

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: ValueLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Forward + backward of step `step`'s micro-batches with the value loss (`CriticStepBackend`).

        Scaled like the actor's (`FSDPTrainBackend.forward_backward`); empty micro-batches still run a forward and
        back-propagate its zero anchor so FSDP's collectives line up.
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

    def train_critic(self, rollout_id: int, batch: RolloutBatch) -> tuple[dict[str, float], list[torch.Tensor]]:
        """The shared critic step (`slime_core.critic.train_critic_on_rollout`; collective).

        Returns:
            `(train/critic-* metrics, N [L_i] float32 values before the update)`.

        Raises:
            RuntimeError: while asleep.
        """
        self._require_awake("train_critic")
        metrics, values = train_critic_on_rollout(self.cfg, self, rollout_id, batch)
        self.step_metrics = [metrics]
        return metrics, values

    # ------------------------------------------------------- actor-only methods
    @property
    def has_ref(self) -> bool:
        """Always False: a critic has no reference model."""
        return False
