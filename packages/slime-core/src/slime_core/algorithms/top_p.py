"""Top-p replay: per-position token sets the engine sampled from, and the log-softmax restricted to them.

With `--rollout-top-p < 1` the engine samples position t from the nucleus `K_t` (the smallest set of most
likely tokens whose mass reaches top-p) and its log-probs are renormalized over `K_t`. To train on the same
distribution, the trainer replays `K_t` (returned by the engine as ragged `token_ids` + `offsets`, the original
slime's `rollout_top_p_token_ids` / `rollout_top_p_token_offsets`) and computes

    log p_t = z_t[y_t] - logsumexp_{v ∈ K_t ∪ {y_t}} z_t[v]

The sampled token `y_t` is always counted (once), even when the engine's nucleus and the trainer disagree at
the boundary: the original does the same (`log_prob_keep_mask` with the target force-kept), so neither side
ever sees a `-inf` log-prob. An empty `K_t` (a tool token appended without a nucleus) leaves only `y_t`:
`log p_t = 0`. The entropy is not restricted (as in the original, it stays a property of the full softmax).

The sets are stored sparsely (`KeptTokens`: one `(row, token id)` pair per kept token), never as a `[T, V]`
mask: a nucleus has a handful to a few thousand tokens, the vocabulary 150 k.

Legend: `R` = rows (response positions), `V` = vocabulary, `K` = total kept tokens over all rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from slime_core.host_to_device import to_device_many
from slime_core.sample import validate_top_p_offsets

__all__ = ["KeptTokens", "restricted_logsumexp", "validate_top_p_offsets"]


@dataclasses.dataclass(frozen=True, slots=True)
class KeptTokens:
    """Sparse per-row token sets: kept token `k` is `ids[k]` at row `rows[k]` (rows ascending).

    Example:
        >>> kept = KeptTokens.from_offsets([[5, 7, 9]], [[0, 2, 2, 3]])  # rows: {5, 7}, {}, {9}
        >>> kept.rows.tolist(), kept.ids.tolist(), kept.num_rows
        ([0, 0, 2], [5, 7, 9], 3)

    Attributes:
        rows: `[K]` int64 row of each kept token, non-decreasing.
        ids: `[K]` int64 token id of each kept token.
        num_rows: `R`, the number of rows the sets belong to (rows may have empty sets).
        host_rows: `rows` on the host when `rows` lives on an accelerator (kept by `to`), else None: `slice_rows`
            searches it, so slicing per log-prob chunk reads nothing back from the device.
    """

    rows: torch.Tensor
    ids: torch.Tensor
    num_rows: int
    host_rows: torch.Tensor | None = None

    @classmethod
    def from_offsets(
        cls, token_ids: Sequence[Sequence[int] | torch.Tensor], offsets: Sequence[Sequence[int] | torch.Tensor]
    ):
        """Concatenates samples' ragged sets; sample j's rows follow sample j-1's (its response positions).

        Args:
            token_ids: per sample, `[K_j]` kept ids (list or tensor).
            offsets: per sample, `[L_j + 1]` offsets into `token_ids[j]`.

        Returns:
            The sets of all `Σ L_j` rows.
        """
        rows, ids, base = [], [], 0
        for tok, off in zip(token_ids, offsets, strict=True):
            off_t = torch.as_tensor(off, dtype=torch.int64).reshape(-1)
            counts = off_t[1:] - off_t[:-1]  # [L_j] kept tokens per position
            rows.append(torch.repeat_interleave(torch.arange(base, base + counts.numel()), counts))
            ids.append(torch.as_tensor(tok, dtype=torch.int64).reshape(-1))
            base += int(counts.numel())
        empty = torch.zeros(0, dtype=torch.int64)
        return cls(rows=torch.cat([empty, *rows]), ids=torch.cat([empty, *ids]), num_rows=base)

    def to(self, device: torch.device | str) -> KeptTokens:
        """The same sets on `device` (copied without a host-device sync: `slime_core.host_to_device`)."""
        rows, ids = to_device_many([self.rows, self.ids], device)
        host = self._host_rows()
        return KeptTokens(rows=rows, ids=ids, num_rows=self.num_rows, host_rows=None if rows is host else host)

    def _host_rows(self) -> torch.Tensor:
        if self.host_rows is not None:
            return self.host_rows
        return self.rows.cpu()  # a read back from the device when `rows` lives there and no host copy was kept

    def slice_rows(self, start: int, end: int) -> KeptTokens:
        """The sets of rows `[start, end)`, renumbered from 0."""
        host = self._host_rows()
        lo, hi = torch.searchsorted(host, torch.tensor([start, end])).tolist()
        return KeptTokens(rows=self.rows[lo:hi] - start, ids=self.ids[lo:hi], num_rows=max(0, end - start),
                          host_rows=None if self.host_rows is None else host[lo:hi] - start)  # fmt: skip

    def select_rows(self, index: torch.Tensor) -> KeptTokens:
        """The sets of rows `index` (`[r]` int64, any order, no repeats), renumbered `0..r-1` in that order.

        An entry of -1 gives an empty set (a position that predicts no response token).
        """
        index = index.to(self.rows.device)
        order = torch.arange(index.numel(), device=self.rows.device)
        valid = index >= 0
        position = torch.full((self.num_rows,), -1, dtype=torch.int64, device=self.rows.device)
        position[index[valid]] = order[valid]
        new_rows = position[self.rows]
        keep = new_rows >= 0
        rows, ids = new_rows[keep], self.ids[keep]
        ascending = torch.argsort(rows, stable=True)
        return KeptTokens(rows=rows[ascending], ids=ids[ascending], num_rows=int(index.numel()))


def restricted_logsumexp(z: torch.Tensor, target_ids: torch.Tensor, kept: KeptTokens) -> torch.Tensor:
    """`logsumexp_{v ∈ K_t ∪ {y_t}} z_t[v]` for every row t (the target counted once).

    Args:
        z: `[R, V]` float32 logits (already divided by the temperature; any shift).
        target_ids: `[R]` int64 sampled tokens `y_t`.
        kept: the sets `K_t` of the `R` rows (on `z`'s device).

    Returns:
        `[R]` float32, differentiable in `z` (only the kept columns and the target receive gradient).

    Raises:
        ValueError: when `kept` does not have `R` rows or names an id outside `[0, V)`.
    """
    num_rows, vocab = z.shape
    if kept.num_rows != num_rows:
        raise ValueError(f"top-p replay: {kept.num_rows} rows of kept tokens for {num_rows} logit rows")
    if kept.ids.numel() and (int(kept.ids.min()) < 0 or int(kept.ids.max()) >= vocab):
        raise ValueError(f"top-p replay: a kept token id is outside the vocabulary [0, {vocab})")
    target_z = z.gather(-1, target_ids[:, None])[:, 0]  # [R]
    kept_z = z[kept.rows, kept.ids]  # [K]
    # The target enters once, through target_z; its copy in K_t (if any) is dropped.
    kept_z = kept_z.masked_fill(kept.ids == target_ids[kept.rows], float("-inf"))
    rows = torch.cat([kept.rows, torch.arange(num_rows, device=z.device)])
    values = torch.cat([kept_z, target_z])
    # Row max for stability (no gradient needed: logsumexp does not depend on the shift).
    row_max = torch.full((num_rows,), float("-inf"), device=z.device, dtype=values.dtype)
    row_max = row_max.scatter_reduce(0, rows, values.detach(), reduce="amax")
    sums = values.new_zeros(num_rows).index_add(0, rows, torch.exp(values - row_max[rows]))
    return row_max + torch.log(sums)
