"""`FSDPTrainBackend`: slime's `TrainBackend` on PyTorch FSDP2 over Hugging Face causal LMs.

One instance per rank; `torch.distributed` is initialized by the caller and the default group is the
data-parallel group (1-D mesh `("dp",)`). Runs unchanged on CUDA/NCCL (bf16 compute, fp32 master weights and
reductions) and on CPU/gloo (fp32), which is what the tests use.

Loss scaling across ranks: `compute_train_loss` (the `--loss-type` objective) returns the SUM over a
micro-batch's samples of each sample's reduced loss; we divide by the step's global sample count (or token
count with `--calculate-per-token-loss`) and multiply by the DP size, because FSDP2's reduce-scatter AVERAGES
gradients over ranks. The resulting
gradient is the sum over ranks of the per-rank partial sums, i.e. the mean over the step's global batch.

Reference model: its weights are kept as a CPU copy of this rank's parameter shards and swapped into the
actor for the ref forward (like Megatron slime's `TensorBackuper`), so it never occupies accelerator memory
between uses.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from slime_core.algorithms import (
    apply_whitening,
    compute_advantages_and_returns,
    compute_train_loss,
    needs_old_log_probs,
    whitening_stats,
)
from slime_core.batch import RolloutBatch
from slime_core.param_filter import frozen_parameter_names
from slime_train_fsdp.checkpoint import load_checkpoint, save_checkpoint
from slime_train_fsdp.hf_export import iter_hf_buckets, save_hf
from slime_train_fsdp.lr_schedule import build_lr_scheduler
from slime_train_fsdp.model_loading import build_fsdp_model, default_device, load_hf_weights_into
from slime_train_fsdp.packing import install_response_forward, pack_micro_batch, response_log_probs, split_by_lengths

logger = logging.getLogger(__name__)

__all__ = ["FSDPTrainBackend"]

_DEFAULT_CHUNK = 1024  # response tokens per lm_head chunk when --log-probs-chunk-size is unset (-1)


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


class FSDPTrainBackend:
    """FSDP2 training backend (implements `slime_core.protocols.TrainBackend`).

    Example:
        >>> backend = FSDPTrainBackend()
        >>> start_rollout = backend.init(args, with_ref=args.use_kl_loss)  # doctest: +SKIP
        >>> metrics = backend.train(start_rollout, batch)  # doctest: +SKIP
    """

    def __init__(self) -> None:
        """Creates an uninitialized backend; call `init`."""
        self.args: Any = None
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.device = torch.device("cpu")
        self.global_step = 0
        self._ref_shards: dict[str, torch.Tensor] | None = None
        self._asleep = False
        self.step_metrics: list[dict[str, float]] = []

    # ------------------------------------------------------------------ setup
    def init(self, args: Any, *, with_ref: bool) -> int:
        """Builds model, optimizer and scheduler, loads `--load` if given (collective).

        Args:
            args: run config (fields listed in the package README).
            with_ref: keep reference weights for KL (`--use-kl-loss` or `--kl-coef != 0`).

        Returns:
            The rollout id to start from (`next_rollout_id` of the loaded checkpoint, else
            `--start-rollout-id` or 0).

        Raises:
            ValueError: on invalid flags (e.g. missing `--hf-checkpoint`).
        """
        if not getattr(args, "hf_checkpoint", None):
            raise ValueError("--hf-checkpoint is required by the FSDP backend")
        if not dist.is_initialized():
            raise ValueError("torch.distributed must be initialized before FSDPTrainBackend.init")
        if getattr(args, "advantage_estimator", "grpo") == "ppo" or getattr(args, "use_critic", False):
            raise ValueError("--advantage-estimator ppo needs a critic, which the FSDP backend does not provide")
        self.args = args
        self.device = default_device()
        torch.manual_seed(int(getattr(args, "seed", 1234)))
        self.model, self.config = build_fsdp_model(args, args.hf_checkpoint, self.device)
        install_response_forward(self.model)
        if with_ref:
            ref_path = getattr(args, "ref_load", None) or args.hf_checkpoint
            if str(ref_path) != str(args.hf_checkpoint):
                load_hf_weights_into(self.model, ref_path)
                self._ref_shards = self._snapshot()
                load_hf_weights_into(self.model, args.hf_checkpoint)
            else:
                self._ref_shards = self._snapshot()
        frozen = frozen_parameter_names([n for n, _ in self.model.named_parameters()], args)
        for name, param in self.model.named_parameters():
            if name in frozen:
                param.requires_grad_(False)  # FSDP2 then neither computes nor reduce-scatters its gradient
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=float(args.lr),
            betas=(float(getattr(args, "adam_beta1", 0.9)), float(getattr(args, "adam_beta2", 0.95))),
            eps=float(getattr(args, "adam_eps", 1e-8)),
            weight_decay=float(getattr(args, "weight_decay", 0.0)),
        )
        self.scheduler = build_lr_scheduler(self.optimizer, args)
        start = int(getattr(args, "start_rollout_id", None) or 0)
        if getattr(args, "load", None):
            meta = load_checkpoint(
                args.load,
                model=self.model,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                ckpt_step=getattr(args, "ckpt_step", None),
                load_optim=not getattr(args, "no_load_optim", False),
                load_rng=not getattr(args, "no_load_rng", False),
            )
            if meta is not None:
                start, self.global_step = int(meta["next_rollout_id"]), int(meta["global_step"])
        return start

    def _require_awake(self, what: str) -> None:
        # Asleep, the shards live on CPU; NCCL collectives on them would fail deep inside FSDP.
        if self._asleep:
            raise RuntimeError(f"{what}() called while the backend is asleep; call wake_up() first")

    @property
    def dp_size(self) -> int:
        """Number of data-parallel ranks."""
        return dist.get_world_size()

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {n: _local(p).detach().to("cpu", copy=True) for n, p in self.model.named_parameters()}

    @torch.no_grad()
    def _load_shards(self, shards: dict[str, torch.Tensor]) -> None:
        for n, p in self.model.named_parameters():
            _local(p).copy_(shards[n])

    # ------------------------------------------------------------- log-probs
    def _chunk_size(self) -> int:
        chunk = int(getattr(self.args, "log_probs_chunk_size", -1) or -1)
        return chunk if chunk > 0 else _DEFAULT_CHUNK

    def _temperature(self) -> float:
        return float(getattr(self.args, "rollout_temperature", 1.0))

    @torch.no_grad()
    def compute_log_probs(self, batch: RolloutBatch, *, model: str = "actor") -> list[torch.Tensor]:
        """Per-sample response log-probs (collective; same micro-batch schedule on every rank).

        Args:
            batch: this rank's data.
            model: `actor` (current weights) or `ref` (reference weights, swapped in for the call).

        Returns:
            N tensors `[L_i]` float32 on CPU, natural log, at `--rollout-temperature`.

        Raises:
            ValueError: for `model="ref"` without reference weights, or an unknown model name.
            RuntimeError: while asleep.
        """
        self._require_awake("compute_log_probs")
        if model not in ("actor", "ref"):
            raise ValueError(f"model must be 'actor' or 'ref', got {model!r}")
        if model == "ref" and self._ref_shards is None:
            raise ValueError("no reference model: init(..., with_ref=True) (--use-kl-loss / --kl-coef)")
        backup = None
        if model == "ref":
            backup = self._snapshot()
            self._load_shards(self._ref_shards)
        try:
            out: list[torch.Tensor | None] = [None] * batch.num_samples
            for step in batch.micro_batches:
                for ids in step:
                    mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, self.device)
                    logp, _, _ = response_log_probs(
                        self.model, mb, temperature=self._temperature(), chunk_size=self._chunk_size()
                    )
                    for i, lp in zip(ids, split_by_lengths(logp, mb.response_lengths), strict=True):
                        out[i] = lp.float().cpu()
        finally:
            if backup is not None:
                self._load_shards(backup)
        missing = [i for i, t in enumerate(out) if t is None]
        if missing:
            raise ValueError(f"samples {missing[:5]} are in no micro-batch of the schedule")
        return out  # type: ignore[return-value]

    # ---------------------------------------------------------------- train
    def _advantages(self, batch: RolloutBatch, old: list[torch.Tensor] | None, ref: list[torch.Tensor] | None):
        args = self.args
        if getattr(args, "disable_compute_advantages_and_returns", False):
            return None  # SFT / custom losses that need no advantages
        adv, _returns = compute_advantages_and_returns(
            args, rewards=list(batch.rewards), loss_masks=batch.loss_masks, log_probs=old, ref_log_probs=ref
        )
        if getattr(args, "normalize_advantages", False):
            # Masked whitening over the whole DP group: all-reduce the (count, sum, sum of squares) statistics.
            stats = whitening_stats(adv, batch.loss_masks).to(self.device)
            dist.all_reduce(stats)
            adv = apply_whitening(adv, batch.loss_masks, stats.cpu())
        return adv

    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """Old/ref log-probs, advantages, then `batch.num_steps` optimizer steps (collective).

        Args:
            rollout_id: id of the rollout being trained on (for logging).
            batch: this rank's data with its micro-batch schedule.

        Returns:
            `train/*` metrics averaged over the steps, each reduced over all DP ranks and normalized by the
            step's global sample (or token) count; `train/grad_norm` (pre-clip, mean over steps) and `train/lr`
            (rate of the last step). The per-step values are kept in `self.step_metrics`.

        Raises:
            ValueError: when `--use-rollout-logprobs` is set but the batch has no rollout log-probs, or the
                schedule lacks step counts.
            RuntimeError: while asleep.
        """
        args = self.args
        self._require_awake("train")
        use_rollout = bool(getattr(args, "use_rollout_logprobs", False))
        if use_rollout and batch.rollout_log_probs is None:
            raise ValueError("--use-rollout-logprobs needs rollout log-probs in the batch")
        if batch.num_steps == 0:
            raise ValueError("RolloutBatch has no optimizer step (empty micro_batches)")
        if getattr(args, "reset_optimizer_states", False):
            self.optimizer.state.clear()
        if use_rollout:
            old = list(batch.rollout_log_probs)
        elif self._can_reuse_log_probs(batch) or not needs_old_log_probs(args):
            # The training forward's detached log-probs are the old ones (weights do not move before), or the
            # loss (sft_loss) never reads them.
            old = None
        else:
            old = self.compute_log_probs(batch)
        ref = self.compute_log_probs(batch, model="ref") if self._ref_shards is not None else None
        adv = self._advantages(batch, old, ref)
        per_step: list[dict[str, float]] = []
        for step in range(batch.num_steps):
            per_step.append(self._train_step(batch, step, old=old, ref=ref, adv=adv))
        self.step_metrics = per_step
        interval = getattr(args, "ref_update_interval", None)
        if self._ref_shards is not None and interval and (rollout_id + 1) % int(interval) == 0:
            self._ref_shards = self._snapshot()  # --ref-update-interval: the reference follows the actor
        keys = per_step[0].keys()
        metrics = {k: sum(m[k] for m in per_step) / len(per_step) for k in keys}
        metrics["train/lr"] = per_step[-1]["train/lr"]
        logger.info("rollout %d: %s", rollout_id, {k: round(v, 6) for k, v in metrics.items()})
        return metrics

    def _can_reuse_log_probs(self, batch: RolloutBatch) -> bool:
        """Skip the separate old-log-prob forward when the rollout trains in one step (as the original does).

        All micro-batches of the only step see the initial weights, so `old = detach(current)` exactly; not
        with reward shaping by KL (`--kl-coef`, needs old log-probs for the advantages) or GSPO.
        """
        args = self.args
        return (
            batch.num_steps == 1
            and float(getattr(args, "kl_coef", 0.0) or 0.0) == 0.0
            and getattr(args, "advantage_estimator", "grpo") in ("grpo", "cispo", "reinforce_plus_plus_baseline")
        )

    def _train_step(self, batch: RolloutBatch, step: int, *, old, ref, adv) -> dict[str, float]:
        per_token = bool(getattr(self.args, "calculate_per_token_loss", False))
        counts = batch.step_token_counts if per_token else batch.step_sample_counts
        if len(counts) != batch.num_steps:
            name = "step_token_counts" if per_token else "step_sample_counts"
            raise ValueError(f"RolloutBatch.{name} must have one entry per step ({batch.num_steps})")
        denom = max(float(counts[step]), 1.0)
        lr = float(self.optimizer.param_groups[0]["lr"])
        sums: dict[str, torch.Tensor] = {}
        self.optimizer.zero_grad(set_to_none=True)
        for ids in batch.micro_batches[step]:
            for k, v in self._micro_batch_backward(batch, ids, old=old, ref=ref, adv=adv, denom=denom).items():
                sums[k] = sums[k] + v if k in sums else v.double()
        grad_norm = self._clip_grad()
        self.optimizer.step()
        self.scheduler.step()
        self.global_step += 1
        names = self._agree_on_keys(sorted(sums))
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        vec = torch.stack([sums.get(k, zero).to(self.device) for k in names]) if names else zero.reshape(0)
        if names:
            dist.all_reduce(vec)
        out = {f"train/{k}": v / denom for k, v in zip(names, vec.cpu().tolist(), strict=True)}
        out["train/grad_norm"] = grad_norm
        out["train/lr"] = lr
        return out

    def _micro_batch_backward(self, batch: RolloutBatch, ids: list[int], *, old, ref, adv, denom: float):
        """Forward + backward of one micro-batch; returns its metric sums (detached scalars)."""
        mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, self.device)
        logp, ent, anchor = response_log_probs(
            self.model, mb, temperature=self._temperature(), chunk_size=self._chunk_size(), with_entropy=True
        )
        if not ids:
            anchor.backward()  # keeps FSDP collectives aligned with ranks that have data
            return {}
        custom = getattr(self.args, "loss_type", None) == "custom_loss"  # a custom loss may use the entropy
        if float(getattr(self.args, "entropy_coef", 0.0) or 0.0) == 0.0 and not custom:
            ent = ent.detach()

        def pick(xs: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
            return None if xs is None else [xs[i].to(self.device) for i in ids]

        log_probs = split_by_lengths(logp, mb.response_lengths)
        loss, metrics = compute_train_loss(
            self.args,
            log_probs=log_probs,
            old_log_probs=pick(old) if old is not None else [lp.detach() for lp in log_probs],
            advantages=pick(adv),
            loss_masks=pick(batch.loss_masks),
            loss_denominators=[float(batch.loss_denominators[i]) for i in ids],
            ref_log_probs=pick(ref),
            rollout_log_probs=pick(batch.rollout_log_probs),
            entropy=split_by_lengths(ent, mb.response_lengths),
            total_lengths=[int(batch.tokens[i].numel()) for i in ids],
            tokens=[batch.tokens[i] for i in ids],
        )
        # FSDP2 averages gradients over ranks: scale by dp_size so they add up (see module docstring).
        (loss * (self.dp_size / denom) + anchor).backward()
        return metrics

    def _agree_on_keys(self, names: list[str]) -> list[str]:
        """Union of metric names over ranks (a rank with only empty micro-batches has none)."""
        gathered: list[list[str] | None] = [None] * self.dp_size
        dist.all_gather_object(gathered, names)
        return sorted({k for g in gathered for k in (g or [])})

    def _clip_grad(self) -> float:
        max_norm = float(getattr(self.args, "clip_grad", 1.0) or 0.0)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------ checkpoints
    def save(self, rollout_id: int) -> None:
        """Writes `{--save}/iter_{rollout_id+1:07d}` atomically (collective); see `checkpoint.py`."""
        self._require_awake("save")
        save_dir = getattr(self.args, "save", None)
        if not save_dir:
            raise ValueError("save() needs --save")
        save_checkpoint(
            save_dir,
            rollout_id=rollout_id,
            global_step=self.global_step,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            save_optim=not getattr(self.args, "no_save_optim", False),
        )

    def save_hf(self, path: str | pathlib.Path) -> None:
        """Exports an HF checkpoint loadable by `AutoModelForCausalLM.from_pretrained` (collective)."""
        self._require_awake("save_hf")
        save_hf(self.model, path, source_dir=self.args.hf_checkpoint)

    def named_hf_weights(self, bucket_bytes: int | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Buckets of full tensors under HF names (collective: all ranks must iterate together).

        Args:
            bucket_bytes: bucket budget; `--update-weight-buffer-size` (512 MiB) when None.

        Yields:
            Lists of `(name, tensor)` in the checkpoint dtype, on this rank's device.
        """
        self._require_awake("named_hf_weights")
        if bucket_bytes is None:
            bucket_bytes = int(getattr(self.args, "update_weight_buffer_size", 512 * 1024**2))
        dtype = getattr(self.config, "dtype", None)
        yield from iter_hf_buckets(self.model, bucket_bytes, dtype=dtype if isinstance(dtype, torch.dtype) else None)

    # ----------------------------------------------------------- offloading
    def _move_optimizer(self, device: torch.device | str) -> None:
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor) and k != "step":
                    state[k] = v.to(device, non_blocking=True)

    def sleep(self) -> None:
        """Moves parameters, gradients and optimizer state to CPU and frees accelerator memory."""
        if self._asleep:
            return
        self.model.zero_grad(set_to_none=True)
        self.model.to("cpu")
        self._move_optimizer("cpu")
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self._asleep = True

    def wake_up(self) -> None:
        """Moves what `sleep` offloaded back to this rank's device."""
        if not self._asleep:
            return
        offloaded = self.device.type == "cuda" and getattr(self.args, "fsdp_cpu_offload", False)
        target = torch.device("cpu") if offloaded else self.device
        self.model.to(target)
        self._move_optimizer(target)
        self._asleep = False
