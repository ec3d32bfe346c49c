"""`FSDPTrainBackend`: slime's `TrainBackend` on PyTorch FSDP2 over Hugging Face causal LMs.

One instance per rank; `torch.distributed` is initialized by the caller and the default group is the
data-parallel group (1-D mesh `("dp",)`). Runs unchanged on CUDA/NCCL (bf16 compute, fp32 master weights and
reductions) and on CPU/gloo (fp32), which is what the tests use. `train` is the shared RL step
(`slime_core.train_step.train_on_rollout`); this class supplies its forward/backward, collectives and
optimizer (the `StepBackend` methods).

Loss scaling across ranks: the shared step's micro-batch loss is the SUM over the micro-batch's samples of
each sample's reduced loss; we divide it by the step's global rollout count (`step_denominator`; or token count with
`--calculate-per-token-loss`) and multiply by the DP size, because FSDP2's reduce-scatter AVERAGES gradients
over ranks. The resulting gradient is the sum over ranks of the per-rank partial sums, i.e. the mean over the
step's global batch.

Reference and teacher models: their weights are kept as CPU copies of this rank's parameter shards and
swapped into the actor for their forwards (like Megatron slime's `TensorBackuper`), so they never occupy
accelerator memory between uses. The on-policy-distillation teacher (`--opd-type fsdp` / `megatron`) comes from
`--opd-teacher-load`: an HF directory or an FSDP checkpoint of this backend, with the student's architecture.

Vision-language checkpoints (`vision.py`): micro-batches carry their samples' images, and
`--freeze-vision-tower` keeps the vision tower out of the optimizer; its weights are then pushed to the engines
once (the first sync, in case `--load` restored a tower the engines do not have) and skipped afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pathlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from slime_core.algorithms.fused_head import resolve_chunk_size
from slime_core.batch import RolloutBatch
from slime_core.checkpoint_dirs import TRACKER_FILE, no_reference_message, saved_reference
from slime_core.config import SlimeArgs
from slime_core.config.opd import trainer_side_teacher
from slime_core.fp8 import trainer_weights_dir
from slime_core.hf_checkpoint import source_dtype
from slime_core.host_to_device import per_sample_on_host
from slime_core.train_step import MicroBatchLoss, train_on_rollout
from slime_core.weight_buckets import iter_buckets
from slime_core.weight_swap import WeightSwap
from slime_train_fsdp.checkpoint import (
    commit_checkpoint,
    load_checkpoint,
    load_reference,
    model_flags_of,
    save_checkpoint,
)
from slime_train_fsdp.compile_cache import load_compile_cache, save_compile_cache
from slime_train_fsdp.compile_stats import cache_counts, compile_seconds, compiled_frames, compiled_graphs, now_us
from slime_train_fsdp.compile_warmup import start_compile_warm_up
from slime_train_fsdp.hf_export import iter_hf_buckets, save_hf
from slime_train_fsdp.lora import initial_adapter_state, iter_adapter, iter_merged, save_adapter
from slime_train_fsdp.model_loading import (
    build_fsdp_model,
    compiles_layers,
    default_device,
    gathered_through_backward,
    load_hf_weights_into,
    note_precision_flag,
)
from slime_train_fsdp.packing import (
    PackedMicroBatch,
    install_response_forward,
    pack_micro_batch,
    response_log_probs,
    split_by_lengths,
)
from slime_train_fsdp.routing_replay import RoutingReplay, phase_for
from slime_train_fsdp.trainer_parts import (
    Residency,
    all_reduce_sum,
    build_optimizer,
    clip_and_step,
    cp_size,
    reduce_metric_sums,
    resume,
)
from slime_train_fsdp.true_on_policy import check_single_turn, install_mirrored_qwen3
from slime_train_fsdp.vision import frozen_vision_tower, is_vision_language, mrope_position_ids

logger = logging.getLogger(__name__)

__all__ = ["FSDPTrainBackend"]

_MISSING = {
    "ref": "no reference model: init(..., with_ref=True) (--use-kl-loss / --kl-coef)",
    "teacher": "no teacher model: --use-opd --opd-type fsdp --opd-teacher-load DIR",
}


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


class FSDPTrainBackend:
    """FSDP2 training backend (implements `slime_core.protocols.TrainBackend`).

    `cfg` is the frozen run config the backend reads at every call (loss, advantage and step options);
    assigning another validated config (e.g. `backend.cfg = backend.cfg.model_copy(update=...)`) changes
    those options for the following calls. What `init` built from it (model, optimizer, schedule, reference
    weights) stays.

    Example:
        >>> backend = FSDPTrainBackend()
        >>> start_rollout = backend.init(cfg, with_ref=cfg.with_ref)  # doctest: +SKIP
        >>> metrics = backend.train(start_rollout, batch)  # doctest: +SKIP
    """

    #: Started by the trainer rank while the engines start; see `slime_train_fsdp.compile_warmup`.
    start_compile_warm_up = staticmethod(start_compile_warm_up)

    def __init__(self) -> None:
        """Creates an uninitialized backend; call `init`."""
        self.cfg: SlimeArgs | None = None
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.device = torch.device("cpu")
        self.compile_layers_flag: str | None = None  # set by `init` (`TrainBackend.compile_layers_flag`)
        self.global_step = 0
        self.weights = WeightSwap(self._local_params, missing=_MISSING)  # reference / OPD teacher host copies
        self.residency: Residency | None = None  # sleep/wake, made with the optimizer
        self.step_metrics: list[dict[str, float]] = []
        self._mrope = None  # per-sequence 3-D rotary positions of a vision-language model
        self._frozen_vision: frozenset[str] = frozenset()
        self._pushed_once = False
        self.routing: RoutingReplay | None = None  # MoE routing replay hooks (--use-routing-replay)

    # ------------------------------------------------------------------ setup
    def init(self, cfg: SlimeArgs, *, with_ref: bool) -> int:
        """Builds model, optimizer and scheduler, loads `--load` if given (collective).

        Args:
            cfg: the validated run config (fields listed in the package README).
            with_ref: keep reference weights for KL (`--use-kl-loss` or `--kl-coef != 0`).

        Returns:
            The rollout id to start from (`next_rollout_id` of the loaded checkpoint, else
            `--start-rollout-id` or 0).

        Raises:
            ValueError: on invalid flags (e.g. missing `--hf-checkpoint`).
        """
        if not cfg.hf_checkpoint:
            raise ValueError("--hf-checkpoint is required by the FSDP backend")
        if not dist.is_initialized():
            raise ValueError("torch.distributed must be initialized before FSDPTrainBackend.init")
        self.cfg = cfg
        self.device = default_device()
        note_precision_flag(cfg, self.device)
        torch.manual_seed(cfg.seed)
        # An FP8 --hf-checkpoint is only served: the trainer starts from the BF16 --ref-load (slime_core.fp8).
        weights = trainer_weights_dir(cfg.hf_checkpoint, cfg.ref_load)
        self.model, self.config = build_fsdp_model(cfg, weights, self.device, flag=_weights_flag(cfg, weights))
        self.compile_layers_flag = "--fsdp-compile-layers" if compiles_layers(cfg, self.device) else None
        # Read from the file: building the fp32 master model rewrites the config object's dtype to float32.
        self._hf_dtype = source_dtype(weights)
        install_response_forward(self.model)
        if cfg.use_routing_replay:
            text_config = getattr(self.config, "text_config", None) or self.config
            self.routing = RoutingReplay(self.model, int(text_config.num_hidden_layers))
        if cfg.true_on_policy_mode:  # the actor's log-prob forwards replay SGLang's (a critic keeps the HF forward)
            install_mirrored_qwen3(self.model, self.device)
        if with_ref:
            ref_path = cfg.ref_load or cfg.hf_checkpoint
            if str(ref_path) != weights:
                # With LoRA the reference is the ref weights with the zero-update initial adapter (B = 0).
                lora_init = cfg.lora_rank and dist.get_rank() == 0
                adapters = initial_adapter_state(self.model, cfg.seed) if lora_init else None
                flag = "--ref-load" if cfg.ref_load else "--hf-checkpoint"
                load_hf_weights_into(self.model, ref_path, extra=adapters, flag=flag)
                self.weights.hold("ref")
                load_hf_weights_into(self.model, weights, extra=adapters, flag=_weights_flag(cfg, weights))
            else:
                self.weights.hold("ref")
        self._build_optimizer(cfg)
        if trainer_side_teacher(cfg):
            self._load_teacher(cfg)
        return self._load_checkpoint(cfg)

    def _build_optimizer(self, cfg: SlimeArgs) -> None:
        """Freezes the `--*-params-name-list` and frozen-vision-tower parameters, builds AdamW and the LR schedule."""
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.device, self._vision_setup(cfg))
        self.residency = Residency(self.model, self.optimizer, self.device, cpu_offload=cfg.fsdp_cpu_offload,
                                   pin_memory=cfg.offload_train_pin_memory)  # fmt: skip

    def _load_teacher(self, cfg: SlimeArgs) -> None:
        """Holds the CPU shards of the OPD teacher `--opd-teacher-load` (an HF directory or an FSDP checkpoint)."""
        path = pathlib.Path(cfg.opd_teacher_load)

        def load() -> None:
            if (path / TRACKER_FILE).exists() or cfg.opd_teacher_ckpt_step is not None:
                load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                ckpt_step=cfg.opd_teacher_ckpt_step, load_optim=False, load_rng=False)  # fmt: skip
            else:
                load_hf_weights_into(self.model, path, flag="--opd-teacher-load")

        self.weights.capture("teacher", load)
        logger.info("on-policy-distillation teacher loaded from %s", path)

    def _load_checkpoint(self, cfg: SlimeArgs) -> int:
        """Restores `--load` when it holds a checkpoint; returns the rollout id to start from."""
        if cfg.load and compiles_layers(cfg, self.device):
            load_compile_cache(cfg.load)  # before the first forward compiles the layers
        start, self.global_step, loaded = resume(cfg, self.model, self.optimizer, self.scheduler, model_flags_of(cfg))
        if loaded is not None and cfg.ref_update_interval and self.has_ref:
            self._resume_reference(cfg, loaded, start)
        return start

    def _resume_reference(self, cfg: SlimeArgs, iteration_dir: pathlib.Path, start: int) -> None:
        """With `--ref-update-interval` the reference is the actor of the last update: read it from `iteration_dir`.

        It was built from `--ref-load` / `--hf-checkpoint` above, so a resume past an update ran its KL term against
        the initial weights until the next update. A checkpoint saved without the reference says so once.
        """
        reference = saved_reference(iteration_dir)
        if reference is not None:
            self.weights.capture("ref", lambda: load_reference(reference, self.model))
            logger.info("--ref-update-interval: the reference model resumes from %s", reference)
        elif start >= cfg.ref_update_interval:
            logger.warning("%s", no_reference_message(cfg.load, iteration_dir.name, cfg.ref_update_interval))

    def _vision_setup(self, cfg: SlimeArgs) -> set[str]:
        """Rotary positions of a vision-language model, and the tower's names under `--freeze-vision-tower`.

        Raises:
            ValueError: `--freeze-vision-tower` on a model without a vision tower.
        """
        if is_vision_language(self.config):
            self._mrope = functools.partial(mrope_position_ids, self.model.model)
        names = frozen_vision_tower(self.model, cfg)
        self._frozen_vision = frozenset(names)
        return names

    def _pack(self, batch: RolloutBatch, ids: list[int]) -> PackedMicroBatch:
        if self.cfg.true_on_policy_mode:
            check_single_turn(batch.loss_masks, ids)
        return pack_micro_batch(batch.tokens, batch.response_lengths, ids, self.device, batch.kept_tokens(ids),
                                multimodal=batch.multimodal_train_inputs, mrope=self._mrope)  # fmt: skip

    def _routing(self, model: str, *, training: bool):
        """The routers' phase for one pass over the data (a no-op block without routing replay)."""
        if self.routing is None:
            return contextlib.nullcontext()
        phase = phase_for(self.cfg.use_routing_replay, self.cfg.use_rollout_routing_replay, model, training)
        return self.routing.running(phase, count_mismatch=phase == "replay")

    def _require_awake(self, what: str) -> None:
        if self.residency is not None:
            self.residency.require_awake(what)

    @property
    def dp_size(self) -> int:
        """Number of ranks FSDP2 averages gradients over: all trainer ranks (data-parallel × context-parallel)."""
        return dist.get_world_size()

    @property
    def dp_rank(self) -> int:
        """Data-parallel rank: ranks `d·C .. d·C + C-1` form DP group d's context-parallel group (C = cp_size)."""
        return dist.get_rank() // self.cp_size

    @property
    def cp_size(self) -> int:
        """Context-parallel group size (`--context-parallel-size`; 1 without context parallelism)."""
        return cp_size(self.model)

    @property
    def has_ref(self) -> bool:
        """Whether reference weights are held (`init(..., with_ref=True)`)."""
        return self.weights.holds("ref")

    @property
    def has_teacher(self) -> bool:
        """Whether on-policy-distillation teacher weights are held (`--opd-type fsdp` / `megatron`)."""
        return self.weights.holds("teacher")

    def _local_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        # FSDP2 leaves the root's own parameters (embeddings, final norm, head) gathered after a no-grad forward (it
        # reshards the root after backward only): reshard so every rank swaps its shard, not the gathered tensor.
        self.model.reshard()
        return ((n, _local(p)) for n, p in self.model.named_parameters())

    # ------------------------------------------------------------- log-probs
    @torch.no_grad()
    def compute_log_probs(self, batch: RolloutBatch, *, model: str = "actor") -> list[torch.Tensor]:
        """Per-sample response log-probs (collective; same micro-batch schedule on every rank).

        Args:
            batch: this rank's data.
            model: `actor` (current weights), `ref` (reference weights) or `teacher` (OPD teacher weights); the
                latter two are swapped in for the call.

        Returns:
            N tensors `[L_i]` float32 on CPU, natural log, at `--rollout-temperature`.

        Raises:
            ValueError: for `model="ref"` / `"teacher"` without those weights, or an unknown model name.
            RuntimeError: while asleep.
        """
        self._require_awake("compute_log_probs")
        with self.weights.swapped(model), self._routing(model, training=False):
            rows: list[tuple[list[int], list[int], torch.Tensor]] = []
            for step in batch.micro_batches:
                for ids in step:
                    mb = self._pack(batch, ids)
                    if self.routing is not None:
                        self.routing.before_forward(batch, mb)
                    logp, _, _ = response_log_probs(
                        self.model,
                        mb,
                        temperature=self.cfg.rollout_temperature,
                        chunk_size=resolve_chunk_size(self.cfg.log_probs_chunk_size),
                    )
                    if self.routing is not None:
                        self.routing.after_forward(mb)
                    rows.append((mb.sample_ids, mb.response_lengths, logp))  # one copy after the last forward
        return per_sample_on_host(rows, batch.num_samples)

    # ---------------------------------------------------------------- train
    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """The shared RL step on `batch` (`slime_core.train_step.train_on_rollout`; collective).

        Args:
            rollout_id: id of the rollout being trained on.
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
        self._require_awake("train")
        compile_before, caches_before, begun_us = compile_seconds(), cache_counts(), now_us()
        if self.routing is not None:
            self.routing.reset()
        metrics, self.step_metrics = train_on_rollout(self.cfg, self, rollout_id, batch)
        if self.routing is not None:
            metrics.update(self._routing_metrics())
        compiled = compile_seconds() - compile_before
        if compiled > 0:
            graphs = compiled_graphs()
            caches = {k: v - caches_before[k] for k, v in cache_counts().items()}
            logger.info(
                "rollout %d: %.1f s of torch.compile warm-up (%d graphs so far; this step's cache lookups: FX graph "
                "%d hit / %d miss, AOT autograd %d hit / %d miss): %s", rollout_id, compiled, graphs,
                caches["fx_hit"], caches["fx_miss"], caches["aot_hit"], caches["aot_miss"],
                "; ".join(compiled_frames(begun_us)) or "no frame records",
            )  # fmt: skip
            metrics["perf/compile_time"] = compiled
            metrics["perf/compiled_graphs"] = float(graphs)
            metrics["perf/compile_cache_hits"] = float(caches["fx_hit"])
            metrics["perf/compile_cache_misses"] = float(caches["fx_miss"])
        return metrics

    def _routing_metrics(self) -> dict[str, float]:
        """`train/routing_replay_mismatch` of the rollout (collective).

        Over every replayed forward of the rollout on all DP ranks: the fraction of (token, MoE layer) pairs whose
        router's own top-k experts differ (as a set) from the replayed ones.
        """
        sums = self.reduce_metric_sums(
            {"mismatched": float(self.routing.mismatched), "counted": float(self.routing.counted)}
        )
        self.routing.reset()  # the recorded routes are this rollout's only
        return {"train/routing_replay_mismatch": sums["mismatched"] / max(sums["counted"], 1.0)}

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of `tensor` over the data-parallel ranks (each CP group counted once), returned on CPU."""
        return all_reduce_sum(tensor, self.device, self.cp_size)

    def forward_backward(
        self, batch: RolloutBatch, step: int, loss_fn: MicroBatchLoss, *, denominator: float
    ) -> list[dict[str, torch.Tensor]]:
        """Forward + backward of step `step`'s micro-batches (see `slime_core.train_step.StepBackend`).

        An empty micro-batch (this rank has fewer samples) still runs a forward whose zero-valued anchor is
        back-propagated, so FSDP's collectives stay aligned with the ranks that have data.
        """
        self.optimizer.zero_grad(set_to_none=True)
        with gathered_through_backward(self.model), self._routing("actor", training=True):
            return self._forward_backward(batch, step, loss_fn, denominator)

    def _forward_backward(self, batch: RolloutBatch, step: int, loss_fn: MicroBatchLoss, denominator: float):
        metrics = []
        for ids in batch.micro_batches[step]:
            mb = self._pack(batch, ids)
            if self.routing is not None:
                self.routing.before_forward(batch, mb)  # the routes stay set through this micro-batch's backward
            logp, ent, anchor = response_log_probs(
                self.model,
                mb,
                temperature=self.cfg.rollout_temperature,
                chunk_size=resolve_chunk_size(self.cfg.log_probs_chunk_size),
                with_entropy=True,
            )
            if not ids:
                anchor.backward()
                continue
            loss, mb_metrics = loss_fn(
                ids, split_by_lengths(logp, mb.response_lengths), split_by_lengths(ent, mb.response_lengths)
            )
            # FSDP2 averages gradients over ranks: scale by dp_size so they add up (see module docstring).
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

    def reduce_metric_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Metric sums over data-parallel ranks.

        A rank whose micro-batches were all empty has no names, so names are agreed first. The CP ranks of a DP
        group all compute the group's full sums, so the sum over all ranks is divided by `cp_size`.
        """
        return reduce_metric_sums(sums, self.device, self.cp_size)

    def reset_optimizer_states(self) -> None:
        """Drops AdamW's moments and step counts (`--reset-optimizer-states`)."""
        self.optimizer.state.clear()

    def update_ref(self) -> None:
        """Copies the current weights into the reference snapshot (`--ref-update-interval`)."""
        self.weights.hold("ref")

    # ------------------------------------------------------------ checkpoints
    def save(self, rollout_id: int, *, commit: bool = True) -> None:
        """Writes `{--save}/iter_{rollout_id+1:07d}` atomically (collective); see `checkpoint.py`.

        `commit`: name it in the tracker (the resume point); False leaves that to `commit_save`.
        """
        self._require_awake("save")
        save_dir = self.cfg.save
        if not save_dir:
            raise ValueError("save() needs --save")
        save_checkpoint(
            save_dir,
            rollout_id=rollout_id,
            global_step=self.global_step,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            save_optim=not self.cfg.no_save_optim,
            model_flags=model_flags_of(self.cfg),
            # The reference follows the actor: a resume needs it (the initial weights are not it past an update).
            reference=self.weights.swapped("ref") if self.cfg.ref_update_interval and self.has_ref else None,
            commit=commit,
        )
        if compiles_layers(self.cfg, self.device) and dist.get_rank() == 0:
            save_compile_cache(save_dir)

    def commit_save(self, rollout_id: int) -> None:
        """Names the checkpoint `save(rollout_id, commit=False)` wrote in the tracker: the resume point (rank 0)."""
        commit_checkpoint(self.cfg.save, rollout_id)

    def save_hf(self, path: str | pathlib.Path) -> None:
        """Exports an HF checkpoint loadable by `AutoModelForCausalLM.from_pretrained` (collective).

        Vision-language models export every tensor under its checkpoint name (`AutoModelForImageTextToText`).
        With `--lora-rank`, `path` gets the adapter in PEFT's format (`slime_train_fsdp.lora.save_adapter`) and,
        with `--lora-save-merged`, `path/merged` the merged model.
        """
        self._require_awake("save_hf")
        cfg = self.cfg
        if not cfg.lora_rank:
            save_hf(self.model, path, source_dir=cfg.hf_checkpoint)
            return
        save_adapter(self.model, cfg, path)
        if cfg.lora_save_merged:
            merged = iter_merged(self.model, cfg, dtype=self._checkpoint_dtype())
            save_hf(self.model, pathlib.Path(path) / "merged", source_dir=cfg.hf_checkpoint, tensors=merged)

    def _checkpoint_dtype(self) -> torch.dtype | None:
        if self.cfg.true_on_policy_mode and self.device.type == "cuda":
            # The engine must hold exactly the bf16 values this trainer's forward computes with (FSDP's bf16 cast
            # of the fp32 masters), also in the embeddings and norms it keeps in fp32 under the mode.
            return torch.bfloat16
        return self._hf_dtype

    def named_hf_weights(self, bucket_bytes: int | None = None) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Buckets of full tensors under HF names (collective: all ranks must iterate together).

        Args:
            bucket_bytes: bucket budget; `--update-weight-buffer-size` (512 MiB) when None.

        Yields:
            Lists of `(checkpoint name, tensor)` in the checkpoint dtype, on this rank's device; a frozen vision
            tower (`--freeze-vision-tower`) only in the first call; with `--lora-rank`, the adapter's tensors only
            (PEFT names, float32: `slime_train_fsdp.lora.iter_adapter`).
        """
        self._require_awake("named_hf_weights")
        if bucket_bytes is None:
            bucket_bytes = self.cfg.update_weight_buffer_size
        if self.cfg.lora_rank:  # the engines hold the base weights: only the adapter moves
            yield from iter_buckets(iter_adapter(self.model), bucket_bytes)
            return
        skip = self._frozen_vision if self._pushed_once else frozenset()
        yield from iter_hf_buckets(self.model, bucket_bytes, dtype=self._checkpoint_dtype(), skip=skip)
        self._pushed_once = True

    # ----------------------------------------------------------- offloading
    def sleep(self) -> None:
        """Moves parameters, buffers and optimizer states to host memory and frees accelerator memory.

        Gradients are dropped (set to None): a sleep comes after a finished optimizer step. On CUDA the
        host copies go to pinned buffers kept across steps (see `slime_train_fsdp.offload`).
        """
        self.residency.sleep()

    def wake_up(self) -> None:
        """Moves what `sleep` offloaded back to this rank's device (to CPU under `--fsdp-cpu-offload`)."""
        self.residency.wake_up()


def _weights_flag(cfg: SlimeArgs, weights: str) -> str:
    """The flag that named the trainer's initial weights (`--ref-load` only for an FP8 `--hf-checkpoint`)."""
    return "--hf-checkpoint" if str(weights) == str(cfg.hf_checkpoint) else "--ref-load"
