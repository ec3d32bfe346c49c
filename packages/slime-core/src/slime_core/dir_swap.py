"""Replace a directory slime wrote by a freshly written one, so that a crash at any point leaves a complete copy.

Writers fill `<path>.tmp` (`prepare_staging`), then `swap_in` renames: old `<path>` -> `<path>.old`, `<path>.tmp` ->
`<path>`, then deletes `<path>.old`. Each rename is atomic on one filesystem, so at every instant `<path>` or
`<path>.old` holds a complete export, and the next `swap_in` (or `recover`) puts a left-over `.old` back when a
crash fell between the two renames.

Only slime's own directories are ever replaced or deleted: every directory written through this module carries the
marker file `MARKER`, and a path that is a file, a symbolic link or a non-empty directory without the marker is
refused (`ReplaceRefused`, one line naming the flag and the folder) before anything is written or deleted. The
original slime only wrote files into `--save-hf`; replacing the folder is ours, so it must never take a user's data
with it (`--save-hf .`, or the folder holding `--prompt-data`).
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil

__all__ = [
    "MARKER",
    "ReplaceRefused",
    "check_replaceable",
    "mark",
    "old_dir",
    "prepare_staging",
    "recover",
    "refusal",
    "staging_dir",
    "swap_in",
]

logger = logging.getLogger(__name__)

MARKER = ".slime_export"
_MARKER_TEXT = "Written by slime. A directory holding this file may be replaced or deleted by the next export.\n"


class ReplaceRefused(FileExistsError):
    """A path a writer would replace or delete holds something slime did not write there."""


def staging_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """`<path>.tmp`: where a writer puts the new directory before `swap_in` (same parent, so renames are atomic)."""
    out = pathlib.Path(path)
    return out.with_name(out.name + ".tmp")


def old_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """`<path>.old`: the previous directory while it is being replaced."""
    out = pathlib.Path(path)
    return out.with_name(out.name + ".old")


def refusal(path: str | os.PathLike[str]) -> str | None:
    """Why `path` may not be replaced or deleted, or None when it is absent, an empty directory or marked as ours.

    Args:
        path: a directory a writer would replace (the destination, its `.tmp` or its `.old`).

    Returns:
        None, or a short reason ("is a file", "is a symbolic link", "is a non-empty folder ...").
    """
    p = pathlib.Path(path)
    if p.is_symlink():
        return "is a symbolic link"
    if not p.exists():
        return None
    if not p.is_dir():
        return "exists and is not a directory"
    if (p / MARKER).is_file() or next(p.iterdir(), None) is None:
        return None
    return f"is a non-empty folder that slime did not write (no {MARKER} file in it)"


def _refuse(path: pathlib.Path, reason: str, flag: str) -> ReplaceRefused:
    return ReplaceRefused(
        f"{flag} {path}: {reason}; refusing to replace or delete it. Give {flag} a new or empty folder of its own"
    )


def check_replaceable(paths: list[pathlib.Path], flag: str) -> None:
    """Raises `ReplaceRefused` (naming `flag`) for the first of `paths` that `refusal` refuses."""
    for p in paths:
        reason = refusal(p)
        if reason is not None:
            raise _refuse(p, reason, flag)


def mark(directory: str | os.PathLike[str]) -> None:
    """Writes the marker file into `directory` (which must exist), making it replaceable by the next export."""
    (pathlib.Path(directory) / MARKER).write_text(_MARKER_TEXT)


def prepare_staging(path: str | os.PathLike[str], *, flag: str = "output", marked: bool = True) -> pathlib.Path:
    """Checks that `path` can be replaced, then makes a fresh, empty `<path>.tmp` (marked) to write into.

    Call it before the (expensive) write, so a refused destination fails before any work or deletion.

    Args:
        path: the destination directory.
        flag: the flag that named it (`--save-hf`), for the error message.
        marked: write the marker into the staging directory now (False for a writer that needs an empty
            directory; `swap_in` marks it before the rename).

    Returns:
        The staging directory.

    Raises:
        ReplaceRefused: `path`, `<path>.tmp` or `<path>.old` is a file, a link or an unmarked non-empty folder.
    """
    out = pathlib.Path(path)
    tmp = staging_dir(out)
    check_replaceable([out, tmp, old_dir(out)], flag)
    if tmp.exists():
        shutil.rmtree(tmp)  # a marked (or empty) left-over of an interrupted export
    tmp.mkdir(parents=True)
    if marked:
        mark(tmp)
    return tmp


def recover(path: str | os.PathLike[str], *, flag: str = "output") -> None:
    """Undoes a swap a crash interrupted: a marked `<path>.old` without `<path>` is renamed back; beside it, deleted.

    Raises:
        ReplaceRefused: `<path>.old` is not ours (a file, a link, an unmarked non-empty folder); it is left alone.
    """
    out, old = pathlib.Path(path), old_dir(path)
    if not old.exists() and not old.is_symlink():
        return
    check_replaceable([old], flag)
    if out.exists() or out.is_symlink():  # the swap finished; only deleting the old copy was left
        shutil.rmtree(old)
    else:
        logger.warning("%s: restoring the previous copy from %s (an earlier replacement was interrupted)", out, old)
        os.replace(old, out)


def swap_in(tmp: str | os.PathLike[str], path: str | os.PathLike[str], *, flag: str = "output") -> pathlib.Path:
    """Makes the complete directory `tmp` the new `path` (marked), replacing an old one of ours by rename.

    Args:
        tmp: the finished new directory (usually from `prepare_staging(path)`).
        path: the destination; absent, empty or written by slime (marked), else refused.
        flag: the flag that named `path`, for the error message.

    Returns:
        `path` as a Path.

    Raises:
        ReplaceRefused: `path` or `<path>.old` is a file, a link or an unmarked non-empty folder (nothing is
            deleted; `tmp` is left in place).
        FileNotFoundError: `tmp` does not exist.
    """
    out, new, old = pathlib.Path(path), pathlib.Path(tmp), old_dir(path)
    if not new.is_dir():
        raise FileNotFoundError(f"{new}: the new directory to put at {out} does not exist")
    recover(out, flag=flag)
    check_replaceable([out], flag)
    mark(new)
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    if old.exists():
        shutil.rmtree(old)
    return out
