"""Where the run writes (`--output-dir`, `--save`, `--save-hf`): created and probed before the run starts.

A `--save` the run cannot write (a read-only mount, a path under a file) was found only at the first save, after the
engines started and a whole rollout trained. `check_writable` creates each output folder and writes one probe file
there before anything starts; a failed save later is one line (`slime_app.failures.save_failed`).
Before that, two places are refused outright (`check_places`): a folder inside one the run reads its weights from
(a save there rewrote the model the engines load), and one on a pseudo-filesystem (as root a `--save /dev/x`
passed the probe: devtmpfs takes files, in memory).
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterator

from slime_app.tracking import tensorboard_log_dir
from slime_core import dir_swap
from slime_core.checkpoint_dirs import (
    complete_iterations,
    critic_dirs,
    cut_saves,
    iteration_of,
    pinned_iteration,
    save_root,
    tracker_step,
)
from slime_core.config import SlimeArgs
from slime_core.config.base import flag_to_field

__all__ = [
    "check_creatable",
    "check_places",
    "check_writable",
    "fixed_folder",
    "foreign_iteration_warning",
    "later_iterations_warning",
    "nearest_existing",
    "output_dirs",
    "pseudo_filesystem",
    "remove_cut_saves",
    "reused_save_warning",
]

# Kernel and device filesystems (`/proc/self/mounts` types): files there are not storage, or not files at all.
_PSEUDO_FS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "pstore", "bpf",
    "configfs", "fusectl", "mqueue", "efivarfs", "binfmt_misc", "autofs", "nsfs", "hugetlbfs", "rpc_pipefs",
})  # fmt: skip
# Same, by place, for containers that mount a tmpfs over /dev (its /dev/shm is ordinary shared memory).
_PSEUDO_ROOTS = (pathlib.Path("/proc"), pathlib.Path("/sys"), pathlib.Path("/dev"))
_SHM = pathlib.Path("/dev/shm")
# (input flag, the output flag that makes it this run's own folder): `--load` == `--save` is a resume. The config
# field is the flag's (`flag_to_field`), so this one table says which flags are read.
_INPUTS = (("--hf-checkpoint", None), ("--ref-load", None), ("--load", "--save"), ("--critic-load", "--critic-save"),
           ("--opd-teacher-load", None))  # fmt: skip


def fixed_folder(template: str) -> pathlib.Path:
    """The deepest folder of a path template that no `{field}` changes.

    `runs/dumps/rollout_{rollout_id}.pt` -> `runs/dumps`; `runs/hf/{rollout_id}` -> `runs/hf`.
    """
    folder = pathlib.Path(template).parent
    while "{" in str(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def output_dirs(cfg: SlimeArgs) -> Iterator[tuple[str, pathlib.Path]]:
    """(flag, folder) of every place the run writes into.

    `--output-dir`, `--save`, the TensorBoard folder the run writes (`slime_app.tracking.tensorboard_log_dir`),
    `--wandb-dir` with `--use-wandb`, and
    for the path templates (`--save-hf`, `--save-debug-rollout-data`) the deepest folder no `{field}` of theirs
    changes.
    """
    yield "--output-dir", pathlib.Path(cfg.output_dir)
    if cfg.save:
        yield "--save", pathlib.Path(cfg.save)
    if cfg.use_tensorboard:
        # The folder the run's SummaryWriter opens (a file named `tensorboard` in --output-dir ended the run in
        # tensorboard's FileExistsError traceback).
        flag = (
            "--tensorboard-dir"
            if cfg.tensorboard_dir
            else "TENSORBOARD_DIR (environment)"
            if os.environ.get("TENSORBOARD_DIR")
            else "--tb-project-name"
            if cfg.tb_project_name
            else None
        )
        yield flag or "--output-dir (its tensorboard folder)", pathlib.Path(tensorboard_log_dir(cfg, cfg.output_dir))
    elif cfg.tensorboard_dir:
        yield "--tensorboard-dir", pathlib.Path(cfg.tensorboard_dir)
    if cfg.use_wandb and cfg.wandb_dir:
        yield "--wandb-dir", pathlib.Path(cfg.wandb_dir)  # W&B's files; an unwritable one was a traceback at start
    for flag, template in (("--save-hf", cfg.save_hf), ("--save-debug-rollout-data", cfg.save_debug_rollout_data)):
        if template:
            yield flag, fixed_folder(template)


def check_writable(cfg: SlimeArgs) -> None:
    """Creates each output folder and writes and removes one probe file in it.

    Args:
        cfg: reads the flags `output_dirs` lists.

    Raises:
        OSError: a folder cannot be created or written (the message names the flag and the folder); the
            driver prints it as one line before anything starts.
    """
    check_places(cfg)
    for flag, folder in output_dirs(cfg):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".slime-write-check-"):
                pass
        except OSError as e:
            raise OSError(f"{flag} {folder} is not writable: {e.strerror or e}") from e


def reused_save_warning(cfg: SlimeArgs) -> str | None:
    """The warning for a `--save` holding checkpoints this run does not resume (its `--load` is another folder).

    The original writes into it all the same, and so does this run, iteration by iteration; but until its first
    save the folder's tracker still names the earlier run's latest checkpoint, so a kill meanwhile and a `--load` of
    this `--save` resumed the earlier run, with no word that it was another run's.

    Returns:
        The warning, or None when `--save` holds no complete checkpoint or is `--load`.
    """
    # `--load <save>/iter_XXXXXXX` (Megatron) resumes this folder's checkpoint too.
    if not cfg.save or (cfg.load and os.path.realpath(save_root(cfg.load)) == os.path.realpath(cfg.save)):
        return None
    steps = complete_iterations(cfg.save)
    if not steps:
        return None
    latest = tracker_step(cfg.save)
    named = f"; its tracker names {latest}" if latest is not None else ""
    if cfg.start_rollout_id is not None or not cfg.load:
        start = f"starts at rollout {cfg.start_rollout_id or 0}"
    elif tracker_step(cfg.load) is not None or save_root(cfg.load) != pathlib.Path(cfg.load):
        start = "goes on from the checkpoint in --load"  # not rollout 0, as this said
    else:
        start = "starts at rollout 0"
    return (
        f"--save {cfg.save} holds checkpoints this run does not resume (iterations {steps[0]}-{steps[-1]}{named}; "
        f"--load is {cfg.load or 'not given'}): this run {start} and replaces "
        "them as it saves, and until its first save a --load of this folder resumes the earlier run's; give a new "
        "--save to keep them apart"
    )


def later_iterations_warning(cfg: SlimeArgs) -> str | None:
    """The warning for a resume of its own `--save` from an iteration older than the latest one there.

    `--ckpt-step` (or Megatron's `--load <save>/iter_XXXXXXX`) below the folder's latest branches the run off: as in
    the original, each save replaces the iteration of that number and moves the tracker to it. Until the first one,
    the tracker still names the earlier branch's latest, so a kill meanwhile and a plain `--load` resumed that branch;
    iterations past the run's last save stay from it (a `--ckpt-step` names them as if they were this run's).

    Returns:
        The warning, or None when this is no resume of `--save` or no complete iteration there is later.
    """
    if not cfg.save or not cfg.load or os.path.realpath(save_root(cfg.load)) != os.path.realpath(cfg.save):
        return None
    step = pinned_iteration(cfg.load, cfg.ckpt_step)
    later = [other for other in complete_iterations(cfg.save) if step is not None and other > step]
    if not later:
        return None
    which = f"iteration {later[0]}" if len(later) == 1 else f"iterations {later[0]}-{later[-1]}"
    latest = tracker_step(cfg.save)
    named = f" (its tracker names {latest})" if latest is not None else ""
    resumed = f"iteration {latest}" if latest is not None else "none of them"
    flag = f"--ckpt-step {cfg.ckpt_step}" if cfg.ckpt_step is not None else f"--load {cfg.load}"
    return (
        f"{flag}: --save {cfg.save} also holds the later {which} this run branches off from{named}: this run "
        f"replaces them as it saves, and until its first save a --load of this folder without --ckpt-step resumes "
        f"{resumed}; those past its last save stay from the earlier branch; give a new --save to keep them apart"
    )


def foreign_iteration_warning(cfg: SlimeArgs) -> str | None:
    """The warning for folders in `--save` named like an iteration (or its `.tmp`/`.old`) that slime did not write.

    A save replaces only what slime wrote (`slime_core.dir_swap`): the save that reaches such a name stops the run
    (exit 5), after that rollout trained. Said at start, naming them (a left-over of a version before the marker, a
    copy made by hand).

    Returns:
        The warning, or None when there is none.
    """
    root = pathlib.Path(cfg.save) if cfg.save else None
    if root is None or not root.is_dir():
        return None
    found = sorted(
        (child.name, reason) for child in root.iterdir()
        if iteration_of(child.name) is not None and (reason := dir_swap.refusal(child)) is not None
    )  # fmt: skip
    if not found:
        return None
    one = len(found) == 1
    return (
        f"--save {root}: {'; '.join(f'{name} {reason}' for name, reason in found)}: a save of "
        f"{'that iteration' if one else 'those iterations'} stops the run rather than replace "
        f"{'it' if one else 'them'}; move {'it' if one else 'them'} out of --save"
    )


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
    check_places(cfg)
    for flag, folder in output_dirs(cfg):
        existing = nearest_existing(folder)
        if not existing.is_dir():
            where = "is a file" if existing == folder else f"would be under {existing}, which is a file"
            raise OSError(f"{flag} {folder} is not writable: it {where}, not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise OSError(f"{flag} {folder} is not writable: {existing} does not allow this user to write")
    return ["output folders: each is a folder, or can be made in one, this user may write to (nothing created)"]


def _mounts() -> list[tuple[pathlib.Path, str]]:
    """(mount point, filesystem type) of this process's mounts; empty where `/proc/self/mounts` cannot be read."""
    try:
        lines = pathlib.Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3:  # octal escapes: a space in a mount point is written \040
            point = fields[1].encode().decode("unicode_escape")
            out.append((pathlib.Path(point), fields[2]))
    return out


