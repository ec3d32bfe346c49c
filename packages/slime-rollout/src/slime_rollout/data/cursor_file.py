"""The data source's cursor in a checkpoint: `{root}/rollout/data_source_{rollout_id}.json`, written and read back.

`slime_rollout.data.source.RolloutDataSource.save` / `load` keep the cursor's fields (`_state` / `_set_state`); this
module owns the file: where it lives, the atomic write (buffered samples stored with `slime_core.sample_json`), and
the read, which falls back to the cursor the original slime wrote (`slime_rollout.data.original_cursor`) so a run
resumed from the original's `--save` continues its prompt stream.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from collections.abc import Iterable
from typing import Any

from slime_core.checkpoint_dirs import save_root
from slime_core.dir_swap import write_text_atomic
from slime_core.sample import Sample
from slime_core.sample_json import dumps_with_samples
from slime_rollout.data.original_cursor import load_original

logger = logging.getLogger(__name__)

__all__ = [
    "check_cursor",
    "cursor_path",
    "keep_groups_of_size",
    "read_cursor",
    "resumed_epoch_flags",
    "warn_other_prompt_count",
    "write_cursor",
]


def cursor_path(root: str | os.PathLike[str], rollout_id: int) -> pathlib.Path:
    """Where the cursor of `rollout_id` lives under a checkpoint root."""
    return pathlib.Path(root) / "rollout" / f"data_source_{rollout_id}.json"


def write_cursor(path: pathlib.Path, state: dict[str, Any], buffered: Iterable[Sample]) -> None:
    """Writes the cursor `state` (its `buffer` field holding `buffered`, as dicts) to `path` atomically.

    Raises:
        TypeError: if buffered samples hold values JSON cannot store (names the sample).
    """
    text = dumps_with_samples(state, buffered, what="--save: the data source's partial-rollout buffer")
    write_text_atomic(path, text)


def read_cursor(root: str | os.PathLike[str], rollout_id: int) -> tuple[pathlib.Path, Any] | None:
    """The cursor saved under `root` for `rollout_id` and its path: this version's file, else the original slime's.

    Returns:
        `(path, state)`, `state` as decoded (the caller checks its fields), or None when neither file exists.

    Raises:
        ValueError: the file exists but is not JSON (names the file), or the original's is not a cursor.
    """
    root = save_root(root)  # `--load <save>/iter_XXXXXXX` (Megatron): the cursor is in the save folder
    path = cursor_path(root, rollout_id)
    if not path.exists():
        return load_original(root, rollout_id)
    try:
        return path, json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # bad JSON or bad UTF-8
        raise ValueError(f"{path}: bad data-source cursor ({e})") from e


def warn_other_prompt_count(state: dict[str, Any], num_prompts: int, prompt_data: str | None) -> None:
    """One warning when a cursor was saved over another number of prompts than the data source now holds.

    The cursor's epoch order and offset then point at other prompts: a run resumed after `--prompt-data` changed (or
    under another length limit) went on silently with prompts the saved run would not have served. Cursors written
    before the count was kept (and the original's) say nothing.
    """
    saved = state.get("num_prompts")
    if saved is not None and int(saved) != num_prompts:
        logger.warning(
            "the data-source cursor was saved over %d prompts; --prompt-data %s now gives %d: the resumed run does "
            "not go on with the saved run's prompts", int(saved), prompt_data, num_prompts,
        )  # fmt: skip


def resumed_epoch_flags(state: dict[str, Any], args: Any, offset: int, num_prompts: int) -> tuple[bool, int]:
    """`(--rollout-shuffle, --rollout-seed)` that order the rest of the epoch a resumed cursor stands in.

    The cursor's offset counts prompts of its epoch's permutation: under another permutation (a resume with another
    `--rollout-shuffle` or `--rollout-seed`) the same offset served some of the epoch's prompts twice and skipped
    others, without a word. So the saved epoch finishes in the order it began with, said once; this run's values
    order the epochs after it. Cursors written before the fields were kept (and the original's) use this run's.

    Args:
        state: the decoded cursor (`epoch_shuffle`, `epoch_seed` when written by this version).
        args: this run's plugin view; reads `rollout_shuffle`, `rollout_seed`.
        offset: the cursor's `sample_offset` in its epoch.
        num_prompts: prompts the data source now holds.

    Returns:
        The flags to order the cursor's epoch with.
    """
    here = (bool(args.rollout_shuffle), int(args.rollout_seed))
    if "epoch_shuffle" not in state or offset <= 0 or offset >= num_prompts:
        return here  # nothing of the epoch was served yet, or all of it: this run's order from here
    saved = (bool(state["epoch_shuffle"]), int(state["epoch_seed"]))
    if saved == here or not (saved[0] or here[0]):  # without shuffling the seed orders nothing
        return here
    logger.warning(
        "the data-source cursor was saved %d prompts into epoch %s, ordered by --rollout-shuffle %s --rollout-seed %d; "
        "this run has --rollout-shuffle %s --rollout-seed %d: the rest of that epoch keeps its saved order (each of "
        "its prompts served once), the next epochs follow this run's values",
        offset, state.get("epoch_id"), saved[0], saved[1], here[0], here[1],
    )  # fmt: skip
    return saved


def keep_groups_of_size(groups: list[list[Sample]], size: int, where: str | os.PathLike[str]) -> list[list[Sample]]:
    """The saved groups (a partial-rollout buffer, fully-async held groups) that have `size` samples.

    A run resumed with another `--n-samples-per-prompt` got the saved groups at their old size: the default rollout
    then stopped blaming the data source, and the fully-async producer trained them as they were (advantages
    normalized over groups of two sizes). They are dropped with one counted warning, as the original keeps no such
    group across a resume; their prompts are not drawn again (the cursor is past them).

    Args:
        groups: the groups as read back.
        size: `--n-samples-per-prompt` of this run.
        where: the checkpoint file they came from, for the warning.

    Returns:
        The groups of `size` samples, in order.
    """
    kept = [group for group in groups if len(group) == size]
    if len(kept) < len(groups):
        other = sorted({len(group) for group in groups} - {size})
        logger.warning(
            "%s: dropped %d of %d saved group(s) of %s sample(s), not --n-samples-per-prompt %d (saved by a run with "
            "another value); their prompts are not drawn again",
            where, len(groups) - len(kept), len(groups), "/".join(map(str, other)), size,
        )  # fmt: skip
    return kept


# The fields `slime_rollout.data.source.RolloutDataSource._set_state` restores, each read with int().
_COUNTERS = ("epoch_id", "sample_offset", "sample_group_index", "sample_index")


def check_cursor(root: str | os.PathLike[str], rollout_id: int) -> pathlib.Path | None:
    """Reads the cursor saved under `root` for `rollout_id` and checks the fields the built-in data sources restore.

    Cheap (one small file), so a damaged cursor is named before the engines start rather than when the rollout
    manager restores it.

    Returns:
        The file checked, or None when there is none (the resumed run then starts its data afresh, with a warning).

    Raises:
        ValueError: the file is not JSON, not an object, lacks a counter or holds a bad one, or a buffered sample
            does not decode (message names the file).
    """
    found = read_cursor(root, rollout_id)
    if found is None:
        return None
    path, state = found
    try:
        if not isinstance(state, dict):
            raise TypeError(f"not a JSON object but {type(state).__name__}")
        for key in _COUNTERS:
            if key not in state:
                raise KeyError(f"no {key!r} field")
            int(state[key])
        dict(state.get("metadata", {}))
        for group in state.get("buffer", []):
            for sample in group:
                Sample.from_dict(sample)
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: bad data-source cursor ({e})") from e
    return path
