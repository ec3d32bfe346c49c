"""What a checkpoint path holds, told from its files alone (nothing is loaded).

Kinds:

* `hf`: a Hugging Face model directory (`config.json` and weights);
* `torch_dist`: a Megatron save dir (`latest_checkpointed_iteration.txt` naming an iteration whose directory holds
  `.metadata`) or such an iteration directory (`iter_0000100/`, `release/`);
* `fsdp`: this project's FSDP checkpoints (the tracker file and `iter_*/meta.json`);
* `missing` / `empty` / `unknown`; `empty` also when the folder holds only what a run leaves in its `--save` before
  its first checkpoint completes (`_no_checkpoint_yet`).

`slime_app.checkpoints` checks the checkpoints a run reads by these kinds.
"""

from __future__ import annotations

import os
import pathlib

from slime_app.run_lock import LOCK_NAME
from slime_core.checkpoint_dirs import ROLLOUT_STATE_DIR, TRACKER_FILE, iteration_name, iteration_of, tracker_step

__all__ = ["RECOGNIZED_KINDS", "checkpoint_kind", "iteration_dir", "with_article"]

_WEIGHTS = (".safetensors", ".bin")


def iteration_dir(root: pathlib.Path) -> pathlib.Path | None:
    """The iteration directory the tracker file of `root` names (`iter_<n>` or `release`), if it exists."""
    step = tracker_step(root)
    if step is not None:
        path = root / iteration_name(step)
    else:
        # "release" (a converted model) is the one name a tracker holds besides an iteration number.
        try:
            text = (root / TRACKER_FILE).read_text(errors="replace").strip()
        except OSError:
            return None
        if text != "release":
            return None  # empty (a crash), damaged: `slime_app.checkpoints` says which
        path = root / text
    return path if path.is_dir() else None


def _no_checkpoint_yet(root: pathlib.Path) -> bool:
    """Whether `root` holds nothing but what a run leaves in `--save` before its first checkpoint completes.

    That is the run's lock, the driver's `rollout/` state (written just before the trainer's part of a save), the
    staging folders of saves cut short (`iter_XXXXXXX.tmp`: a full disk, a crash, Ctrl-C) and a `critic/` folder of
    the same. The relaunch with `--load` on that folder (the original's `--save X --load X`) was refused as "an
    unknown checkpoint" after a first save that failed, which the run had reported as "no complete checkpoint there
    yet".
    """
    for child in root.iterdir():
        name = child.name
        if name == LOCK_NAME or (name == ROLLOUT_STATE_DIR and child.is_dir()):
            continue
        if name.endswith(".tmp") and iteration_of(name) is not None and child.is_dir():
            continue
        if name == "critic" and child.is_dir() and _no_checkpoint_yet(child):
            continue
        return False
    return True


def checkpoint_kind(path: str | os.PathLike[str]) -> str:
    """`hf`, `torch_dist`, `fsdp`, `missing`, `empty` or `unknown` (see the module docstring)."""
    root = pathlib.Path(path)
    if not root.exists():
        return "missing"
    if not root.is_dir() or _no_checkpoint_yet(root):
        return "empty" if root.is_dir() else "unknown"
    if (root / "config.json").is_file() and any(p.suffix in _WEIGHTS for p in root.iterdir()):
        return "hf"
    if (root / ".metadata").is_file():
        return "torch_dist"
    iteration = iteration_dir(root)
    if iteration is not None:
        if (iteration / ".metadata").is_file():
            return "torch_dist"
        if (iteration / "meta.json").is_file():
            return "fsdp"
    return "unknown"


# The kinds `checkpoint_kind` tells apart (a backend's `checkpoint_format` outside them is left to the backend).
RECOGNIZED_KINDS = frozenset({"hf", "torch_dist", "fsdp"})

# Kinds read with "an": a vowel, or a letter name that starts with one (aitch-eff, eff-ess-dee-pee).
_AN = frozenset({"hf", "fsdp", "unknown", "empty"})


def with_article(kind: str) -> str:
    """`kind` with its article, as messages say it: "an unknown checkpoint", "a torch_dist checkpoint"."""
    return f"{'an' if kind in _AN else 'a'} {kind} checkpoint"
