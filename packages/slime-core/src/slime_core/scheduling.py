"""Micro-batch packing and data-parallel scheduling of one rollout ("pack first, distribute second").

Pure Python/NumPy: no torch, no collectives. `build_schedule` turns per-sample lengths and rollout
ids into, for every DP rank, a list of optimizer steps, each a list of micro-batches of global
sample positions:

1. Group positions by rollout id (first-occurrence order). `num_steps = num_rollouts //
   global_batch_size`; each step takes the next `global_batch_size` rollouts, trailing rollouts are
   dropped (with a warning).
2. Per step, pack the step's samples into micro-batches: `--use-dynamic-batch-size` packs by a
   token budget (`--max-tokens-per-gpu` x context-parallel size): first-fit decreasing finds the fewest
   micro-batches, then the tokens are spread evenly over that many (`balance_token_bins`, as the
   original's balanced partition after its minimum micro-batch count; `--balance-by-flops` evens out the
   estimated cost instead, `balance_cost_bins`); otherwise fixed chunks of `--micro-batch-size` samples.
3. Round the micro-batch count up to a multiple of the DP size by splitting the costliest bins (or
   adding empty ones when no bin can be split), so that every rank runs the same number of
   micro-batches (the ranks step their optimizers and collectives in lock-step).
4. Assign micro-batches to ranks: with `--balance-data`, an equal-cardinality Karmarkar-Karp
   partition on the estimated cost (`sequence_cost`); otherwise strided round robin.

Cost model: the forward/backward FLOPs of a packed variable-length sequence of `s` tokens is about
`a*s + b*s^2` per layer: the dense matmuls cost ~`24*h^2` FLOPs per token and causal attention
(QK^T and AV with varlen kernels) ~`4*h*s` per token, so relative to the linear term the quadratic
coefficient is `4h / 24h^2 = 1/(6h)`. `sequence_cost(s) = s + attn_coef * s^2` with the default
`attn_coef = 1/(6*4096)` (hidden size 4096); only the ratio matters for balancing.

Example:
    >>> sched = build_schedule([5, 3, 9, 2], [0, 1, 2, 3], dp_size=2, global_batch_size=4,
    ...     use_dynamic_batch_size=True, max_tokens_per_gpu=10)
    >>> sched.num_steps, [len(r[0]) for r in sched.rank_micro_batches]
    (1, [1, 1])
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
from collections.abc import Hashable, Sequence

__all__ = [
    "DEFAULT_ATTN_COEF",
    "RESPONSE_LENGTH_HINT",
    "Schedule",
    "assign_to_ranks",
    "balance_cost_bins",
    "balance_token_bins",
    "build_schedule",
    "chunk_fixed",
    "equalize_bin_count",
    "group_by_rollout",
    "karmarkar_karp",
    "pack_by_tokens",
    "sequence_cost",
]

logger = logging.getLogger(__name__)

DEFAULT_ATTN_COEF = 1.0 / (6 * 4096)
"""Quadratic (attention) cost coefficient relative to the per-token linear cost: `1/(6*hidden_size)`."""


def sequence_cost(length: int, attn_coef: float = DEFAULT_ATTN_COEF) -> float:
    """Estimated relative training cost of one packed sequence: `length + attn_coef * length**2`.

    Args:
        length: total tokens of the sequence (prompt + response).
        attn_coef: quadratic coefficient, see the module docstring.
    """
    return float(length) + attn_coef * float(length) ** 2


def group_by_rollout(rollout_ids: Sequence[Hashable]) -> list[list[int]]:
    """Groups sample positions by rollout id in first-occurrence order.

    Args:
        rollout_ids: one id per sample position (any hashable, all must be non-None).

    Returns:
        One list of positions per distinct rollout id, each in increasing position order.
    """
    groups: dict[Hashable, list[int]] = {}
    for pos, rid in enumerate(rollout_ids):
        groups.setdefault(rid, []).append(pos)
    return list(groups.values())


def pack_by_tokens(positions: Sequence[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of samples under a token budget.

    Samples are visited longest first (ties by position) and put into the first open bin with room.
    A sample longer than `max_tokens` gets a bin of its own that nothing else joins.

    Args:
        positions: the sample positions to pack.
        lengths: token count of every position (indexed by position, not by order in `positions`).
        max_tokens: bin capacity in tokens (`--max-tokens-per-gpu` x CP size).

    Returns:
        Bins (lists of positions, each sorted ascending), in creation order.

    Raises:
        ValueError: if `max_tokens` is not positive.
    """
    if max_tokens <= 0:
        raise ValueError(f"--max-tokens-per-gpu must be positive, got {max_tokens}")
    order = sorted(positions, key=lambda p: (-lengths[p], p))
    bins: list[list[int]] = []
    loads: list[int] = []
    for pos in order:
        n = lengths[pos]
        if n > max_tokens:
            bins.append([pos])
            loads.append(max_tokens + 1)  # marks the bin full
            continue
        for b, load in enumerate(loads):
            if load + n <= max_tokens:
                bins[b].append(pos)
                loads[b] += n
                break
        else:
            bins.append([pos])
            loads.append(n)
    return [sorted(b) for b in bins]


