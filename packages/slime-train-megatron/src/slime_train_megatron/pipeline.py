"""Packed micro-batches through megatron-core's pipeline schedule: the forward both Megatron backends run.

`PipelineRunner.run` packs a step's micro-batches into THD rows (`packing.pack_thd`), feeds them to
`get_forward_backward_func()` (so PP works unchanged) and collects what the caller's loss function returns on the
last stage; the actor reads log-probs from the output, the critic values. Empty schedule slots run a 2-token dummy
so the pipeline's and DDP's collectives stay aligned (kept out of the MoE router losses: `router_gate`). Under
context parallelism each rank holds its zigzag share of the positions (`packing.cp_zigzag_indices`); `gather_cp`
puts per-position outputs back in sequence order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func

from slime_core.algorithms import KeptTokens
from slime_core.batch import RolloutBatch
from slime_core.host_to_device import per_sample_on_host, to_device, to_device_many
from slime_train_megatron.attention import AttentionKind
from slime_train_megatron.packing import PackedBatch, cp_zigzag_indices, pack_thd
from slime_train_megatron.router_gate import RouterLossGate
from slime_train_megatron.settings import MegatronSettings

__all__ = ["DeviceRows", "GatherCP", "MicroBatch", "PipelineRunner"]


class GatherCP(torch.autograd.Function):
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


@dataclasses.dataclass(kw_only=True, slots=True)
class DeviceRows:
    """A packed row's tensors on the accelerator (copied without a host sync: `slime_core.host_to_device`).

    Attributes:
        tokens: `[1, T]` int64.
        position_ids: `[1, T]` int64.
        cu_seqlens: `[N + 1]` int32.
        logit_index: `[R]` int64.
        targets: `[R]` int64.
    """

    tokens: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    logit_index: torch.Tensor
    targets: torch.Tensor

    @classmethod
    def of(cls, packed: PackedBatch, device: torch.device) -> DeviceRows:
        """Copies `packed`'s tensors to `device`: one non-blocking copy per dtype (int64, int32)."""
        p = packed
        tokens, positions, cu, index, targets = to_device_many(
            [p.tokens, p.position_ids, p.cu_seqlens, p.logit_index, p.targets], device
        )
        return cls(tokens=tokens, position_ids=positions, cu_seqlens=cu, logit_index=index, targets=targets)


@dataclasses.dataclass(slots=True)
class MicroBatch:
    """One schedule slot: its samples, their packed row, and the top-p replay sets of their responses."""

    ids: list[int]
    packed: PackedBatch
    dummy: bool  # an empty schedule slot filled with a 2-token sample so collectives stay aligned
    # `packed` on the device, copied when the step's slots are built: a blocking copy in the forward or the loss
    # function would wait for all queued GPU work (there: the whole forward) before the host could go on.
    rows: DeviceRows
    kept: KeptTokens | None = None  # top-p replay sets of the response rows (`RolloutBatch.kept_tokens(ids)`)


