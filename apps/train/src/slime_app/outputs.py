"""Where the run writes (`--output-dir`, `--save`, `--save-hf`): created and probed before the run starts.

A `--save` the run cannot write (a read-only mount, a path under a file) was found only at the first save, after the
engines started and a whole rollout trained. `check_writable` creates each output folder and writes one probe file
there before anything starts; a failed save later is one line (`slime_app.failures.save_failed`).
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterator

from slime_app.tracking import tensorboard_log_dir
from slime_core.config import SlimeArgs

__all__ = ["check_creatable", "check_writable", "nearest_existing", "output_dirs"]


def _fixed_folder(template: str) -> pathlib.Path:
    """The deepest folder of a path template that no `{field}` changes.

    `runs/dumps/rollout_{rollout_id}.pt` -> `runs/dumps`; `runs/hf/{rollout_id}` -> `runs/hf`.
    """
    folder = pathlib.Path(template).parent
    while "{" in str(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def output_dirs(cfg: SlimeArgs) -> Iterator[tuple[str, pathlib.Path]]:
    """(flag, folder) of every place the run writes into.

    `--output-dir`, `--save`, the TensorBoard folder the run writes (`slime_app.tracking.tensorboard_log_dir`), and
    for the path templates (`--save-hf`, `--save-debug-rollout-data`) the deepest folder no `{field}` of theirs
    changes.
    """
    yield "--output-dir", pathlib.Path(cfg.output_dir)
    if cfg.save:
        yield "--save", pathlib.Path(cfg.save)
    if cfg.use_tensorboard:
        # The folder the run's SummaryWriter opens (a file named `tensorboard` in --output-dir ended the run in
        # tensorboard's FileExistsError traceback).
        flag = "--tensorboard-dir" if cfg.tensorboard_dir else "--tb-project-name" if cfg.tb_project_name else None
        yield flag or "--output-dir (its tensorboard folder)", pathlib.Path(tensorboard_log_dir(cfg, cfg.output_dir))
    elif cfg.tensorboard_dir:
        yield "--tensorboard-dir", pathlib.Path(cfg.tensorboard_dir)
    for flag, template in (("--save-hf", cfg.save_hf), ("--save-debug-rollout-data", cfg.save_debug_rollout_data)):
        if template:
            yield flag, _fixed_folder(template)


def check_writable(cfg: SlimeArgs) -> None:
    """Creates each output folder and writes and removes one probe file in it.

    Args:
        cfg: reads the flags `output_dirs` lists.

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


def nearest_existing(path: pathlib.Path) -> pathlib.Path:
    """`path` itself if it exists, else its nearest ancestor that does (the root at worst)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_creatable(cfg: SlimeArgs) -> list[str]:
    """`check_writable` without writing anything (`--dry-run`).

    Each output folder, or its nearest existing parent, must be a folder this user may write into. A `--save` or
    `--output-dir` naming a file, or a folder under a file, passed the dry run and stopped the run.

    Returns:
        One note for the report.

    Raises:
        OSError: naming the flag, the folder and the path in the way.
    """
    for flag, folder in output_dirs(cfg):
        existing = nearest_existing(folder)
        if not existing.is_dir():
            where = "is a file" if existing == folder else f"would be under {existing}, which is a file"
            raise OSError(f"{flag} {folder} is not writable: it {where}, not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise OSError(f"{flag} {folder} is not writable: {existing} does not allow this user to write")
    return ["output folders: each is a folder, or can be made in one, this user may write to (nothing created)"]
