"""Replace a directory slime wrote by a freshly written one, so that a crash at any point leaves a complete copy.

Writers fill `<path>.tmp` (`prepare_staging`), then `swap_in` renames: old `<path>` -> `<path>.old`, `<path>.tmp` ->
`<path>`, then deletes `<path>.old`. Each rename is atomic on one filesystem, so at every instant `<path>` or
`<path>.old` holds a complete export, and the next `swap_in` (or `recover`) puts a left-over `.old` back when a
crash fell between the two renames. The new directory's files are flushed to the disk before the renames and the
renames after them (`sync_tree`), so a power loss cannot publish a name whose files were never written.

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
    "remove",
    "staging_dir",
    "swap_in",
    "sync_tree",
    "write_text_atomic",
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


def _exists(path: pathlib.Path) -> bool:
    return path.exists() or path.is_symlink()  # a dangling link exists as a name


def remove(path: str | os.PathLike[str]) -> None:
    """Deletes `path` whatever it is: a folder with its contents, a file, or a link (never the link's target)."""
    p = pathlib.Path(path)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif _exists(p):
        p.unlink()


def recover(path: str | os.PathLike[str], *, flag: str = "output", force: bool = False) -> None:
    """Undoes a swap a crash interrupted: a marked `<path>.old` without `<path>` is renamed back; beside it, deleted.

    Args:
        path: the destination directory.
        flag: the flag that named it, for the error message.
        force: `<path>.old` may be anything: the user asked for `path` to be replaced (slime-convert's `-f/--force`),
            so what a forced swap moved aside is restored or deleted whether slime wrote it or not.

    Raises:
        ReplaceRefused: `<path>.old` is not ours (a file, a link, an unmarked non-empty folder) and not `force`; it is
            left alone.
    """
    out, old = pathlib.Path(path), old_dir(path)
    if not _exists(old):
        return
    if not force:
        check_replaceable([old], flag)
    if _exists(out):  # the swap finished; only deleting the old copy was left
        remove(old)
    else:
        logger.warning("%s: restoring the previous copy from %s (an earlier replacement was interrupted)", out, old)
        os.replace(old, out)


def swap_in(
    tmp: str | os.PathLike[str], path: str | os.PathLike[str], *, flag: str = "output", force: bool = False
) -> pathlib.Path:
    """Makes the complete directory `tmp` the new `path` (marked), replacing an old one of ours by rename.

    Args:
        tmp: the finished new directory (usually from `prepare_staging(path)`).
        path: the destination; absent, empty or written by slime (marked), else refused.
        flag: the flag that named `path`, for the error message.
        force: `path` (and a left-over `<path>.old`) may be anything, a file, a link or a folder slime did not
            write: the user asked for it to be replaced (slime-convert's `-f/--force`). A link or a file is moved
            aside and deleted as itself; a link's target is never touched.

    Returns:
        `path` as a Path.

    Raises:
        ReplaceRefused: not `force`, and `path` or `<path>.old` is a file, a link or an unmarked non-empty folder
            (nothing is deleted; `tmp` is left in place).
        FileNotFoundError: `tmp` does not exist.
    """
    out, new, old = pathlib.Path(path), pathlib.Path(tmp), old_dir(path)
    if not new.is_dir():
        raise FileNotFoundError(f"{new}: the new directory to put at {out} does not exist")
    recover(out, flag=flag, force=force)
    if not force:
        check_replaceable([out], flag)
    mark(new)
    sync_tree(new)  # the renames below must not reach the disk before the data they publish
    if _exists(out):
        os.replace(out, old)
    os.replace(new, out)
    sync_tree(out.parent, recursive=False)  # the renames themselves
    remove(old)
    return out


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replaces the file `path` by one holding `text`, atomically and durably (a checkpoint's tracker file).

    Written to `<path>.tmp` (its folder created if missing), flushed to the disk, renamed over `path`, and the
    rename flushed: after a crash the file holds the old text or the new one, never an empty or partial one.

    Raises:
        OSError: the file could not be written, flushed or renamed.
    """
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    sync_tree(out.parent, recursive=False)


def _fsync(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(directory: str | os.PathLike[str], *, recursive: bool = True) -> None:
    """Flushes every regular file under `directory`, then the directories themselves, to the disk (`fsync`).

    A rename is atomic, but without this a crash or power loss soon after it can leave the new name pointing at
    files the kernel had not written yet: a checkpoint whose shards are empty or truncated under its final name,
    which a resume then reads (POSIX orders neither data before a rename nor a rename before a crash).

    Args:
        directory: the folder to flush (its files and sub-folders too unless `recursive` is False).
        recursive: False flushes only `directory`'s own entry list (after renaming something into it).

    Raises:
        OSError: a file or folder could not be opened or flushed.
    """
    root = pathlib.Path(directory)
    if recursive:
        for parent, dirs, files in os.walk(root, topdown=False):
            for name in files:
                file = pathlib.Path(parent) / name
                if file.is_file() and not file.is_symlink():
                    _fsync(file)
            for name in dirs:
                if not (pathlib.Path(parent) / name).is_symlink():
                    _fsync(pathlib.Path(parent) / name)
    _fsync(root)
