"""`MegatronTrainBackend`: slime's `TrainBackend` on megatron-core (TP/PP/CP/EP, distributed optimizer).

One instance per rank; `torch.distributed` is initialized by the caller (NCCL on GPUs). Parallel groups
come from `MegatronSettings` (`--megatron-args`). Micro-batches are packed THD rows run through
megatron-core's pipeline schedule (`get_forward_backward_func`), so PP works unchanged. `train` is the shared
RL step (`slime_core.train_step.train_on_rollout`); this class supplies its forward/backward, collectives
and optimizer (the `StepBackend` methods).

Loss scaling: megatron-core averages micro-batch losses over the micro-batches and gradients over DP×CP ranks
(the original's `calculate_per_token_loss=False`, which also scales the MoE router's aux loss as there);
`PipelineRunner.run` undoes that averaging for the main loss. Each micro-batch loss (the shared step's
`compute_train_loss`, a sum over its samples) is divided by the step's global rollout count (`step_denominator`;
or token count with `--calculate-per-token-loss`); summed over micro-batches and DP ranks this is the mean over the
step's global batch. Under context parallelism every
CP rank computes the full loss from all-gathered log-probs whose backward keeps only the rank's own tokens,
so the DP×CP gradient sum is again exact.

Reference and teacher models: CPU copies of the parameters swapped in for their forwards (slime's
`TensorBackuper`). The on-policy-distillation teacher (`--opd-type megatron`) comes from `--opd-teacher-load`, a
torch_dist checkpoint (`--opd-teacher-ckpt-step`) or an HF directory, with the student's architecture.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import torch
from megatron.core import parallel_state

from slime_convert import ModelArgs
from slime_convert.torch_dist import resolve_iteration_dir
from slime_convert.vocab_padding import check_torch_dist_padding
from slime_core.algorithms.fused_head import resolve_chunk_size
from slime_core.batch import RolloutBatch
from slime_core.checkpoint_dirs import iteration_name, no_reference_message, saved_reference
from slime_core.config import SlimeArgs
from slime_core.config.opd import trainer_side_teacher
from slime_core.fp8 import trainer_weights_dir
from slime_core.train_step import MicroBatchLoss, train_on_rollout
from slime_core.weight_buckets import iter_buckets
from slime_core.weight_swap import WeightSwap
from slime_train_megatron.attention import AttentionKind
from slime_train_megatron.checkpoint import (
    check_load_shapes,
    commit_checkpoint,
    is_megatron_checkpoint,
    load_checkpoint,
    load_reference,
    save_checkpoint,
)
from slime_train_megatron.hf_export import save_hf
from slime_train_megatron.logprobs import vocab_parallel_log_probs
from slime_train_megatron.model import iter_hf_weights, load_hf_weights
from slime_train_megatron.optimizer_state import reset_adam_moments
from slime_train_megatron.output_head import emit_hidden_states, hidden_log_probs
from slime_train_megatron.packing import cp_zigzag_indices
from slime_train_megatron.pipeline import MicroBatch, PipelineRunner
from slime_train_megatron.router_metrics import reset_router_losses, router_loss_metrics
from slime_train_megatron.settings import HeadKind, MegatronSettings, head_kind
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

__all__ = ["MegatronTrainBackend"]

_MISSING = {
    "ref": "no reference model: init(..., with_ref=True) (--use-kl-loss / --kl-coef)",
    "teacher": "no teacher model: --use-opd --opd-type megatron --opd-teacher-load DIR",
}


class MegatronTrainBackend:
    """Megatron-core implementation of `slime_core.protocols.TrainBackend`.

    `cfg` is the frozen run config the backend reads at every call (loss, advantage and step options);
    assigning another validated config (e.g. `backend.cfg = backend.cfg.model_copy(update=...)`) changes
    those options for the following calls. What `init` built from it (parallel layout and `settings`,
    model, optimizer, schedule, reference weights) stays.
    """

    @staticmethod
    def start_compile_warm_up(cfg: SlimeArgs, gated: bool = False) -> None:
        """No warm-up process: `--megatron-compile-layers` compiles in the first step. Returns None."""
        return None

    def __init__(self) -> None:
        self.cfg: SlimeArgs | None = None
        self.settings: MegatronSettings | None = None
        self.model_args: ModelArgs | None = None
        self.model: Any = None  # DDP-wrapped
        self.module: Any = None  # the GPTModel
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.weights = WeightSwap(lambda: self.module.named_parameters(), missing=_MISSING)  # ref / OPD teacher
        self.attention: AttentionKind = "transformer_engine"
        self.head: HeadKind = "logits"  # `--log-probs-head` (output_head.py)
        self.compile_layers_flag: str | None = None  # set by `init` (`TrainBackend.compile_layers_flag`)
        self.runner: PipelineRunner | None = None  # packed micro-batches through megatron-core's schedule
        self.residency: Residency | None = None  # sleep/wake
        self.global_step = 0
        self.step_metrics: list[dict[str, float]] = []

    # ---------------------------------------------------------------- setup
    def init(self, cfg: SlimeArgs, *, with_ref: bool) -> int:
        """Builds parallel groups, model, optimizer; loads weights; returns the rollout id to start from.

        Reads `cfg.hf_checkpoint` (architecture, and weights when there is no torch_dist checkpoint),
        `cfg.megatron_args` and the `MegatronSettings` fields (`load`, `ref_load`, `lr`, ...).

        Raises:
            ValueError: bad settings, an estimator that needs a critic, or no `--hf-checkpoint`.
        """
        self.cfg = cfg
        s = self.settings = MegatronSettings.from_config(cfg)
        if not cfg.hf_checkpoint:
            raise ValueError("--hf-checkpoint is required (model architecture and tokenizer)")
        self.model_args = ModelArgs.from_hf_dir(
            cfg.hf_checkpoint, make_vocab_size_divisible_by=s.make_vocab_size_divisible_by
        )
        check_load_shapes(  # before any GPU work
            cfg.hf_checkpoint, s.ref_load, s.load, s.ckpt_step, self.model_args, s.tensor_model_parallel_size
        )
        parts = build_parallel_model(cfg, s, self.model_args)
        self.attention, self.module, self.model = parts.attention, parts.module, parts.model
        # As `build_parallel_model` resolved it (`settings.compiles_layers`: MoE, TE and TP/CP > 1 stay eager).
        self.compile_layers_flag = "--megatron-compile-layers" if s.megatron_compile_layers else None
        cuda = torch.cuda.is_available()
        self.set_log_probs_head(head_kind(cfg.log_probs_head, s.tensor_model_parallel_size, cuda=cuda))
        self.optimizer, self.scheduler = build_optimizer(parts, s, cfg)
        self.runner = PipelineRunner(self.model, self.module, s, self.attention)
        self.residency = Residency(self.model, self.optimizer, cfg.offload_train_pin_memory)
        return self._load_initial_weights(with_ref)

    def _load_initial_weights(self, with_ref: bool) -> int:
        s = self.settings
        if s.ref_load and is_megatron_checkpoint(s.ref_load):
            load_checkpoint(s.ref_load, self.module, None, None, load_rng=False)
        else:
            # An FP8 --hf-checkpoint is only served: HF weights come from the BF16 --ref-load (slime_core.fp8).
            load_hf_weights(self.module, trainer_weights_dir(self.cfg.hf_checkpoint, s.ref_load), self.model_args, s)
        self.optimizer.reload_model_params()  # fp32 main params from the loaded weights
        if with_ref:
            self.weights.hold("ref")
        if trainer_side_teacher(self.cfg):
            self._load_teacher()
        start = self._resume()
        if start > 0 and self.cfg.ref_update_interval and self.has_ref:
            self._resume_reference(start - 1)
        return start

    def _resume_reference(self, step: int) -> None:
        """With `--ref-update-interval` the reference is the actor of the last update: read it from iteration `step`.

        It was built from `--ref-load` / `--hf-checkpoint` above, so a resume past an update ran its KL term against
        the initial weights until the next update. A checkpoint saved without the reference says so once.
        """
        load = self.settings.load
        ckpt = resolve_iteration_dir(load, step)  # as the actor's load: --load may name the iteration folder itself
        reference = saved_reference(ckpt)
        if reference is not None:
            self.weights.capture("ref", lambda: load_reference(reference, self.module))
            logger.info("--ref-update-interval: the reference model resumes from %s", reference)
        elif step + 1 >= self.cfg.ref_update_interval:
            logger.warning("%s", no_reference_message(load, iteration_name(step), self.cfg.ref_update_interval))

    def _load_teacher(self) -> None:
        """Holds a CPU copy of the OPD teacher's parameters (`--opd-teacher-load`); the actor's weights are put back."""
        path = self.cfg.opd_teacher_load
        if is_megatron_checkpoint(path):  # its padding must be the actor's: megatron's load says only "shape"
            step = self.cfg.opd_teacher_ckpt_step
            check_torch_dist_padding(f"--opd-teacher-load {path}", resolve_iteration_dir(path, step), self.model_args,
                                     self.settings.tensor_model_parallel_size)  # fmt: skip

        def load() -> None:
            if is_megatron_checkpoint(path):
                load_checkpoint(path, self.module, None, None, load_rng=False, ckpt_step=self.cfg.opd_teacher_ckpt_step)
            else:
                load_hf_weights(self.module, path, self.model_args, self.settings)

        self.weights.capture("teacher", load)
        logger.info("on-policy-distillation teacher loaded from %s", path)

    def _resume(self) -> int:
        """Loads `--load` when it is a Megatron checkpoint; returns the rollout id to start from."""
        return resume(self.settings, self.module, self.optimizer, self.scheduler)

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank (megatron-core's parallel state): which per-DP-rank batch this rank trains on."""
        return parallel_state.get_data_parallel_rank()

    # ---------------------------------------------------------------- helpers
    @property
    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def has_ref(self) -> bool:
        """Whether reference weights are held (`init(..., with_ref=True)`)."""
        return self.weights.holds("ref")

    @property
    def has_teacher(self) -> bool:
        """Whether on-policy-distillation teacher weights are held (`--opd-type megatron`)."""
        return self.weights.holds("teacher")

    def set_log_probs_head(self, head: HeadKind) -> None:
        """Switches the log-prob head for the following calls (`output_head.py`; init sets `--log-probs-head`'s).

        Args:
            head: "logits", or "fused" at TP 1 (`settings.head_kind` judges the flag in preflight and at init; the
                benchmark's A/B toggle runs a single process, so TP 1).
        """
        emit_hidden_states(self.module, head == "fused")
        self.head = head

    def _output_weight(self) -> torch.Tensor:
        """`[V_padded, H]` weight of the lm_head: the tied embedding, or the output layer's own.

        As `GPTModel.forward` picks it: `shared_embedding_or_output_weight()` returns the input embedding on a first
        stage whether or not the weights are tied.
        """
        if self.module.share_embeddings_and_output_weights:
            return self.module.shared_embedding_or_output_weight()
        return self.module.output_layer.weight

    def _response_log_probs(self, output: torch.Tensor, mb: MicroBatch, with_entropy: bool):
        """Response-token log-probs (and entropy) `[R]` of a micro-batch from this rank's output.

        `output` is `[1, T_local, V/TP]` logits (the `logits` head) or `[1, T_local, H]` hidden states (`fused`).
        """
        p = mb.packed
        logits = output[0]  # [T_local, V/TP] or [T_local, H]
        device = logits.device
        cp = self.settings.context_parallel_size
        kept = None if mb.kept is None else mb.kept.to(device)
        if cp == 1:
            # On the device since the step's slots were built: a blocking copy here waited for the whole forward.
            rows, targets = mb.rows.logit_index, mb.rows.targets
        else:
            # Each CP rank scores all next-token targets at its own positions; gather them, then pick responses.
            index = cp_zigzag_indices(p.cu_seqlens, parallel_state.get_context_parallel_rank(), cp)
            nxt = torch.cat([p.tokens[0, 1:], p.tokens[0, :1]])[index]
            rows, targets = torch.arange(index.numel(), device=device), nxt.to(device)
            if kept is not None:  # the sets follow the positions: response row of each local position, else none
                response_row = torch.full((p.tokens.shape[1],), -1, dtype=torch.long)
                response_row[p.logit_index] = torch.arange(p.logit_index.numel())
                kept = kept.select_rows(response_row[index].to(device))
        if self.head == "fused":
            lp, ent = hidden_log_probs(
                logits[rows],
                self._output_weight(),
                targets,
                temperature=self.cfg.rollout_temperature,
                vocab_size=self.model_args.vocab_size,
                chunk_size=resolve_chunk_size(self.cfg.log_probs_chunk_size),
                with_entropy=with_entropy,
                kept=kept,
            )
        else:
            lp, ent = vocab_parallel_log_probs(
                logits[rows],
                targets,
                temperature=self.cfg.rollout_temperature,
                vocab_start=parallel_state.get_tensor_model_parallel_rank() * logits.shape[-1],  # V/TP columns
                vocab_size=self.model_args.vocab_size,
                group=parallel_state.get_tensor_model_parallel_group(),
                with_entropy=with_entropy,
                kept=kept,
                chunk_size=self.cfg.log_probs_chunk_size,  # -1 (the default): all rows at once, as the original
            )
        if cp > 1:
            lp = self.runner.gather_cp(lp, mb)
            ent = None if ent is None else self.runner.gather_cp(ent, mb)
        return lp, ent

    # ---------------------------------------------------------------- log-probs
    @torch.no_grad()
    def compute_log_probs(self, batch: RolloutBatch, *, model: str = "actor") -> list[torch.Tensor]:
        """Per-sample response log-probs `[L_i]` float32 (CPU) at `--rollout-temperature` (collective).

        Args:
            batch: this rank's data.
            model: `actor` (current weights), `ref` or `teacher` (swapped in for the call).

        Raises:
            ValueError: unknown `model`, or "ref" / "teacher" without those weights.
        """
        with self.weights.swapped(model):
            return self._log_probs(batch)

    def _log_probs(self, batch: RolloutBatch) -> list[torch.Tensor]:
        def read(logits, mb):
            return self._response_log_probs(logits, mb, with_entropy=False)[0]

        return self.runner.forward_only_per_sample(batch, read)

    # ---------------------------------------------------------------- train
    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """The shared RL step on `batch` (`slime_core.train_step.train_on_rollout`; collective).

        Returns:
            `train/*` metric means over steps (global-batch normalized), `train/grad_norm`, `train/lr`, and for MoE
            models megatron-core's router losses (`train/load_balancing_loss`, `train/z_loss`, ...:
            `router_metrics`); the per-step values are kept in `self.step_metrics`.

        Raises:
            RuntimeError: called while asleep.
            ValueError: `--use-rollout-logprobs` without rollout log-probs, or missing step counts.
        """
        self.residency.require_awake("train")
        self.runner.train_micro_batches = 0
        reset_router_losses()
        metrics, self.step_metrics = train_on_rollout(self.cfg, self, rollout_id, batch)
        if self.model_args.is_moe:  # megatron-core's router losses (`router_metrics`), when a coefficient is on
            metrics.update(router_loss_metrics(self.model_args.num_layers, self.runner.train_micro_batches))
        return metrics

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of `tensor` over the data-parallel group, returned on CPU."""
        return all_reduce_sum(tensor, self._device)

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: MicroBatchLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Step `step`'s micro-batches through megatron-core's schedule (see `slime_core.train_step.StepBackend`).

        An empty schedule slot runs a 2-token dummy whose zero loss keeps the graph (and the pipeline's and
        DDP's collectives) alive. Metrics come back on the last pipeline stage only (`reduce_metric_sums`
        broadcasts them).
        """

        def mb_loss(logits, mb):
            lp, ent = self._response_log_probs(logits, mb, with_entropy=True)
            if mb.dummy:
                return (logits.sum() * 0.0), {}  # keeps the graph (and collectives) of empty slots alive
            lens = mb.packed.response_lengths
            loss, metrics = loss_fn(mb.ids, list(lp.split(lens)), list(ent.split(lens)))
            return loss / denominator + logits.sum() * 0.0, {k: v.detach().double() for k, v in metrics.items()}

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

    def reduce_metric_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Sums over DP on the last pipeline stage (the only one with losses), then broadcasts to every stage."""
        return reduce_metric_sums(sums, self._device, self.runner.broadcast_from_last_stage)

    def reset_optimizer_states(self) -> None:
        """Zeroes the Adam moments and step counts (`--reset-optimizer-states`)."""
        reset_adam_moments(self.optimizer)

    def update_ref(self) -> None:
        """Copies the current weights into the reference snapshot (`--ref-update-interval`)."""
        self.weights.hold("ref")

    # ---------------------------------------------------------------- checkpoints and weights
    def save(self, rollout_id: int, *, commit: bool = True) -> None:
        """Writes `<--save>/iter_{rollout_id:07d}` (model, optimizer, scheduler, RNG) atomically.

        `commit`: name it in the tracker (the resume point); False leaves that to `commit_save`.

        Raises:
            ValueError: no `--save`.
        """
        if not self.settings.save:
            raise ValueError("save() needs --save")
        s = self.settings
        # The reference follows the actor: a resume needs it (the initial weights are not it past an update).
        reference = self.weights.swapped("ref") if self.cfg.ref_update_interval and self.has_ref else None
        save_checkpoint(s.save, rollout_id, self.module, self.optimizer, self.scheduler, save_optim=not s.no_save_optim,
                        reference=reference, make_vocab_size_divisible_by=s.make_vocab_size_divisible_by,
                        commit=commit)  # fmt: skip

    def commit_save(self, rollout_id: int) -> None:
        """Names the checkpoint `save(rollout_id, commit=False)` wrote in the tracker: the resume point (rank 0)."""
        commit_checkpoint(self.settings.save, rollout_id)

    def named_hf_weights(self, bucket_bytes: int | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Buckets of full HF-named tensors (TP/EP gathered, PP broadcast; collective on every rank)."""
        size = bucket_bytes or self.cfg.update_weight_buffer_size
        return iter_buckets(iter_hf_weights(self.module, self.model_args), size)

    def save_hf(self, path: str | pathlib.Path) -> None:
        """Exports an HF checkpoint loadable by `AutoModelForCausalLM.from_pretrained` (collective; rank 0 writes).

        The full HF-named weights (`iter_hf_weights`: TP/EP gathered, PP broadcast) in the `--hf-checkpoint`
        config's dtype, with that checkpoint's config/tokenizer/generation files; written to `path.tmp`,
        then renamed.

        Raises:
            RuntimeError: called while asleep.
        """
        self.residency.require_awake("save_hf")
        save_hf(iter_hf_weights(self.module, self.model_args), path, source_dir=self.cfg.hf_checkpoint)

    def sleep(self) -> None:
        """Moves parameters, gradient buffers and optimizer state to CPU and frees accelerator memory."""
        self.residency.sleep()

    def wake_up(self) -> None:
        """Restores what `sleep` moved out."""
        self.residency.wake_up()
