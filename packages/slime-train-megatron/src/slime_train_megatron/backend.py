"""`MegatronTrainBackend`: slime's `TrainBackend` on megatron-core (TP/PP/CP/EP, distributed optimizer).

One instance per rank; `torch.distributed` is initialized by the caller (NCCL on GPUs). Parallel groups
come from `MegatronSettings` (`--megatron-args`). Micro-batches are packed THD rows run through
megatron-core's pipeline schedule (`get_forward_backward_func`), so PP works unchanged. `train` is the shared
RL step (`slime_core.train_step.train_on_rollout`); this class supplies its forward/backward, collectives
and optimizer (the `StepBackend` methods).

Loss scaling: the model config sets `calculate_per_token_loss=True`, which makes megatron-core neither
divide by the micro-batch count nor average gradients over data-parallel ranks (they are summed). Each
micro-batch loss (the shared step's `compute_train_loss`, a sum over its samples) is divided by the step's
global sample count (or token count with `--calculate-per-token-loss`); summed over micro-batches and DP
ranks this is the mean over the step's global batch. Under context parallelism every
CP rank computes the full loss from all-gathered log-probs whose backward keeps only the rank's own tokens,
so the DP×CP gradient sum is again exact.

Reference and teacher models: CPU copies of the parameters swapped in for their forwards (slime's
`TensorBackuper`). The on-policy-distillation teacher (`--opd-type megatron`) comes from `--opd-teacher-load`, a
torch_dist checkpoint (`--opd-teacher-ckpt-step`) or an HF directory, with the student's architecture.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func

from slime_convert import ModelArgs
from slime_core.algorithms import KeptTokens
from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.fp8 import trainer_weights_dir
from slime_core.param_filter import frozen_parameter_names
from slime_core.train_step import MicroBatchLoss, train_on_rollout
from slime_core.weight_buckets import iter_buckets
from slime_train_megatron.attention import AttentionKind, attention_kind
from slime_train_megatron.checkpoint import is_megatron_checkpoint, load_checkpoint, save_checkpoint
from slime_train_megatron.hf_export import save_hf
from slime_train_megatron.logprobs import vocab_parallel_log_probs
from slime_train_megatron.lr_schedule import build_lr_scheduler
from slime_train_megatron.model import (
    build_gpt_model,
    build_transformer_config,
    iter_hf_weights,
    load_hf_weights,
    use_transformer_engine,
)
from slime_train_megatron.optimizer_state import reset_adam_moments
from slime_train_megatron.packing import PackedBatch, cp_zigzag_indices, pack_thd
from slime_train_megatron.settings import MegatronSettings
from slime_train_megatron.sleep import offload_to_cpu, reload_from_cpu

logger = logging.getLogger(__name__)

__all__ = ["MegatronTrainBackend"]


class _GatherCP(torch.autograd.Function):
    """All-gather along dim 0 over CP; backward keeps this rank's slice (every rank computes the same loss)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup, size: int, rank: int) -> torch.Tensor:  # noqa: D102
        ctx.rank, ctx.n = rank, x.shape[0]
        out = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(out, x.contiguous(), group=group)
        return torch.cat(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n], None, None, None


@dataclasses.dataclass(slots=True)
class _MicroBatch:
    ids: list[int]
    packed: PackedBatch
    dummy: bool  # an empty schedule slot filled with a 2-token sample so collectives stay aligned
    kept: KeptTokens | None = None  # top-p replay sets of the response rows (`RolloutBatch.kept_tokens(ids)`)