def balance_token_bins(bins: list[list[int]], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Spreads the samples of `bins` evenly over the same number of bins, each within `max_tokens`.

    First-fit decreasing fills bins to the budget and leaves a small last one. A small tail costs
    twice: its kernels fill the GPU worse, and a compiled model sees a much shorter micro-batch (a new
    shape-dependent code path, issue 26). Longest-processing-time order: samples longest first (ties by
    position), each into the emptiest bin it fits. Samples longer than `max_tokens` keep a bin of their
    own. If the spread does not fit the budget (possible in rare cases), `bins` is returned unchanged.

    Args:
        bins: micro-batches of positions, e.g. from `pack_by_tokens`.
        lengths: token count of every position (indexed by position).
        max_tokens: the token budget per bin.

    Returns:
        As many bins as `bins`, each sorted ascending, ordered by decreasing token count (ties by first
        position).
    """
    # Cost = tokens: the cheapest bin with room is the emptiest (if it has none, no bin has).
    return balance_cost_bins(bins, lengths, lengths, max_tokens)


def balance_cost_bins(
    bins: list[list[int]], lengths: Sequence[int], costs: Sequence[float], max_tokens: int
) -> list[list[int]]:
    """Spreads the samples of `bins` over the same number of bins by estimated cost, each within `max_tokens`.

    `--balance-by-flops`: where `balance_token_bins` evens out the token counts, this evens out the estimated
    FLOPs (`sequence_cost`: a long sample costs more than its tokens, attention being quadratic), so the
    micro-batches of a step take about the same time. Longest-processing-time order: samples costliest first
    (ties by position), each into the cheapest bin that still has room for its tokens. The bin count stays the
    first-fit-decreasing one and the token budget holds, unlike the original's `--balance-by-flops`, which
    partitions into `ceil(tokens / budget)` bins by FLOPs alone and may exceed the budget (its help says so).
    Samples longer than `max_tokens` keep a bin of their own; if some sample fits no bin, `bins` is returned
    unchanged.

    Args:
        bins: micro-batches of positions, e.g. from `pack_by_tokens`.
        lengths: token count of every position (indexed by position).
        costs: estimated cost of every position (`sequence_cost`, indexed by position).
        max_tokens: the token budget per bin.

    Returns:
        As many bins as `bins`, each sorted ascending, ordered by decreasing cost (ties by first position).
    """
    positions = [p for b in bins for p in b]
    alone = [[p] for p in positions if lengths[p] > max_tokens]
    rest = sorted((p for p in positions if lengths[p] <= max_tokens), key=lambda p: (-costs[p], p))
    k = len(bins) - len(alone)
    if k <= 0 or not rest:
        return bins
    out: list[list[int]] = [[] for _ in range(k)]
    loads = [0.0] * k  # estimated cost per bin
    tokens = [0] * k
    for pos in rest:
        room = [i for i in range(k) if tokens[i] + lengths[pos] <= max_tokens]
        if not room:
            return bins
        i = min(room, key=lambda j: (loads[j], j))
        out[i].append(pos)
        loads[i] += costs[pos]
        tokens[i] += lengths[pos]
    result = [sorted(b) for b in out if b] + alone
    result.sort(key=lambda b: (-sum(costs[p] for p in b), b[0]))
    return result


def chunk_fixed(positions: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Static micro-batches: consecutive chunks of `micro_batch_size` positions (the last may be shorter).

    Raises:
        ValueError: if `micro_batch_size` is not positive.
    """
    if micro_batch_size <= 0:
        raise ValueError(f"--micro-batch-size must be positive, got {micro_batch_size}")
    positions = list(positions)
    return [positions[i : i + micro_batch_size] for i in range(0, len(positions), micro_batch_size)]


def _split_bin(bin_: list[int], costs: Sequence[float]) -> tuple[list[int], list[int]]:
    """Splits a bin in two with greedy longest-first balancing; both halves are non-empty for >= 2 items."""
    halves: tuple[list[int], list[int]] = ([], [])
    loads = [0.0, 0.0]
    for pos in sorted(bin_, key=lambda p: (-costs[p], p)):
        # Put into the lighter half; on a tie, the emptier one so two equal items never share a half.
        k = min((0, 1), key=lambda i: (loads[i], len(halves[i]), i))
        halves[k].append(pos)
        loads[k] += costs[pos]
    return sorted(halves[0]), sorted(halves[1])


def equalize_bin_count(bins: list[list[int]], costs: Sequence[float], multiple: int) -> list[list[int]]:
    """Rounds the number of micro-batches up to a multiple of `multiple`.

    Repeatedly splits the costliest bin that holds at least two samples (splitting never breaks a
    token budget); when every bin holds one sample, appends empty bins instead. The result has at
    least `multiple` bins.

    Args:
        bins: micro-batches of positions.
        costs: cost per position (`sequence_cost`).
        multiple: the DP size.

    Returns:
        A new list of bins whose length is a positive multiple of `multiple`.
    """
    out = [list(b) for b in bins]
    target = max(multiple, -(-len(out) // multiple) * multiple)
    while len(out) < target:
        splittable = [i for i, b in enumerate(out) if len(b) >= 2]
        if not splittable:
            out.extend([] for _ in range(target - len(out)))
            break
        i = max(splittable, key=lambda j: (sum(costs[p] for p in out[j]), -j))
        first, second = _split_bin(out[i], costs)
        out[i] = first
        out.insert(i + 1, second)
    return out


def karmarkar_karp(weights: Sequence[float], num_parts: int) -> list[list[int]]:
    """Equal-cardinality multi-way Karmarkar-Karp (largest differencing method) partition.

    `len(weights)` must be a multiple of `num_parts`; every part receives the same number of items.
    Items are sorted and cut into consecutive slices of `num_parts`; each slice seeds a partial
    solution with one item per part. The two partial solutions with the largest spread (max - min
    part sum) are merged repeatedly, pairing the heaviest part of one with the lightest of the other.
    Reference: Karmarkar & Karp, "The differencing method of set partitioning" (1982); the
    multi-way generalisation follows Korf, "Multi-way number partitioning" (IJCAI 2009).

    Args:
        weights: one non-negative weight per item.
        num_parts: number of parts (DP ranks).

    Returns:
        `num_parts` lists of item indices, each sorted ascending, ordered by decreasing part sum
        (ties broken by smallest first item, so the result is deterministic).

    Raises:
        ValueError: if `num_parts < 1` or the item count is not a multiple of `num_parts`.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    if len(weights) % num_parts:
        raise ValueError(f"{len(weights)} items cannot be split into {num_parts} equal-size parts")
    if not weights:
        return [[] for _ in range(num_parts)]
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    # heap entries: (-spread, tiebreak, parts) with parts = list of (sum, items), sorted by sum desc.
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for seq, start in enumerate(range(0, len(order), num_parts)):
        parts = [(float(weights[i]), [i]) for i in order[start : start + num_parts]]
        parts.sort(key=lambda p: (-p[0], p[1]))
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), seq, parts))
    seq = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # a is sorted heaviest first; pair it with b lightest first.
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b), strict=True)]
        merged.sort(key=lambda p: (-p[0], min(p[1])))
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), seq, merged))
        seq += 1
    parts = heap[0][2]
    return [sorted(items) for _, items in parts]


def assign_to_ranks(bin_costs: Sequence[float], dp_size: int, *, balance: bool) -> list[list[int]]:
    """Assigns micro-batches to DP ranks, the same number per rank.

    Args:
        bin_costs: estimated cost of each micro-batch; the count must be a multiple of `dp_size`.
        dp_size: number of data-parallel ranks.
        balance: Karmarkar-Karp on cost (`--balance-data`) if True, else strided round robin
            (rank r gets micro-batches r, r + dp_size, ...).

    Returns:
        Per rank, the micro-batch ids in increasing order.
    """
    if len(bin_costs) % dp_size:
        raise ValueError(f"{len(bin_costs)} micro-batches cannot be split evenly over {dp_size} DP ranks")
    if not balance:
        return [list(range(r, len(bin_costs), dp_size)) for r in range(dp_size)]
    return karmarkar_karp(bin_costs, dp_size)


_warned_over_budget = False


#: What bounds a sample's length, as the over-budget warning suggests it: generated responses by default.
RESPONSE_LENGTH_HINT = "lower --rollout-max-response-len"


def _warn_over_budget(lengths: Sequence[int], dropped: Sequence[int], budget: int, length_hint: str) -> None:
    """Warns (once per process) that samples longer than the token budget get a micro-batch of their own.

    Such a micro-batch exceeds `--max-tokens-per-gpu` (as in the original, whose packing does the same): the memory
    the flag bounds is exceeded there, which a run tuned to the budget may not survive.
    """
    global _warned_over_budget
    skip = set(dropped)
    over = [n for p, n in enumerate(lengths) if n > budget and p not in skip]
    if not over or _warned_over_budget:
        return
    _warned_over_budget = True
    logger.warning(
        "%d samples are longer than --max-tokens-per-gpu x context-parallel size = %d tokens (the longest has %d): "
        "each is a micro-batch of its own, over the budget (raise --max-tokens-per-gpu or %s to stay within it)",
        len(over),
        budget,
        max(over),
        length_hint,
    )


@dataclasses.dataclass(kw_only=True, slots=True)
class Schedule:
    """The micro-batch schedule of one rollout.

    Attributes:
        rank_micro_batches: `[dp_rank][step][mb]` -> list of global sample positions. Every rank has
            the same number of steps and, per step, the same number of micro-batches (some may be empty).
        step_positions: per step, all global positions trained in that step (sorted).
        dropped_positions: positions in trailing rollouts that did not fill a whole step.
    """

    rank_micro_batches: list[list[list[list[int]]]]
    step_positions: list[list[int]]
    dropped_positions: list[int]

    @property
    def num_steps(self) -> int:
        """Number of optimizer steps."""
        return len(self.step_positions)


def build_schedule(
    lengths: Sequence[int],
    rollout_ids: Sequence[Hashable],
    *,
    dp_size: int,
    global_batch_size: int,
    use_dynamic_batch_size: bool,
    max_tokens_per_gpu: int | None = None,
    micro_batch_size: int = 1,
    balance_data: bool = False,
    balance_by_flops: bool = False,
    cp_size: int = 1,
    attn_coef: float = DEFAULT_ATTN_COEF,
    length_hint: str = RESPONSE_LENGTH_HINT,
) -> Schedule:
    """Builds the per-rank, per-step micro-batch schedule (see the module docstring).

    Args:
        lengths: total tokens (prompt + response) per sample position.
        rollout_ids: rollout id per position (non-None); samples of one rollout stay in one step.
        dp_size: number of data-parallel ranks.
        global_batch_size: rollouts per optimizer step (`--global-batch-size`).
        use_dynamic_batch_size: pack by token budget (`--use-dynamic-batch-size`).
        max_tokens_per_gpu: token budget per micro-batch per GPU (`--max-tokens-per-gpu`); required
            with dynamic batch size.
        micro_batch_size: samples per static micro-batch (`--micro-batch-size`).
        balance_data: balance micro-batches over ranks by estimated cost (`--balance-data`).
        balance_by_flops: with dynamic batch size, even out the micro-batches' estimated cost instead of their
            token counts (`--balance-by-flops`, `balance_cost_bins`).
        cp_size: context-parallel size; a micro-batch is split over CP ranks, so its budget is
            `max_tokens_per_gpu * cp_size`.
        attn_coef: quadratic coefficient of `sequence_cost`.
        length_hint: how to keep samples shorter, as the warning about samples over the token budget suggests it
            (an SFT run's conversations are bounded by its data's length limit, not by a response length).

    Returns:
        The `Schedule`.

    Raises:
        ValueError: on mismatched inputs, a non-positive size, a missing `--max-tokens-per-gpu`, or
            fewer rollouts than `--global-batch-size`.
    """
    if len(lengths) != len(rollout_ids):
        raise ValueError(f"{len(lengths)} lengths but {len(rollout_ids)} rollout ids")
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if global_batch_size < 1:
        raise ValueError(f"--global-batch-size must be >= 1, got {global_batch_size}")
    if use_dynamic_batch_size and max_tokens_per_gpu is None:
        raise ValueError("--use-dynamic-batch-size requires --max-tokens-per-gpu")

    groups = group_by_rollout(rollout_ids)
    num_steps = len(groups) // global_batch_size
    if num_steps < 1:
        raise ValueError(
            f"the rollout has {len(groups)} rollouts ({len(lengths)} samples) but --global-batch-size is "
            f"{global_batch_size}: at least one full optimizer step is required; lower --global-batch-size "
            "or raise --rollout-batch-size / --n-samples-per-prompt"
        )
    dropped = sorted(p for g in groups[num_steps * global_batch_size :] for p in g)
    if dropped:
        logger.warning(
            "%d trailing rollouts (%d samples) do not fill an optimizer step of %d rollouts and are dropped",
            len(groups) - num_steps * global_batch_size,
            len(dropped),
            global_batch_size,
        )

    if use_dynamic_batch_size:
        assert max_tokens_per_gpu is not None
        _warn_over_budget(lengths, dropped, max_tokens_per_gpu * cp_size, length_hint)
    costs = [sequence_cost(n, attn_coef) for n in lengths]
    rank_mbs: list[list[list[list[int]]]] = [[] for _ in range(dp_size)]
    step_positions: list[list[int]] = []
    for step in range(num_steps):
        positions = sorted(p for g in groups[step * global_batch_size : (step + 1) * global_batch_size] for p in g)
        step_positions.append(positions)
        if use_dynamic_batch_size:
            assert max_tokens_per_gpu is not None
            budget = max_tokens_per_gpu * cp_size
            bins = pack_by_tokens(positions, lengths, budget)
            if balance_by_flops:
                bins = balance_cost_bins(bins, lengths, costs, budget)
            else:
                bins = balance_token_bins(bins, lengths, budget)
        else:
            bins = chunk_fixed(positions, micro_batch_size)
        bins = equalize_bin_count(bins, costs, dp_size)
        bin_costs = [sum(costs[p] for p in b) for b in bins]
        for rank, ids in enumerate(assign_to_ranks(bin_costs, dp_size, balance=balance_data)):
            rank_mbs[rank].append([bins[i] for i in ids])
    return Schedule(rank_micro_batches=rank_mbs, step_positions=step_positions, dropped_positions=dropped)
