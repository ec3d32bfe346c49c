"""The order in which one epoch serves the prompts (`--rollout-shuffle`, `--rollout-seed`): the original's.

The original's `Dataset.shuffle(epoch)` (`slime/utils/data.py`) seeds Python's `random` with `rollout_seed + epoch`
and shuffles `list(range(n))`; this is the same permutation, from a private `random.Random` (the original reseeds
the process-wide generator). Earlier this version drew a NumPy permutation, so a run resumed from the original's
checkpoint (`data.original_cursor`) went on mid-epoch in another order: prompts before the cursor in the new order
were skipped for the epoch, others served twice; and one seed gave another prompt order than the original's.

A cursor this version wrote with the NumPy order (no `shuffle_order` field) keeps it, so a resume goes on as the run
began.
"""

from __future__ import annotations

import random

import numpy as np

__all__ = ["LEGACY_NUMPY", "ORIGINAL", "epoch_order"]

ORIGINAL = "random.shuffle"  # the cursor's `shuffle_order` value for the original's permutation
LEGACY_NUMPY = "numpy"  # cursors written before this version followed the original (no `shuffle_order` field)


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int, kind: str = ORIGINAL) -> np.ndarray:
    """The indices of `n` prompts in the order epoch `epoch` serves them.

    Args:
        n: prompts in the dataset.
        shuffle: `--rollout-shuffle`; without it the file order.
        seed: `--rollout-seed`; the epoch's permutation is seeded with `seed + epoch`, as in the original.
        epoch: 0-based epoch.
        kind: `ORIGINAL`, or `LEGACY_NUMPY` for a run resumed from a cursor that used it.

    Returns:
        `[n]` int64 indices, a permutation of `range(n)`.

    Raises:
        ValueError: an unknown `kind` (a damaged cursor).
    """
    if not shuffle:
        return np.arange(n)
    if kind == LEGACY_NUMPY:
        return np.random.default_rng(seed + epoch).permutation(n)
    if kind != ORIGINAL:
        raise ValueError(f"shuffle_order {kind!r}: expected {ORIGINAL!r} or {LEGACY_NUMPY!r}")
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    return np.asarray(order, dtype=np.int64)
