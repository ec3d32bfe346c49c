"""One run per output folder: the driver locks `.slime-run.lock` in `--output-dir`, `--save`, `--critic-save`.

`--save-hf` is locked too: in its fixed folder when templated, else by a lock file beside the export.

A run launched on the folders of a run that still ran (a relaunch, a copied launch line) wrote into them alongside
it: the two runs' checkpoints, data cursors and tracker files interleaved, so a resume could pair one run's model
with the other's data cursor, and both TensorBoard streams landed in one folder. The lock is `flock`: the kernel
drops it when the driver exits however it ends (kill -9 included), so a crashed run never leaves a stale lock; the
file holds the holder's pid, host and start time for the message.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import pathlib
import socket
from collections.abc import Iterator

from slime_app.outputs import fixed_folder
from slime_core.config import SlimeArgs

__all__ = ["LOCK_NAME", "RunLocked", "lock_run_folders", "release_run_folders", "unless_in_use"]

LOCK_NAME = ".slime-run.lock"

_held: list[int] = []  # the driver's lock descriptors: kept open for the whole process


class RunLocked(ValueError):
    """Another live run holds the lock of an output folder; the message names the flag, folder and holder."""


def _export_lock(template: str) -> pathlib.Path:
    """The lock file of a `--save-hf` path: in its fixed folder when templated, else beside the export.

    A fixed export folder is replaced whole by each export (`slime_core.dir_swap`): a lock file inside it would go
    with the old copy, so it lives beside it (`.hf.slime-run.lock` for `runs/hf`).
    """
    if "{" in template:
        return fixed_folder(template) / LOCK_NAME
    export = pathlib.Path(template)
    return export.parent / f".{export.name}{LOCK_NAME}"


def _folders(cfg: SlimeArgs) -> list[tuple[str, pathlib.Path, pathlib.Path]]:
    """(flag, folder, lock file) of each place one run at a time may write."""
    out: list[tuple[str, pathlib.Path, pathlib.Path]] = []
    seen: set[str] = set()
    # The critic's checkpoints go to <--save>/critic unless --critic-save names a folder of its own: locked too.
    critic_save = cfg.critic_save if cfg.use_critic else None
    for flag, folder in (("--output-dir", cfg.output_dir), ("--save", cfg.save), ("--critic-save", critic_save)):
        if folder and os.path.realpath(folder) not in seen:
            seen.add(os.path.realpath(folder))
            out.append((flag, pathlib.Path(folder), pathlib.Path(folder) / LOCK_NAME))
    if cfg.save_hf:
        # Two runs exporting to one --save-hf: each export's staging step deleted the other's staging folder
        # (`dir_swap.prepare_staging`), failing its save, or the two runs' exports replaced each other.
        lock = _export_lock(cfg.save_hf)
        if os.path.realpath(lock) not in {os.path.realpath(taken) for _, _, taken in out}:  # one lock file once
            out.append(("--save-hf", pathlib.Path(cfg.save_hf), lock))
    return out


def _try_lock(lock: pathlib.Path) -> tuple[int, bool]:
    """Opens (creating) the lock file `lock` and tries its exclusive `flock` without waiting.

    Returns:
        `(descriptor, taken)`: the caller closes the descriptor, which drops the lock when it was taken.

    Raises:
        OSError: the file cannot be opened (a read-only folder).
    """
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return fd, False
    except BaseException:
        os.close(fd)
        raise
    return fd, True


def lock_run_folders(cfg: SlimeArgs) -> None:
    """Takes the run lock of `--output-dir`, `--save`, `--critic-save` and `--save-hf` for the rest of this process.

    Call once in the driver, after the folders were checked writable and before Ray starts.

    Raises:
        RunLocked: another run holds one of them, e.g. `--save /ckpt: another slime run writes there (pid 4242 on
            host gpu-1, since 2026-12-05 16:02:11 UTC); stop it or wait for it to end, or give this run another
            --save` (no lock of this run is kept then).
        OSError: a folder cannot be created or the lock file opened.
    """
    taken: list[int] = []
    try:
        for flag, folder, lock in _folders(cfg):
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd, free = _try_lock(lock)
            taken.append(fd)
            if not free:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "holder unknown"
                raise RunLocked(
                    f"{flag} {folder}: another slime run writes there ({holder}); stop it or wait for it to end, or "
                    f"give this run another {flag}"
                )
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since {now}\n".encode(), 0)
    except BaseException:
        for fd in taken:
            os.close(fd)  # closing drops a lock this call took
        raise
    _held.extend(taken)


def release_run_folders() -> None:
    """Drops the locks `lock_run_folders` took (tests; a driver's exit drops them anyway)."""
    while _held:
        os.close(_held.pop())


@contextlib.contextmanager
def unless_in_use(folder: str | os.PathLike[str]) -> Iterator[bool]:
    """Holds `folder`'s run lock for the block when no live run holds it; yields whether it does.

    For a repair before this run takes its own locks (`slime_app.checkpoints` restoring a cut save): it must not
    rename anything in a folder another run is writing. An existing folder without a lock file gets one.

    Raises:
        OSError: the lock file cannot be opened (a read-only folder).
    """
    fd, free = _try_lock(pathlib.Path(folder) / LOCK_NAME)
    try:
        yield free
    finally:
        os.close(fd)  # drops the lock if taken
