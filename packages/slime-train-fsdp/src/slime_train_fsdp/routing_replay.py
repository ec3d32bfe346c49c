"""MoE routing replay for Hugging Face MoE models (`--use-routing-replay`, `--use-rollout-routing-replay`).

A forward hook on every MoE router (`Qwen3MoeTopKRouter`-style modules whose forward returns
`(router_logits [S, E], combine_weights [S, K], expert_ids [S, K])`) either records the top-k expert ids
(`record`) or replaces them by given ones (`replay`). Under replay the combine weights are recomputed from the
current router logits at the forced experts, as the original's Megatron patch does (`probs = scores.gather(1,
top_indices)` in `slime/utils/routing_replay.py`): softmax over all experts, gathered at the forced ids, and
renormalized over them when the router does (`norm_topk_prob`). The gradient then reaches the router weights through
those gathered probabilities. With forced ids equal to the router's own the result is bitwise the plain forward.

Phases, as the original's `train_actor`: the reference/teacher forwards route freely; with `--use-routing-replay`
the actor's old-log-prob forward records and every training forward replays what it recorded; with
`--use-rollout-routing-replay` every actor forward (old log-probs included) replays the engine's routes.

Routes follow the packing of `slime_train_fsdp.packing.pack_micro_batch`: one row per token of the packed row,
samples concatenated in `mb.sample_ids` order (the dummy row of an empty micro-batch gets a filler route).

Legend: `S` tokens of a packed row, `L` decoder layers, `K` experts per token, `E` experts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from slime_core.routing_replay import find_routers, routes_for_tokens

if TYPE_CHECKING:
    from slime_core.batch import RolloutBatch
    from slime_train_fsdp.packing import PackedMicroBatch

logger = logging.getLogger(__name__)

__all__ = ["Phase", "RoutingReplay", "phase_for"]

Phase = Literal["off", "record", "replay"]


def phase_for(use_routing_replay: bool, use_rollout_routing_replay: bool, model: str, training: bool) -> Phase:
    """What the routers do in one forward pass (the original's `ROUTING_REPLAY_STAGE`).

    Args:
        use_routing_replay: `--use-routing-replay` (set too by `--use-rollout-routing-replay`).
        use_rollout_routing_replay: `--use-rollout-routing-replay`.
        model: which weights run: `actor`, `ref` or `teacher` (the latter two route freely: "fallthrough").
        training: a training forward (else a log-prob forward).
    """
    if not (use_routing_replay or use_rollout_routing_replay) or model != "actor":
        return "off"
    if training or use_rollout_routing_replay:
        return "replay"
    return "record"


class RoutingReplay:
    """The hooks on one model's routers and the routes of the rollout being trained.

    Args:
        model: the (sharded) causal LM; hooks are added to its routers.
        num_layers: `num_hidden_layers` (the middle dimension of a route array).

    Raises:
        ValueError: the model has no MoE router this hook knows.
    """

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        self.routers = find_routers(model)
        if not self.routers:
            raise ValueError(
                f"--use-routing-replay: {type(model).__name__} has no MoE router this backend can replay "
                "(expects model.model.layers[i].mlp.gate with top_k / num_experts, e.g. Qwen3-MoE)"
            )
        self.num_layers = num_layers
        self.topk = int(next(iter(self.routers.values())).top_k)
        self.num_experts = int(next(iter(self.routers.values())).num_experts)
        self.phase: Phase = "off"
        self.recorded: dict[int, torch.Tensor] = {}  # sample position -> [T_i, L, K] int32 (record phase)
        self._row_SLK: torch.Tensor | None = None  # the routes of the packed row being run (replay)
        self._valid_S: torch.Tensor | None = None  # rows that hold a real route (for the mismatch count)
        self._captured: dict[int, torch.Tensor] = {}  # layer -> [S, K] ids of the row being run (record)
        self.count_mismatch = False
        self.mismatched = torch.zeros((), dtype=torch.float64)
        self.counted = torch.zeros((), dtype=torch.float64)
        for layer, router in self.routers.items():
            router.register_forward_hook(self._hook(layer))

    # ------------------------------------------------------------------ rollout
    def reset(self) -> None:
        """Forgets the previous rollout's recorded routes and mismatch counts."""
        self.recorded = {}
        self.mismatched = torch.zeros((), dtype=torch.float64)
        self.counted = torch.zeros((), dtype=torch.float64)

    @contextlib.contextmanager
    def running(self, phase: Phase, *, count_mismatch: bool = False) -> Iterator[None]:
        """Routers run in `phase` inside the block (`off` after it)."""
        self.phase, self.count_mismatch = phase, count_mismatch
        try:
            yield
        finally:
            self.phase, self.count_mismatch = "off", False
            self._row_SLK = self._valid_S = None
            self._captured = {}

    def before_forward(self, batch: RolloutBatch, mb: PackedMicroBatch) -> None:
        """Prepares the routes of packed row `mb` (replay) or an empty capture (record).

        Raises:
            ValueError: a sample without routes to replay (no engine routes in the batch, or none recorded), or
                engine routes this model cannot take (`_checked`).
        """
        if self.phase == "record":
            self._captured = {}
        if self.phase != "replay":
            return
        rows, valid = [], []
        for i, total in zip(mb.sample_ids, mb.seq_lengths, strict=True):
            if batch.rollout_routed_experts is not None:
                rows.append(routes_for_tokens(self._checked(batch, i), total))
                valid.append(torch.arange(total) < total - 1)  # the last token's filler is not the engine's
            elif i in self.recorded:
                rows.append(self.recorded[i].to(torch.int64))
                valid.append(torch.ones(total, dtype=torch.bool))
            else:
                raise ValueError(
                    f"routing replay: sample {batch.sample_indices[i] if batch.sample_indices else i} has no routes "
                    "(--use-routing-replay records them in the old-log-prob forward; --use-rollout-routing-replay "
                    "needs RolloutBatch.rollout_routed_experts)"
                )
        if not rows:  # the one-token dummy row of an empty micro-batch
            rows = [torch.arange(self.topk, dtype=torch.int64).expand(1, self.num_layers, self.topk)]
            valid = [torch.zeros(1, dtype=torch.bool)]
        device = mb.input_ids.device
        self._row_SLK = torch.cat(rows).to(device)
        self._valid_S = torch.cat(valid).to(device)

    def _checked(self, batch: RolloutBatch, i: int) -> torch.Tensor:
        """Engine routes `[T_i - 1, L, K]` of sample position `i`, checked against this model's routers.

        An id outside `[0, E)` or another `K` (an engine serving another preset, a plugin's own routes) reached the
        router's `gather`: an index error naming nothing on CPU, a device-side assert that ends the process on CUDA.

        Raises:
            ValueError: another layer count or top-k, or an expert id outside `[0, num_experts)` (names the sample).
        """
        routes = batch.rollout_routed_experts[i]
        what = f"sample {batch.sample_indices[i] if batch.sample_indices else i}"
        if tuple(routes.shape[1:]) != (self.num_layers, self.topk):
            raise ValueError(
                f"routing replay: {what}: rollout_routed_experts has {routes.shape[1]} layers × top-k "
                f"{routes.shape[2]}, the model {self.num_layers} × {self.topk} (is the engine serving --hf-checkpoint?)"
            )
        if routes.numel():
            low, high = int(routes.min()), int(routes.max())
            if low < 0 or high >= self.num_experts:
                bad = low if low < 0 else high
                raise ValueError(
                    f"routing replay: {what}: rollout_routed_experts holds expert id {bad} outside "
                    f"[0, {self.num_experts}) of the model's routers (is the engine serving --hf-checkpoint?)"
                )
        return routes

    def after_forward(self, mb: PackedMicroBatch) -> None:
        """Record phase: splits the packed row's captured ids into per-sample `[T_i, L, K]` routes."""
        if self.phase != "record" or not mb.sample_ids:
            return
        total = sum(mb.seq_lengths)
        row_SLK = torch.zeros((total, self.num_layers, self.topk), dtype=torch.int32)
        for layer, ids_SK in self._captured.items():
            row_SLK[:, layer] = ids_SK
        for i, part in zip(mb.sample_ids, torch.split(row_SLK, mb.seq_lengths), strict=True):
            self.recorded[i] = part

    # ------------------------------------------------------------------- hooks
    def _hook(self, layer: int):
        def hook(module: nn.Module, args, output):  # noqa: ANN001
            if self.phase == "record":
                self._captured[layer] = output[2].detach().to(device="cpu", dtype=torch.int32)
                return None
            if self.phase != "replay":
                return None
            return self._replay(module, layer, output)

        return hook

    def _replay(self, module: nn.Module, layer: int, output):  # noqa: ANN001
        logits_SE, _weights, natural_SK = output[0], output[1], output[2]
        forced_SK = self._row_SLK[:, layer, :]
        if forced_SK.shape != natural_SK.shape:
            raise RuntimeError(
                f"routing replay: layer {layer} routes {tuple(natural_SK.shape)} tokens × top-k but the replayed "
                f"routes are {tuple(forced_SK.shape)} (packing and routes disagree)"
            )
        # Rows without an engine route (each sample's last token, an empty micro-batch's dummy) keep the router's own
        # choice: a filler there changes no log-prob in exact arithmetic, but it moves a token between experts, and
        # so the row counts of their matmuls, which changed other tokens' last bits on some CPUs.
        forced_SK = torch.where(self._valid_S[:, None], forced_SK.to(natural_SK.dtype), natural_SK)
        # As the router: softmax in fp32 over all experts, then the forced experts' probabilities.
        probs_SK = torch.softmax(logits_SE, dim=-1, dtype=torch.float).gather(1, forced_SK)
        if getattr(module, "norm_topk_prob", False):
            probs_SK = probs_SK / probs_SK.sum(dim=-1, keepdim=True)
        if self.count_mismatch:
            with torch.no_grad():
                differ_S = (natural_SK.sort(dim=-1).values != forced_SK.sort(dim=-1).values).any(dim=-1)
                # Summed on the device: no host sync per layer (read once per rollout).
                self.mismatched = self.mismatched.to(differ_S.device) + (differ_S & self._valid_S).sum().double()
                self.counted = self.counted.to(differ_S.device) + self._valid_S.sum().double()
        return logits_SE, probs_SK.to(logits_SE.dtype), forced_SK