def pseudo_filesystem(path: pathlib.Path) -> str | None:
    """The pseudo-filesystem `path` (or where it would be created) lies on, or None for real storage.

    Args:
        path: a folder that may not exist yet; its nearest existing ancestor decides, symlinks resolved.

    Returns:
        The mount's type (`devtmpfs`, `proc`, ...) when it is one of `_PSEUDO_FS`; `"/dev"`-style place names for a
        path under /proc, /sys or /dev (but not /dev/shm) on another type; None otherwise.
    """
    real = nearest_existing(path.absolute()).resolve()
    best: tuple[pathlib.Path, str] | None = None
    for point, fstype in _mounts():
        if real.is_relative_to(point) and (best is None or len(point.parts) >= len(best[0].parts)):
            best = (point, fstype)  # the last of equal mount points is the one on top
    if best is not None and best[1] in _PSEUDO_FS:
        return best[1]
    for root in _PSEUDO_ROOTS:
        if real.is_relative_to(root) and not real.is_relative_to(_SHM):
            return str(root)
    return None


def _inputs(cfg: SlimeArgs) -> Iterator[tuple[str, pathlib.Path, str | None]]:
    """(flag, resolved folder, paired output flag) of each folder the run reads weights from."""
    for flag, own in _INPUTS:
        value = getattr(cfg, flag_to_field(flag))
        if value:
            yield flag, pathlib.Path(value).resolve(), own


