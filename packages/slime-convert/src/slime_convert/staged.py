"""An output directory that appears whole or not at all: written as `<out>.tmp`, then swapped in over `<out>`.

A conversion that fails part way (a full disk, a truncated input, Ctrl-C) removes its `<out>.tmp` and leaves
`<out>` as it was, so `--force` never destroys the previous output before the new one is complete. The swap is
`slime_core.dir_swap.swap_in`: the files are flushed to the disk before the renames that publish them, the output is
marked as slime's, and a swap a crash interrupted (`<out>` moved to `<out>.old`, the new one not renamed in yet) is
undone before the next conversion looks at `<out>` (`slime_core.dir_swap.recover`).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
from collections.abc import Iterator, Mapping

from slime_core.dir_swap import prepare_staging, recover, remove, staging_dir, swap_in

__all__ = ["staged_output", "staged_save_root"]


def _refuse_replacing_inputs(out: pathlib.Path, flag: str, inputs: Mapping[str, str | os.PathLike[str]]) -> None:
    target = out.resolve()
    for input_flag, path in inputs.items():
        source = pathlib.Path(path).resolve()
        if source == target or target in source.parents:
            raise ValueError(
                f"{flag} {out} holds {input_flag} {path}: replacing it would delete the input; choose another {flag}"
            )


def _refuse_a_name_without_room_for_the_suffixes(out: pathlib.Path, flag: str) -> None:
    # The staging and swap names add ".tmp"/".old": a legal name within 4 bytes of the limit failed with
    # "[Errno 36] File name too long: '<out>.old'", naming a path the user never gave.
    parent = next((p for p in (out.parent, *out.parent.parents) if p.is_dir()), pathlib.Path("/"))
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows) or no answer: the common limit
        limit = 255
    size = len(os.fsencode(out.name))
    if size + len(".tmp") > limit:
        raise ValueError(
            f"{flag} {out}: its name is {size} bytes; it needs room for a 4-byte '.tmp' / '.old' suffix under this "
            f"filesystem's {limit}-byte limit (the output is staged beside it): choose a name of at most {limit - 4}"
        )


@contextlib.contextmanager
def staged_output(
    output: str | os.PathLike[str],
    *,
    force: bool,
    flag: str,
    exists_hint: str = "pass -f/--force to replace it",
    inputs: Mapping[str, str | os.PathLike[str]] | None = None,
) -> Iterator[pathlib.Path]:
    """Yields an empty staging directory that replaces `output` when the block ends without an exception.

    Args:
        output: the directory to create (or, with `force`, replace: a directory, a file or a link).
        force: replace an existing `output` (`-f/--force`).
        flag: the flag that named `output`, for the error message.
        exists_hint: what the error for an existing `output` advises (a command without `--force` says so).
        inputs: the conversion's input folders by flag; an `output` that is one of them or holds one is refused
            (`--force` would delete the checkpoint being read: links resolved).

    Yields:
        `<output>.tmp`, empty (a left-over of an interrupted run is removed first).

    Raises:
        ValueError: `output` is or holds one of `inputs`, or its name leaves no room for the `.tmp` suffix (raised
            before anything is written).
        FileExistsError: `output` exists (or an interrupted swap left it at `<output>.old`, now restored) and not
            `force` (raised before anything is written).
        slime_core.dir_swap.ReplaceRefused: not `force`, and `<output>.old` is something slime did not write.
    """
    out = pathlib.Path(output).absolute()  # "." has no name to put ".tmp" after
    _refuse_replacing_inputs(out, flag, inputs or {})
    _refuse_a_name_without_room_for_the_suffixes(out, flag)
    recover(out, flag=flag, force=force)  # an interrupted swap puts the previous output back first
    if (out.exists() or out.is_symlink()) and not force:
        raise FileExistsError(f"{flag} {out} exists ({exists_hint})")
    tmp = staging_dir(out)
    remove(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed conversion leaves nothing behind
        raise
    swap_in(tmp, out, flag=flag, force=force)


@contextlib.contextmanager
def staged_save_root(root: str | os.PathLike[str], *, flag: str) -> Iterator[pathlib.Path]:
    """Yields where to write a save root's contents (an iteration folder and the tracker) so they appear together.

    An absent or empty `root` is built whole as `<root>.tmp` and renamed in once when the block ends
    (`slime_core.dir_swap.swap_in`): a kill at any point leaves `root` as it was, and the next run removes the
    left-over `<root>.tmp`. It was written in place, the iteration folder renamed in first and the tracker second: a
    kill between the two renames left a complete folder no reader loads (Megatron's `--load <root>` reads the
    tracker first) that also blocked the next conversion ("exists"). A `root` that already holds something (or is a
    link, whose target is written into) cannot be replaced: `root` itself is yielded, and the caller writes the
    tracker last, which publishes the folder for a reader; so is the working directory.

    Args:
        root: the save root (`--save`).
        flag: the flag that named it, for error messages.

    Yields:
        `<root>.tmp` (empty, marked as slime's), or `root` (created if missing).

    Raises:
        slime_core.dir_swap.ReplaceRefused: a `<root>.tmp` or `<root>.old` that slime did not write is in the way.
    """
    out = pathlib.Path(root).absolute()
    _refuse_a_name_without_room_for_the_suffixes(out, flag)
    recover(out, flag=flag)  # a swap cut between its renames (an empty root moved aside) is undone first
    # In place also for the working directory: renaming it away would leave this process in a deleted folder.
    in_place = out.is_symlink() or out == pathlib.Path.cwd()
    if in_place or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        out.mkdir(parents=True, exist_ok=True)
        yield out
        return
    tmp = prepare_staging(out, flag=flag)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, out, flag=flag)