class PipelineRunner:
    """Runs a rank's DDP-wrapped `GPTModel` stage over packed micro-batches (collective over the model's groups).

    Args:
        model: the DDP-wrapped model (what the schedule calls).
        module: the unwrapped `GPTModel` (its parameters' device is where inputs go).
        settings: the parallel layout (`--sequence-parallel`, `--context-parallel-size`, ...).
        attention: how attention runs (`"dense"` takes a `[T, T]` mask; the others THD rows).
    """

    def __init__(self, model: Any, module: Any, settings: MegatronSettings, attention: AttentionKind) -> None:
        """Keeps references; builds nothing."""
        self.model, self.module, self.settings, self.attention = model, module, settings, attention
        #: Training forwards of real micro-batches (`run(forward_only=False)`, dummies not counted), which the
        #: router-loss metrics average.
        self.train_micro_batches = 0
        self.router_gate = RouterLossGate(module)

    @property
    def device(self) -> torch.device:
        """Where this rank's parameters (and so the inputs) live."""
        return next(self.module.parameters()).device

    def _pad_multiple(self) -> int:
        s = self.settings
        multiple = s.tensor_model_parallel_size if s.sequence_parallel else 1
        if s.context_parallel_size > 1:
            multiple = max(multiple, 1) * 2 * s.context_parallel_size
        return multiple

    def micro_batches(self, batch: RolloutBatch, step: int) -> list[MicroBatch]:
        """Step `step`'s schedule slots packed as THD rows (a dummy row for an empty slot), with their `rows`."""
        out = []
        device = self.device
        for ids in batch.micro_batches[step]:
            if ids:
                tokens = [batch.tokens[i] for i in ids]
                resp = [batch.response_lengths[i] for i in ids]
                packed = pack_thd(tokens, resp, pad_multiple=self._pad_multiple())
                out.append(MicroBatch(ids, packed, False, DeviceRows.of(packed, device), batch.kept_tokens(ids)))
            else:
                dummy = pack_thd([torch.zeros(2, dtype=torch.long)], [1], pad_multiple=self._pad_multiple())
                out.append(MicroBatch([], dummy, True, DeviceRows.of(dummy, device)))
        return out

    def forward(self, model: Any, mb: MicroBatch) -> torch.Tensor:
        """Runs one packed micro-batch; returns this rank's output (logits `[1, T_local, V/TP]` on the last stage)."""
        p, device = mb.packed, self.device
        rows = mb.rows
        tokens, positions = rows.tokens, rows.position_ids
        cp = self.settings.context_parallel_size
        if cp > 1:
            index = to_device(cp_zigzag_indices(p.cu_seqlens, parallel_state.get_context_parallel_rank(), cp), device)
            tokens, positions = tokens[:, index], positions[:, index]
        if self.attention == "dense":
            # DotProductAttention has no THD kernel: same packing, block-diagonal causal mask (True = masked).
            seg = torch.repeat_interleave(
                torch.arange(len(p.cu_seqlens) - 1), (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).long()
            )
            allowed = (seg[:, None] == seg[None, :]) & torch.ones(len(seg), len(seg), dtype=torch.bool).tril()
            mask = to_device((~allowed)[None, None], device)
            return model(tokens, positions, attention_mask=mask)
        cu = rows.cu_seqlens
        # Samples are padded inside their own segment, so padded and real boundaries coincide. For slime's packed
        # attention the padded copies stay on the host: megatron-core's THD RoPE reads them with `.tolist()` in
        # every layer (a device sync each time on CUDA tensors), and the attention's exact fallback needs them too.
        # Compiled layers run the traceable RoPE (`traceable.packed_rotary_pos_emb`), which reads nothing to the
        # host and needs the boundaries where the frequencies are: the device copies.
        host = self.attention == "packed" and not self.settings.megatron_compile_layers
        padded = p.cu_seqlens if host else cu
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            cu_seqlens_q_padded=padded,
            cu_seqlens_kv_padded=padded,
            max_seqlen_q=p.max_seqlen,
            max_seqlen_kv=p.max_seqlen,
        )
        return model(tokens, positions, attention_mask=None, packed_seq_params=params)

    def gather_cp(self, per_position: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        """`[T_local]` values at this CP rank's positions → `[R]` at the micro-batch's response-predicting positions.

        All-gathers over the CP group (backward keeps this rank's slice) and undoes the zigzag order.
        """
        p, cp = mb.packed, self.settings.context_parallel_size
        device = per_position.device
        group, rank = parallel_state.get_context_parallel_group(), parallel_state.get_context_parallel_rank()
        order = to_device(torch.cat([cp_zigzag_indices(p.cu_seqlens, r, cp) for r in range(cp)]), device)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=device)
        return GatherCP.apply(per_position, group, cp, rank)[inverse[to_device(p.logit_index, device)]]

    def run(self, batch: RolloutBatch, step: int, loss_fn, forward_only: bool) -> list[Any]:
        """Step `step` through megatron-core's schedule; returns the `extra` of each `loss_fn(output, mb)`.

        Args:
            batch: this rank's data.
            step: optimizer step index into `batch.micro_batches`.
            loss_fn: `(output, MicroBatch) -> (loss, extra)` on the last stage; the step's gradient is the sum of its
                losses over the micro-batches and the DP×CP ranks (megatron-core's averaging is undone).
            forward_only: no backward (log-probs, values).

        Returns:
            The extras in schedule order (empty on non-last pipeline stages).
        """
        mbs = self.micro_batches(batch, step)
        it = iter(mbs)
        results: list[Any] = []
        num_real = sum(not mb.dummy for mb in mbs)
        if not forward_only:
            self.train_micro_batches += num_real
        # megatron-core divides each micro-batch loss by the micro-batch count and DDP averages gradients over DP×CP
        # (`calculate_per_token_loss=False`, as the original runs): undone here, so that the caller's losses add up.
        undo_mean = len(mbs) * parallel_state.get_data_parallel_world_size(with_context_parallel=True)

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            self.router_gate.begin_forward(mb.dummy)
            output = self.forward(model, mb)
            if not forward_only:  # a dummy adds no router loss; the real ones' are divided by their own count
                self.router_gate.watch_backward(output, mb.dummy, num_real)

            def loss_func(output_tensor):
                loss, extra = loss_fn(output_tensor, mb)
                results.append(extra)
                # The token count megatron-core divides by: 1, the caller's loss carries its own normalization; made
                # on the device, as `torch.tensor(1, device=...)` would copy from the host and wait for the GPU.
                return loss * undo_mean, torch.ones((), dtype=torch.int, device=loss.device), {}

            return output, loss_func

        try:
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=it,
                model=[self.model],
                num_microbatches=len(mbs),
                seq_length=max(mb.packed.tokens.shape[1] for mb in mbs),
                micro_batch_size=1,
                forward_only=forward_only,
            )
        finally:
            self.router_gate.begin_forward(False)  # a forward outside the schedule is never a dummy's
        return results

    def broadcast_from_last_stage(self, obj: Any) -> Any:
        """`obj` of the last pipeline stage on every stage (identity without PP)."""
        if parallel_state.get_pipeline_model_parallel_world_size() == 1:
            return obj
        group = parallel_state.get_pipeline_model_parallel_group()
        box = [obj]
        dist.broadcast_object_list(box, src=parallel_state.get_pipeline_model_parallel_last_rank(), group=group)
        return box[0]

    def forward_only_per_sample(self, batch: RolloutBatch, read) -> list[torch.Tensor]:
        """Per-sample `[L_i]` float32 CPU tensors of `read(output, mb) -> [R]` over all steps, on every rank.

        Runs in eval mode without grad (the caller's `no_grad`). The values stay on the device until every step has
        run, then come to the host in one copy (a copy per micro-batch waited for its forward before the host could
        queue the next one), and are broadcast from the last stage once.

        Raises:
            ValueError: a sample in no micro-batch of the schedule.
        """
        self.model.eval()
        try:
            pairs: list[tuple[list[int], list[int], torch.Tensor]] = []
            for step in range(batch.num_steps):

                def loss_fn(output, mb):
                    values = read(output, mb)
                    return torch.zeros((), device=values.device), (mb, values.float())

                results = self.run(batch, step, loss_fn, forward_only=True)
                pairs += [(mb.ids, mb.packed.response_lengths, v) for mb, v in results if not mb.dummy]
        finally:
            self.model.train()
        return per_sample_on_host(pairs, batch.num_samples, relay=self.broadcast_from_last_stage)
