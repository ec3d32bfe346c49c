"""Replace a directory by a freshly written one so that a crash at any point leaves a complete copy behind.

Writers fill `<path>.tmp` (`staging_dir`), then `swap_in` renames: old `<path>` -> `<path>.old`, `<path>.tmp` ->
`<path>`, then deletes `<path>.old`. Each rename is atomic on one filesystem, so at every instant `<path>` or
`<path>.old` holds a complete export, and the next `swap_in` (or `recover`) puts a left-over `.old` back when a
crash fell between the two renames.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil

__all__ = ["old_dir", "recover", "staging_dir", "swap_in"]

logger = logging.getLogger(__name__)


def staging_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """`<path>.tmp`: where a writer puts the new directory before `swap_in` (same parent, so renames are atomic)."""
    out = pathlib.Path(path)
    return out.with_name(out.name + ".tmp")


def old_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """`<path>.old`: the previous directory while it is being replaced."""
    out = pathlib.Path(path)
    return out.with_name(out.name + ".old")


def recover(path: str | os.PathLike[str]) -> None:
    """Undoes a swap a crash interrupted: a `<path>.old` without `<path>` is renamed back; beside `<path>`, deleted."""
    out, old = pathlib.Path(path), old_dir(path)
    if not old.exists():
        return
    if out.exists():  # the swap finished; only deleting the old copy was left
        shutil.rmtree(old)
    else:
        logger.warning("%s: restoring the previous copy from %s (an earlier replacement was interrupted)", out, old)
        os.replace(old, out)


def swap_in(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> pathlib.Path:
    """Makes the complete directory `tmp` the new `path`, replacing any old one by rename (see the module doc).

    Args:
        tmp: the finished new directory (usually `staging_dir(path)`).
        path: the destination; a directory there is replaced, a file there is an error.

    Returns:
        `path` as a Path.

    Raises:
        NotADirectoryError: `path` exists and is not a directory (nothing is deleted).
        FileNotFoundError: `tmp` does not exist.
    """
    out, new, old = pathlib.Path(path), pathlib.Path(tmp), old_dir(path)
    if not new.is_dir():
        raise FileNotFoundError(f"{new}: the new directory to put at {out} does not exist")
    recover(out)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out} exists and is not a directory; refusing to replace it")
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    if old.exists():
        shutil.rmtree(old)
    return out