class MegatronTrainBackend:
    """Megatron-core implementation of `slime_core.protocols.TrainBackend`.

    `cfg` is the frozen run config the backend reads at every call (loss, advantage and step options);
    assigning another validated config (e.g. `backend.cfg = backend.cfg.model_copy(update=...)`) changes
    those options for the following calls. What `init` built from it (parallel layout and `settings`,
    model, optimizer, schedule, reference weights) stays.
    """

    def __init__(self) -> None:
        self.cfg: SlimeArgs | None = None
        self.settings: MegatronSettings | None = None
        self.model_args: ModelArgs | None = None
        self.model: Any = None  # DDP-wrapped
        self.module: Any = None  # the GPTModel
        self.optimizer: Any = None
        self.scheduler: Any = None
        self._ref: dict[str, torch.Tensor] | None = None
        self._teacher: dict[str, torch.Tensor] | None = None
        self._asleep = False
        self.attention: AttentionKind = "transformer_engine"
        self._sleep_state: Any = None
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
        self.model_args = ModelArgs.from_hf_dir(cfg.hf_checkpoint)
        s.world_layout(dist.get_world_size())
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=s.tensor_model_parallel_size,
                pipeline_model_parallel_size=s.pipeline_model_parallel_size,
                context_parallel_size=s.context_parallel_size,
                expert_model_parallel_size=s.expert_model_parallel_size,
            )
        cuda = torch.cuda.is_available()
        if cuda:
            tensor_parallel.model_parallel_cuda_manual_seed(s.seed)
        torch.manual_seed(s.seed)
        config = build_transformer_config(self.model_args, s, cpu=not cuda)
        # "packed"/"transformer_engine" take THD rows; "dense" (megatron-core's DotProductAttention) a [T, T] mask.
        self.attention = attention_kind(s, use_transformer_engine(s))
        module = self._build_module(config)
        if cuda:
            module.cuda(torch.cuda.current_device())
        self.module = module
        frozen = frozen_parameter_names([n for n, _ in module.named_parameters()], cfg)
        for name, param in module.named_parameters():
            if name in frozen:
                param.requires_grad_(False)  # before DDP: no grad buffer, and the optimizer skips it
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=s.use_distributed_optimizer
        )
        self.model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=module)
        self._build_optimizer(config)
        return self._load_initial_weights(with_ref)

    def _build_module(self, config: Any) -> Any:
        """This stage's `GPTModel` (the critic overrides it with a value head)."""
        return build_gpt_model(self.model_args, self.settings, config)

    def _build_optimizer(self, config: Any) -> None:
        """The distributed Adam, the LR schedule, and the model-config hooks megatron-core's schedule calls."""
        s = self.settings
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
            params_dtype=config.params_dtype,
            use_distributed_optimizer=s.use_distributed_optimizer,
            optimizer_cpu_offload=s.optimizer_cpu_offload,
            overlap_cpu_optimizer_d2h_h2d=s.overlap_cpu_optimizer_d2h_h2d,
            optimizer_offload_fraction=s.optimizer_offload_fraction,
            use_precision_aware_optimizer=s.use_precision_aware_optimizer,
        )
        self.optimizer = get_megatron_optimizer(opt_config, [self.model])
        self.scheduler = build_lr_scheduler(self.optimizer, s, self.cfg)
        # Sum gradients over DP without megatron's token normalization (see module docstring).
        config.finalize_model_grads_func = lambda models, num_tokens=None, **kw: finalize_model_grads(
            models, None, **kw
        )
        config.grad_scale_func = self.optimizer.scale_loss
        config.no_sync_func = self.model.no_sync

    def _load_initial_weights(self, with_ref: bool) -> int:
        s = self.settings
        if s.ref_load and is_megatron_checkpoint(s.ref_load):
            load_checkpoint(s.ref_load, self.module, None, None, load_rng=False)
        else:
            # An FP8 --hf-checkpoint is only served: HF weights come from the BF16 --ref-load (slime_core.fp8).
            load_hf_weights(self.module, trainer_weights_dir(self.cfg.hf_checkpoint, s.ref_load), self.model_args, s)
        self.optimizer.reload_model_params()  # fp32 main params from the loaded weights
        if with_ref:
            self._ref = self._snapshot()
        if self.cfg.use_opd and self.cfg.opd_type in ("megatron", "fsdp"):
            self._teacher = self._load_teacher()
        return self._resume()

    def _load_teacher(self) -> dict[str, torch.Tensor]:
        """CPU copy of the OPD teacher's parameters (`--opd-teacher-load`); the actor's weights are put back."""
        path = self.cfg.opd_teacher_load
        actor = self._snapshot()
        if is_megatron_checkpoint(path):
            load_checkpoint(path, self.module, None, None, load_rng=False, ckpt_step=self.cfg.opd_teacher_ckpt_step)
        else:
            load_hf_weights(self.module, path, self.model_args, self.settings)
        teacher = self._snapshot()
        self._restore(actor)
        logger.info("on-policy-distillation teacher loaded from %s", path)
        return teacher

    def _resume(self) -> int:
        """Loads `--load` when it is a Megatron checkpoint; returns the rollout id to start from."""
        s = self.settings
        start = 0
        if s.load and is_megatron_checkpoint(s.load):
            rollout_id = load_checkpoint(
                s.load,
                self.module,
                None if (s.no_load_optim or s.finetune) else self.optimizer,
                self.scheduler,
                load_rng=not (s.no_load_rng or s.finetune),
                ckpt_step=s.ckpt_step,
            )
            if s.no_load_optim or s.finetune or rollout_id is None:
                self.optimizer.reload_model_params()
            start = 0 if (rollout_id is None or s.finetune) else rollout_id + 1
        return start

    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().to("cpu", copy=True) for n, p in self.module.named_parameters()}

    @torch.no_grad()
    def _restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        for n, p in self.module.named_parameters():
            p.copy_(snapshot[n], non_blocking=True)

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
        return self._ref is not None

    @property
    def has_teacher(self) -> bool:
        """Whether on-policy-distillation teacher weights are held (`--opd-type megatron`)."""
        return self._teacher is not None

    def _pad_multiple(self) -> int:
        s = self.settings
        multiple = s.tensor_model_parallel_size if s.sequence_parallel else 1
        if s.context_parallel_size > 1:
            multiple = max(multiple, 1) * 2 * s.context_parallel_size
        return multiple

    def _micro_batches(self, batch: RolloutBatch, step: int) -> list[_MicroBatch]:
        out = []
        for ids in batch.micro_batches[step]:
            if ids:
                tokens = [batch.tokens[i] for i in ids]
                resp = [batch.response_lengths[i] for i in ids]
                packed = pack_thd(tokens, resp, pad_multiple=self._pad_multiple())
                out.append(_MicroBatch(ids, packed, False, batch.kept_tokens(ids)))
            else:
                dummy = pack_thd([torch.zeros(2, dtype=torch.long)], [1], pad_multiple=self._pad_multiple())
                out.append(_MicroBatch([], dummy, True))
        return out

    def _forward(self, model: Any, mb: _MicroBatch) -> torch.Tensor:
        """Runs one packed micro-batch; returns this rank's output (logits `[1, T_local, V/TP]` on the last stage)."""
        p, device = mb.packed, self._device
        tokens, positions = p.tokens, p.position_ids
        cp = self.settings.context_parallel_size
        if cp > 1:
            index = cp_zigzag_indices(p.cu_seqlens, parallel_state.get_context_parallel_rank(), cp)
            tokens, positions = tokens[:, index], positions[:, index]
        if self.attention == "dense":
            # DotProductAttention has no THD kernel: same packing, block-diagonal causal mask (True = masked).
            seg = torch.repeat_interleave(
                torch.arange(len(p.cu_seqlens) - 1), (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).long()
            )
            allowed = (seg[:, None] == seg[None, :]) & torch.ones(len(seg), len(seg), dtype=torch.bool).tril()
            mask = (~allowed)[None, None].to(device)
            return model(tokens.to(device), positions.to(device), attention_mask=mask)
        cu = p.cu_seqlens.to(device)
        # Samples are padded inside their own segment, so padded and real boundaries coincide. For slime's packed
        # attention the padded copies stay on the host: megatron-core's THD RoPE reads them with `.tolist()` in
        # every layer (a device sync each time on CUDA tensors), and the attention's exact fallback needs them too.
        padded = p.cu_seqlens if self.attention == "packed" else cu
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            cu_seqlens_q_padded=padded,
            cu_seqlens_kv_padded=padded,
            max_seqlen_q=p.max_seqlen,
            max_seqlen_kv=p.max_seqlen,
        )
        return model(tokens.to(device), positions.to(device), attention_mask=None, packed_seq_params=params)

    def _response_log_probs(self, logits: torch.Tensor, mb: _MicroBatch, with_entropy: bool):
        """Response-token log-probs (and entropy) `[R]` of a micro-batch from this rank's logits."""
        p = mb.packed
        logits = logits[0]  # [T_local, V/TP]
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        v_local = logits.shape[-1]
        device = logits.device
        cp = self.settings.context_parallel_size
        kept = None if mb.kept is None else mb.kept.to(device)
        if cp == 1:
            rows, targets = p.logit_index.to(device), p.targets.to(device)
        else:
            # Each CP rank scores all next-token targets at its own positions; gather them, then pick responses.
            index = cp_zigzag_indices(p.cu_seqlens, parallel_state.get_context_parallel_rank(), cp)
            nxt = torch.cat([p.tokens[0, 1:], p.tokens[0, :1]])[index]
            rows, targets = torch.arange(index.numel(), device=device), nxt.to(device)
            if kept is not None:  # the sets follow the positions: response row of each local position, else none
                response_row = torch.full((p.tokens.shape[1],), -1, dtype=torch.long)
                response_row[p.logit_index] = torch.arange(p.logit_index.numel())
                kept = kept.select_rows(response_row[index].to(device))
        lp, ent = vocab_parallel_log_probs(
            logits[rows],
            targets,
            temperature=self.cfg.rollout_temperature,
            vocab_start=tp_rank * v_local,
            vocab_size=self.model_args.vocab_size,
            group=parallel_state.get_tensor_model_parallel_group(),
            with_entropy=with_entropy,
            kept=kept,
        )
        if cp > 1:
            group, rank = parallel_state.get_context_parallel_group(), parallel_state.get_context_parallel_rank()
            order = torch.cat([cp_zigzag_indices(p.cu_seqlens, r, cp) for r in range(cp)]).to(device)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel(), device=device)
            pick = inverse[p.logit_index.to(device)]
            lp = _GatherCP.apply(lp, group, cp, rank)[pick]
            ent = None if ent is None else _GatherCP.apply(ent, group, cp, rank)[pick]
        return lp, ent

    def _run(self, batch: RolloutBatch, step: int, loss_fn, forward_only: bool) -> list[Any]:
        mbs = self._micro_batches(batch, step)
        it = iter(mbs)
        results: list[Any] = []

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            output = self._forward(model, mb)

            def loss_func(output_tensor):
                loss, extra = loss_fn(output_tensor, mb)
                results.append(extra)
                return loss, torch.tensor(1, dtype=torch.int, device=loss.device), {}

            return output, loss_func

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=it,
            model=[self.model],
            num_microbatches=len(mbs),
            seq_length=max(mb.packed.tokens.shape[1] for mb in mbs),
            micro_batch_size=1,
            forward_only=forward_only,
        )
        return results  # empty on non-last pipeline stages

    def _broadcast_from_last_stage(self, obj: Any) -> Any:
        if parallel_state.get_pipeline_model_parallel_world_size() == 1:
            return obj
        group = parallel_state.get_pipeline_model_parallel_group()
        box = [obj]
        dist.broadcast_object_list(box, src=parallel_state.get_pipeline_model_parallel_last_rank(), group=group)
        return box[0]

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
        others = {"ref": self._ref, "teacher": self._teacher}
        if model != "actor" and model not in others:
            raise ValueError(f"model must be 'actor', 'ref' or 'teacher', got {model!r}")
        if model == "ref" and self._ref is None:
            raise ValueError("no reference model: init(..., with_ref=True) (--use-kl-loss / --kl-coef)")
        if model == "teacher" and self._teacher is None:
            raise ValueError("no teacher model: --use-opd --opd-type megatron --opd-teacher-load DIR")
        backup = None
        if model != "actor":
            backup = self._snapshot()
            self._restore(others[model])
        self.model.eval()
        try:
            out: dict[int, torch.Tensor] = {}
            for step in range(batch.num_steps):

                def loss_fn(logits, mb):
                    lp, _ = self._response_log_probs(logits, mb, with_entropy=False)
                    return torch.zeros((), device=lp.device), (mb, lp.float().cpu())

                results = self._run(batch, step, loss_fn, forward_only=True)
                pairs = [(mb.ids, mb.packed.response_lengths, lp) for mb, lp in results if not mb.dummy]
                for ids, lens, lp in self._broadcast_from_last_stage(pairs):
                    for i, piece in zip(ids, lp.split(lens), strict=True):
                        out[i] = piece
        finally:
            self.model.train()
            if backup is not None:
                self._restore(backup)
        missing = [i for i in range(batch.num_samples) if i not in out]
        if missing:
            raise ValueError(f"samples {missing[:5]} are in no micro-batch of the schedule")
        return [out[i] for i in range(batch.num_samples)]

    # ---------------------------------------------------------------- train
    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """The shared RL step on `batch` (`slime_core.train_step.train_on_rollout`; collective).

        Returns:
            `train/*` metric means over steps (global-batch normalized), `train/grad_norm`, `train/lr`; the
            per-step values are kept in `self.step_metrics`.

        Raises:
            RuntimeError: called while asleep.
            ValueError: `--use-rollout-logprobs` without rollout log-probs, or missing step counts.
        """
        if self._asleep:
            raise RuntimeError("train() called while asleep; call wake_up() first")
        metrics, self.step_metrics = train_on_rollout(self.cfg, self, rollout_id, batch)
        return metrics

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of `tensor` over the data-parallel group, returned on CPU."""
        reduced = tensor.to(self._device)
        dist.all_reduce(reduced, group=parallel_state.get_data_parallel_group())
        return reduced.cpu()

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
        return [m for m in self._run(batch, step, mb_loss, forward_only=False) if m]

    def optimizer_step(self) -> tuple[float, float]:
        """Steps the megatron optimizer (it clips) and the LR schedule; returns (grad norm, this step's rate)."""
        _, grad_norm, _ = self.optimizer.step()
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.scheduler.step(increment=1)
        self.global_step += 1
        return (float(grad_norm) if grad_norm is not None else float("nan")), lr

    def reduce_metric_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Sums over DP on the last pipeline stage (the only one with losses), then broadcasts to every stage."""
        names = sorted(sums)
        # All DP ranks run the same loss (same options), so they report the same metric names.
        vec = torch.tensor([sums[k] for k in names], dtype=torch.float64, device=self._device)
        if names and parallel_state.is_pipeline_last_stage():
            dist.all_reduce(vec, group=parallel_state.get_data_parallel_group())
        return self._broadcast_from_last_stage(dict(zip(names, vec.tolist(), strict=True)))

    def reset_optimizer_states(self) -> None:
        """Zeroes the Adam moments and step counts (`--reset-optimizer-states`)."""
        reset_adam_moments(self.optimizer)

    def update_ref(self) -> None:
        """Copies the current weights into the reference snapshot (`--ref-update-interval`)."""
        self._ref = self._snapshot()

    # ---------------------------------------------------------------- checkpoints and weights
    def save(self, rollout_id: int) -> None:
        """Writes `<--save>/iter_{rollout_id:07d}` (model, optimizer, scheduler, RNG) atomically.

        Raises:
            ValueError: no `--save`.
        """
        if not self.settings.save:
            raise ValueError("save() needs --save")
        save_checkpoint(self.settings.save, rollout_id, self.module, self.optimizer, self.scheduler)

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
        if self._asleep:
            raise RuntimeError("save_hf() called while asleep; call wake_up() first")
        save_hf(iter_hf_weights(self.module, self.model_args), path, source_dir=self.cfg.hf_checkpoint)

    def sleep(self) -> None:
        """Moves parameters, gradient buffers and optimizer state to CPU and frees accelerator memory."""
        if self._asleep:
            return
        self._sleep_state = offload_to_cpu(self.model, self.optimizer)
        self._asleep = True

    def wake_up(self) -> None:
        """Restores what `sleep` moved out."""
        if not self._asleep:
            return
        reload_from_cpu(self._sleep_state)
        self._sleep_state = None
        self._asleep = False
