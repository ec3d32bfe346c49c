"""Where the run writes (`--output-dir`, `--save`, `--save-hf`): checked before the run starts, failures in one line.

A `--save` the run cannot write (a read-only mount, a path under a file) was found at the first save, after the
engines started and a whole rollout trained; a full disk during a save ended the run in a 60-line traceback whose
last line was torch's zip writer (`unexpected pos 704 vs 598`), naming neither the flag nor the disk.
`check_writable` creates each output folder and writes one probe file there before anything starts; `save_failed`
turns a failed save into one line: what was saved where, the underlying error, the free space left there, and the
last complete checkpoint, which the atomic save (`slime_core.dir_swap`) left intact.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import ray.exceptions

from slime_core.config import SlimeArgs

__all__ = ["SaveFailed", "check_writable", "output_dirs", "root_cause", "save_failed"]

TRACKER = "latest_checkpointed_iteration.txt"  # the tracker file of FSDP and Megatron checkpoints


class SaveFailed(RuntimeError):
    """A checkpoint or HF export could not be written; the message is the one line to show."""


def output_dirs(cfg: SlimeArgs) -> Iterator[tuple[str, pathlib.Path]]:
    """(flag, folder) of every place the run writes into.

    `--output-dir`, `--save`, and the folder `--save-hf`'s exports go into (the parent of the templated path,
    `{rollout_id}` filled with 0).
    """
    yield "--output-dir", pathlib.Path(cfg.output_dir)
    if cfg.save:
        yield "--save", pathlib.Path(cfg.save)
    if cfg.save_hf:
        yield "--save-hf", pathlib.Path(cfg.save_hf.format(rollout_id=0)).resolve().parent


def check_writable(cfg: SlimeArgs) -> None:
    """Creates each output folder and writes and removes one probe file in it.

    Args:
        cfg: reads `output_dir`, `save`, `save_hf`.

    Raises:
        OSError: a folder cannot be created or written (the message names the flag and the folder); the
            driver prints it as one line before anything starts.
    """
    for flag, folder in output_dirs(cfg):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".slime-write-check-"):
                pass
        except OSError as e:
            raise OSError(f"{flag} {folder} is not writable: {e.strerror or e}") from e


def root_cause(error: BaseException) -> BaseException:
    """The error underneath Ray's task wrapper, DCP's per-rank collection and explicit `raise ... from` chains."""
    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, BaseException):
            error = error.cause
            continue
        failures = getattr(error, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict) and failures:
            first = next(iter(failures.values()))
            if isinstance(first, tuple) and first and isinstance(first[0], BaseException):
                error = first[0]
                continue
        if error.__cause__ is not None:
            error = error.__cause__
            continue
        break
    return error


def _free_space(path: pathlib.Path) -> str:
    """`"12.3 GiB free there"` for the filesystem holding `path` (its nearest existing ancestor)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = float(shutil.disk_usage(probe).free)
    except OSError:
        return "free space unknown"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while free >= 1024 and i < len(units) - 1:
        free /= 1024
        i += 1
    return f"{free:.0f} B free there" if i == 0 else f"{free:.1f} {units[i]} free there"


def _last_checkpoint(save: pathlib.Path) -> str:
    try:
        step = (save / TRACKER).read_text().strip()
    except OSError:
        return "no complete checkpoint there yet"
    return f"the last complete checkpoint there (iteration {step}) is intact: resume with --load {save}"


def save_failed(what: str, flag: str, path: str | os.PathLike[str], error: BaseException) -> SaveFailed:
    """The one-line error of a failed save.

    Args:
        what: what was being saved, e.g. `"the checkpoint of rollout 3"`.
        flag: `--save` or `--save-hf`.
        path: where it was going.
        error: what the save raised (a Ray task error wrapping the rank's error, possibly DCP's collection).

    Returns:
        `SaveFailed`, e.g. `saving the checkpoint of rollout 0 to --save /ckpt failed: RuntimeError: [enforce fail
        at inline_container.cc:672] . unexpected pos 704 vs 598 (0 B free there); no complete checkpoint there yet`.
    """
    cause = root_cause(error)
    text = " ".join(str(cause).split()) or "(no message)"
    folder = pathlib.Path(path)
    line = f"saving {what} to {flag} {folder} failed: {type(cause).__name__}: {text[:300]} ({_free_space(folder)})"
    if flag == "--save":
        line += f"; {_last_checkpoint(folder)}"
    return SaveFailed(line)
