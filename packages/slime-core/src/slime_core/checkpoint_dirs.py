"""The layout of a `--save` directory, shared by the FSDP and Megatron trainers (the original's layout).

    <save>/
        latest_checkpointed_iteration.txt   the latest complete iteration ("release" for a converted model)
        iter_0000003/                       one folder per saved rollout, named by `iteration_name`
        iter_0000004.tmp/                   a save in progress (`slime_core.dir_swap`), never complete
        iter_0000002.old/                   a re-saved iteration's previous copy, between the swap's two renames

A folder is complete once the file its writer puts there last exists: FSDP's `meta.json`, torch_dist's `.metadata`.
Readers of the directory (the driver's pre-flight check, each trainer's resume) use this module so that they agree
on what a complete checkpoint is. A save that replaces an iteration already there (a resume from an earlier
`--ckpt-step`) moves the old copy aside first; a kill between that rename and the next leaves the complete copy
only as `iter_XXXXXXX.old`, which no reader looks at: `interrupted_saves` finds it, `restore_interrupted_saves` puts
it back.
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import TYPE_CHECKING

from slime_core.dir_swap import MARKER, recover

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "pinned_iteration",
    "COMPLETE_MARKERS",
    "FSDP_MODEL_DIR",
    "REFERENCE_DIR",
    "TRACKER_FILE",
    "ROLLOUT_STATE_DIR",
    "complete_iterations",
    "cut_saves",
    "critic_dir",
    "critic_dirs",
    "interrupted_saves",
    "iteration_name",
    "iteration_of",
    "no_optimizer_state_message",
    "no_reference_message",
    "restore_interrupted_saves",
    "save_root",
    "saved_reference",
    "tracker_step",
]

TRACKER_FILE = "latest_checkpointed_iteration.txt"

# The KL reference's weights inside an iteration folder, saved when they follow the actor (`--ref-update-interval`):
# rebuilt from `--ref-load` on resume, they would be the initial weights, not the actor's of the last update.
REFERENCE_DIR = "ref"

# The file each writer writes last into an iteration folder: FSDP's `meta.json`, torch_dist's `.metadata`.
COMPLETE_MARKERS = ("meta.json", ".metadata")

# The FSDP trainer's DCP shards of {"model", "optim"} inside its iteration folder (the model's own HF names).
FSDP_MODEL_DIR = "model_and_optim"

#: The driver's share of each checkpoint (data cursor, fully-async groups, run state), beside the iterations.
ROLLOUT_STATE_DIR = "rollout"

# ASCII digits only: `\d` also matches other scripts' digits, which `int` reads but `iteration_name` never writes.
_ITERATION = re.compile(r"iter_([0-9]{7})")
# The same, or its staging (`.tmp`) or moved-aside (`.old`) copy (`slime_core.dir_swap`).
_ITERATION_OR_COPY = re.compile(_ITERATION.pattern + r"(?:\.tmp|\.old)?")


def critic_dir(folder: str | None) -> str | None:
    """Where the critic's checkpoints go inside the actor's `--load` / `--save` folder by default: `<folder>/critic`.

    Returns:
        `<folder>/critic`, or None without a folder.
    """
    return os.path.join(folder, "critic") if folder else None


def critic_dirs(cfg: SlimeArgs) -> tuple[str | None, str | None]:
    """The critic's checkpoint folders (PPO): `(load, save)`.

    Returns:
        `--critic-load` (else `<--load>/critic`, with `<--load>` the save folder holding an iteration folder given as
        `--load`: `save_root`) and `--critic-save` (else `<--save>/critic`); None where neither is given.
    """
    load = str(save_root(cfg.load)) if cfg.load else None
    return cfg.critic_load or critic_dir(load), cfg.critic_save or critic_dir(cfg.save)


def cut_saves(root: str | os.PathLike[str]) -> list[pathlib.Path]:
    """The staging folders of saves that never completed under a `--save` directory (`iter_XXXXXXX.tmp`).

    A save writes into `iter_XXXXXXX.tmp` and renames it into place only once complete; a full disk, a crash or a
    Ctrl-C in between leaves the staging folder, which no reader uses and the next save removes only when it is of
    the same iteration.

    Args:
        root: the `--save` directory; one that does not exist has none.

    Returns:
        The folders, by name; only ones slime wrote (its marker file) are listed, e.g. `[root/iter_0000001.tmp]`.
    """
    root = pathlib.Path(root)
    if not root.is_dir():
        return []
    return sorted(
        child
        for child in root.iterdir()
        if child.name.endswith(".tmp")
        and _ITERATION.fullmatch(child.name.removesuffix(".tmp"))
        and child.is_dir()
        and not child.is_symlink()
        and (child / MARKER).is_file()
    )


def iteration_name(step: int) -> str:
    """The folder name of iteration `step`: `iteration_name(3) == "iter_0000003"`."""
    return f"iter_{step:07d}"


def iteration_of(name: str) -> int | None:
    """The iteration a folder of a `--save` directory belongs to, by its name, copies included.

    Returns:
        `3` for `iter_0000003`, `iter_0000003.tmp` (a save in progress) and `iter_0000003.old` (moved aside by a
        re-save); None for any other name.
    """
    match = _ITERATION_OR_COPY.fullmatch(name)
    return int(match.group(1)) if match else None


def save_root(load: str | os.PathLike[str]) -> pathlib.Path:
    """The `--save` folder a `--load` resumes: `load`, or the folder holding it when it names one iteration folder.

    Megatron loads an iteration folder given directly (`--load <save>/iter_0000004`, as the original and Megatron-LM
    do); the driver's parts of that checkpoint (the data cursor in `rollout/`, the fully-async held groups, the run
    state) live beside it, in the save folder. Read under the iteration folder they were not found, and the resumed
    run served the prompts from the first one again (a warning said so).

    Returns:
        `load`'s parent for an `iter_XXXXXXX` name, else `load`.
    """
    path = pathlib.Path(load)
    return path.parent if _ITERATION.fullmatch(path.name) else path


def pinned_iteration(load: str | os.PathLike[str] | None, ckpt_step: int | None) -> int | None:
    """The iteration `--load` and `--ckpt-step` pin, before any tracker is read.

    Args:
        load: `--load` (None: no checkpoint).
        ckpt_step: `--ckpt-step` (None: not given).

    Returns:
        `ckpt_step` when given; the iteration of the folder `load` names when it names one (Megatron's
        `--load <save>/iter_XXXXXXX`); None otherwise (the save folder's tracker decides).
    """
    if ckpt_step is not None:
        return ckpt_step
    if load is None or save_root(load) == pathlib.Path(load):
        return None
    return iteration_of(pathlib.Path(load).name)


def saved_reference(iteration_dir: str | os.PathLike[str]) -> pathlib.Path | None:
    """The KL reference's folder inside an iteration folder, when a save with `--ref-update-interval` completed it.

    Both writers (FSDP's DCP, Megatron's torch_dist) write the folder's `.metadata` last.

    Args:
        iteration_dir: the iteration folder a trainer resumed from (`iter_0000003/`).

    Returns:
        `iteration_dir / REFERENCE_DIR`, or None when it is missing or incomplete.
    """
    path = pathlib.Path(iteration_dir) / REFERENCE_DIR
    return path if (path / ".metadata").is_file() else None


def complete_iterations(root: str | os.PathLike[str]) -> list[int]:
    """The iterations under a `--save` directory whose folder is complete, ascending.

    Args:
        root: the `--save` (or `--load`) directory; one that does not exist has none.

    Returns:
        The iteration numbers of the `iter_XXXXXXX` folders (not `.tmp` staging ones) holding one of
        `COMPLETE_MARKERS`, e.g. `[1, 2]`.
    """
    root = pathlib.Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _ITERATION.fullmatch(child.name)
        if match and any((child / marker).is_file() for marker in COMPLETE_MARKERS):
            found.append(int(match.group(1)))
    return sorted(found)


def interrupted_saves(root: str | os.PathLike[str]) -> list[int]:
    """The iterations under `root` that exist only as a complete `iter_XXXXXXX.old` (a swap cut between its renames).

    `slime_core.dir_swap.swap_in` renames the iteration being re-saved to `.old`, then the new one into place; a kill
    in between leaves `iter_XXXXXXX` missing while the tracker may name it.

    Returns:
        The iteration numbers, ascending (`[2]` for `iter_0000002.old` without `iter_0000002`); only folders slime
        wrote (its marker) and complete (`COMPLETE_MARKERS`) count.
    """
    root = pathlib.Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _ITERATION.fullmatch(child.name.removesuffix(".old")) if child.name.endswith(".old") else None
        if match is None or (root / match.group(0)).exists() or (root / match.group(0)).is_symlink():
            continue
        if (child / MARKER).is_file() and any((child / marker).is_file() for marker in COMPLETE_MARKERS):
            found.append(int(match.group(1)))
    return sorted(found)


def restore_interrupted_saves(root: str | os.PathLike[str]) -> list[int]:
    """Renames each `interrupted_saves` folder back to its iteration name (call only where no other run writes).

    Returns:
        The iterations restored, ascending.

    Raises:
        OSError: a rename failed (a read-only folder).
    """
    steps = interrupted_saves(root)
    for step in steps:
        recover(pathlib.Path(root) / iteration_name(step), flag="--load")
    return steps


def tracker_step(root: str | os.PathLike[str]) -> int | None:
    """The iteration `root`'s tracker file names: `3` for a tracker holding "3".

    Returns:
        None without a readable tracker, or when it names no training iteration ("release", empty, damaged): the
        loaders report those themselves.
    """
    try:
        text = (pathlib.Path(root) / TRACKER_FILE).read_text(errors="replace").strip()
    except OSError:
        return None
    # ASCII digits only, as `_ITERATION`: "²" is a digit to str.isdigit and not to int().
    return int(text) if text.isascii() and text.isdigit() else None


def no_optimizer_state_message(load: str | os.PathLike[str], iteration: str, *, flag: str = "--load") -> str:
    """The refusal of a resume whose checkpoint was saved without optimizer state, one text for every backend.

    As the original (Megatron stops on such a checkpoint): a fresh Adam and a schedule restarting its warm-up would
    silently change the resumed run.

    Args:
        load: the `--load` directory.
        iteration: the iteration folder's name (`iter_0000005`).
        flag: the flag that named `load` (`--critic-load` for the critic's own folder).
    """
    return (
        f"{flag} {load}: {iteration} holds no optimizer state (saved with --no-save-optim); resume it with "
        "--no-load-optim to start the optimizer and its learning-rate schedule afresh"
    )


def no_reference_message(load: str | os.PathLike[str], iteration: str, interval: int) -> str:
    """The warning of a `--ref-update-interval` resume whose checkpoint holds no reference model, one text for both.

    Args:
        load: the `--load` directory.
        iteration: the iteration folder's name.
        interval: `--ref-update-interval`.
    """
    return (
        f"--load {load}: {iteration} holds no reference model (saved without --ref-update-interval, or by an older "
        f"version); with --ref-update-interval {interval} the KL reference is the initial weights until its next "
        "update"
    )
