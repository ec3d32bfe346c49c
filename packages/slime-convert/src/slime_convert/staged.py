"""An output directory that appears whole or not at all: written as `<out>.tmp`, then renamed over `<out>`.

A conversion that fails part way (a full disk, a truncated input, Ctrl-C) removes its `<out>.tmp` and leaves
`<out>` as it was, so `--force` never destroys the previous output before the new one is complete. The files are
flushed to the disk before the rename that publishes them (`slime_core.dir_swap.sync_tree`), so a power loss cannot
leave the final name holding empty shards.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
from collections.abc import Iterator

from slime_core.dir_swap import old_dir, staging_dir, sync_tree

__all__ = ["staged_output"]


def _remove(path: pathlib.Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def staged_output(output: str | os.PathLike[str], *, force: bool, flag: str) -> Iterator[pathlib.Path]:
    """Yields an empty staging directory that replaces `output` when the block ends without an exception.

    Args:
        output: the directory to create (or, with `force`, replace: a directory, a file or a link).
        force: replace an existing `output` (`-f/--force`).
        flag: the flag that named `output`, for the error message.

    Yields:
        `<output>.tmp`, empty (a left-over of an interrupted run is removed first).

    Raises:
        FileExistsError: `output` exists and not `force` (raised before anything is written).
    """
    out = pathlib.Path(output).absolute()  # "." has no name to put ".tmp" after
    if (out.exists() or out.is_symlink()) and not force:
        raise FileExistsError(f"{flag} {out} exists (pass -f/--force to replace it)")
    tmp, old = staging_dir(out), old_dir(out)
    _remove(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed conversion leaves nothing behind
        raise
    sync_tree(tmp)
    if out.exists() or out.is_symlink():
        _remove(old)
        os.replace(out, old)  # a link or file moves as itself; its target is never touched
        os.replace(tmp, out)
        _remove(old)
    else:
        os.replace(tmp, out)
    sync_tree(out.parent, recursive=False)  # the rename itself
