"""The partial-rollout buffer's take: the default oldest-first, or `--buffer-filter-path` with its contract checked.

The original's signature is `fn(args, rollout_id, buffer, num_samples) -> list[list[Sample]]` (called with
`rollout_id=None`, as the original's data source does): it returns at most `num_samples` groups and removes them
from `buffer` in place (the original's default, `pop_first`, does `del buffer[:n]`). A filter that returned
`buffer[:n]` without removing them handed the same `Sample` objects out again at the next draw: two generate
tasks then wrote into one object, and the group was trained twice. One that returned None failed as
`object of type 'NoneType' has no len()`, naming no plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slime_core.error_text import preview
from slime_core.hook_deadline import note_raised_by
from slime_core.sample import Sample
from slime_rollout.plugins import load_function

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["pop_first", "take_from_buffer"]


def pop_first(args: Any, rollout_id: int | None, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """The default take (original `slime.rollout.data_source.pop_first`): the oldest `num_samples` groups, removed."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


def take_from_buffer(args: SlimeArgs, buffer: list[list[Sample]], num_groups: int) -> list[list[Sample]]:
    """Takes up to `num_groups` groups out of `buffer` with `--buffer-filter-path` (default `pop_first`).

    Args:
        args: the plugin view; reads `buffer_filter_path`.
        buffer: the data source's buffer of groups (`list[list[Sample]]`), changed in place by the filter.
        num_groups: how many groups the draw asks for (> 0).

    Returns:
        The groups taken, at most `num_groups`, none of them left in `buffer`.

    Raises:
        TypeError: the filter returned something other than a list of lists of Samples.
        ValueError: it returned more than `num_groups` groups, one group twice, or a group it left in `buffer`
            (each message names `--buffer-filter-path` and the group's sample indices).
    """
    path = args.buffer_filter_path
    if not path:
        return pop_first(args, None, buffer, num_groups)
    fn = load_function(path, flag="--buffer-filter-path")
    where = f"--buffer-filter-path {path}"
    try:
        taken = fn(args, None, buffer, num_groups)
    except Exception as e:
        # The data source's caller names only the data source: say which function raised, on which groups.
        groups = ", ".join(str([s.index for s in group]) for group in buffer[:5]) + (", ..." if len(buffer) > 5 else "")
        note_raised_by(e, f"{where} on the buffer's groups of samples {groups}, asked for {num_groups}")
        raise
    if not isinstance(taken, list | tuple):
        raise TypeError(
            f"{where} returned {type(taken).__name__} {preview(taken)}, not a list of groups (lists of Samples) "
            "taken out of the buffer"
        )
    if len(taken) > num_groups:
        raise ValueError(f"{where} returned {len(taken)} groups when {num_groups} were asked for")
    left = {id(group) for group in buffer}
    seen: set[int] = set()
    for i, group in enumerate(taken):
        if not isinstance(group, list) or not all(isinstance(s, Sample) for s in group):
            raise TypeError(f"{where}: group {i} is {type(group).__name__} {preview(group)}, not a list of Samples")
        indices = [s.index for s in group]
        if id(group) in seen:
            raise ValueError(f"{where} returned the group of samples {indices} twice")
        seen.add(id(group))
        if id(group) in left:
            # Served again at the next draw: two generate tasks would write into the same Sample objects.
            raise ValueError(
                f"{where} returned the group of samples {indices} but left it in the buffer; remove what it returns "
                "(e.g. `del buffer[:n]`, as the default pop_first does)"
            )
    return list(taken)