def check_places(cfg: SlimeArgs, *, filesystems: bool = True) -> None:
    """Refuses an output folder inside a folder the run reads weights from, or on a pseudo-filesystem.

    Outputs are `output_dirs` and `--critic-save`; inputs `--hf-checkpoint`, `--ref-load`, `--load`,
    `--critic-load` and `--opd-teacher-load`, compared with symlinks resolved. `--save` equal to `--load` (and
    `--critic-save` to `--critic-load`) is a resume and stays allowed, and so is any output inside that folder:
    the run writes there anyway.

    Args:
        cfg: the run config.
        filesystems: also refuse pseudo-filesystems; False on a Ray cluster, where the ranks write from other hosts
            whose mounts this host does not see (the folders' overlap is a matter of paths, checked everywhere).

    Raises:
        ValueError: naming both flags and both folders, or the flag, the folder and the filesystem type.
    """
    outputs = list(output_dirs(cfg))
    if cfg.critic_save:
        outputs.append(("--critic-save", pathlib.Path(cfg.critic_save)))
    resolved = {flag: folder.resolve() for flag, folder in outputs}
    for flag, folder in outputs:
        kind = pseudo_filesystem(folder) if filesystems else None
        if kind is not None:
            raise ValueError(
                f"{flag} {folder} is on a pseudo-filesystem ({kind}), not storage: give a folder on a disk"
            )
        out = resolved[flag]
        for in_flag, source, own in _inputs(cfg):
            if own is not None and resolved.get(own) == source:
                continue  # the run's own checkpoint folder (a resume): it writes there anyway
            if out.is_relative_to(source):
                where = "is" if out == source else "is inside"
                raise ValueError(
                    f"{flag} {folder} {where} {in_flag} {source}: the run would write into the folder it reads "
                    f"weights from; give {flag} a folder of its own"
                )


def remove_cut_saves(cfg: SlimeArgs) -> list[pathlib.Path]:
    """Deletes the staging folders of saves that never completed in `--save` (and the critic's), once a run ended.

    A save cut short (a full disk, a crash, Ctrl-C) leaves `iter_XXXXXXX.tmp`, which no reader uses and a later save
    removes only when it is of the same iteration: after a full disk the partial copy kept the space the user had to
    free, and every cut save of another iteration stayed for good. Call it after the run's processes are gone and
    while it still holds the folders' locks (`slime_app.run_lock`), so no save of this or another run is writing
    there. Only folders slime marked as its own are deleted (`slime_core.checkpoint_dirs.cut_saves`); one that cannot
    be deleted is left as it is.

    Returns:
        The folders deleted.
    """
    folders = {
        os.path.realpath(folder) for folder in (cfg.save, critic_dirs(cfg)[1] if cfg.use_critic else None) if folder
    }
    removed = []
    for folder in sorted(folders):
        for staging in cut_saves(folder):
            try:
                dir_swap.remove(staging)
            except OSError:
                continue
            removed.append(staging)
    return removed
