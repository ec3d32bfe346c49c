"""The data cursor of a checkpoint the original slime wrote, for a run that resumes from one.

The original saves its `RolloutDataSource` position as `{--save}/rollout/global_dataset_state_dict_{rollout_id}.pt`
(`torch.save` of a dict, `slime/rollout/data_source.py`); this version writes `data_source_{rollout_id}.json`
(`slime_rollout.data.cursor_file`, `RolloutDataSource.save`). Without this reader a resume from the original's `--save`
found no cursor and started the prompts again from the first one.
"""

from __future__ import annotations

import pathlib
from typing import Any

from slime_rollout.data.epoch_order import ORIGINAL

__all__ = ["load_original", "original_cursor", "original_cursor_path"]

# The original's position fields; a missing one is 0, as its `load` reads them.
_FIELDS = ("epoch_id", "sample_offset", "sample_group_index", "sample_index")


def original_cursor_path(root: str | pathlib.Path, rollout_id: int) -> pathlib.Path:
    """Where the original slime kept the data cursor of `rollout_id` under a checkpoint root."""
    return pathlib.Path(root) / "rollout" / f"global_dataset_state_dict_{rollout_id}.pt"


def original_cursor(path: pathlib.Path) -> dict[str, Any]:
    """Reads an original cursor file into this version's cursor fields, with the original's defaults for missing ones.

    Returns:
        `epoch_id`, `sample_offset`, `sample_group_index`, `sample_index` (ints), `metadata` (a dict) and
        `shuffle_order` (the original's, `data.epoch_order.ORIGINAL`); the original keeps no buffer.

    Raises:
        ValueError: the file is not a `torch.save`d dict of those fields (names the file).
    """
    import torch  # only a resume from the original's checkpoint needs it

    try:
        # Plain containers of ints and strings: nothing that needs unpickling code.
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise TypeError(f"a {type(state).__name__}, not a dict")
        cursor = {key: int(state.get(key, 0)) for key in _FIELDS}
        metadata = state.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata is a {type(metadata).__name__}, not a dict")
    except Exception as e:  # noqa: BLE001 - any failure to read it is one error naming the file
        raise ValueError(f"{path}: not a data cursor of the original slime ({type(e).__name__}: {e})") from e
    return {**cursor, "metadata": metadata, "shuffle_order": ORIGINAL}  # its run shuffled as the original does


def load_original(root: str | pathlib.Path, rollout_id: int) -> tuple[pathlib.Path, dict[str, Any]] | None:
    """The original slime's cursor of `rollout_id` under `root` and its path, or None when it wrote none there.

    Raises:
        ValueError: the file exists but is not a cursor (`original_cursor`).
    """
    path = original_cursor_path(root, rollout_id)
    if not path.exists():
        return None
    return path, original_cursor(path)
