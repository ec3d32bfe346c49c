"""Whether the shard files of a PyTorch Distributed Checkpoint hold every byte its `.metadata` points at.

A truncated or missing `__<rank>_<n>.distcp` (a partial copy, a crash before the save reached the disk) was found
by the trainer ranks' load, after Ray, the engines and the model build, as a rank's traceback. `.metadata` records
each stored item's file, offset and length: comparing those with the files' sizes reads no tensor.
"""

from __future__ import annotations

import os
import pathlib

__all__ = ["dcp_shard_problems"]


def dcp_shard_problems(ckpt_dir: str | os.PathLike[str]) -> list[str]:
    """One line per shard file of `ckpt_dir` that is missing or shorter than `.metadata` says.

    Args:
        ckpt_dir: a folder holding `.metadata` (FSDP's `model_and_optim/`, a torch_dist iteration).

    Returns:
        Lines like `__0_0.distcp holds 100 of its 7122 bytes`; empty when every file is whole (or no
        `.metadata` is there: the loaders name that).

    Raises:
        ValueError: `.metadata` cannot be read (names the file).
    """
    from torch.distributed.checkpoint import FileSystemReader

    folder = pathlib.Path(ckpt_dir)
    if not (folder / ".metadata").is_file():
        return []
    try:
        metadata = FileSystemReader(str(folder)).read_metadata()
    except Exception as e:  # noqa: BLE001 - torch's reader raises pickle/EOF errors on a truncated file
        raise ValueError(f"cannot read {folder / '.metadata'} ({type(e).__name__}: {e})") from None
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if isinstance(name, str):
            ends[name] = max(ends.get(name, 0), int(info.offset) + int(info.length))
    problems = []
    for name, end in sorted(ends.items()):
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif path.stat().st_size < end:
            problems.append(f"{name} holds {path.stat().st_size} of its {end} bytes")
    return problems


def checkpoint_state_dirs(root: pathlib.Path, kind: str, ckpt_step: int | None) -> list[pathlib.Path]:
    """The DCP folders a resume of `root` reads: FSDP's `model_and_optim/` and `ref/`, or the torch_dist iteration.

    Args:
        root: `--load` (a save folder, or Megatron's iteration folder).
        kind: `fsdp` or `torch_dist` (`slime_app.checkpoint_kinds.checkpoint_kind`); other kinds have none.
        ckpt_step: `--ckpt-step`, else the tracker's iteration.
    """
    from slime_app.checkpoint_kinds import iteration_dir
    from slime_core.checkpoint_dirs import FSDP_MODEL_DIR, REFERENCE_DIR, iteration_name

    if kind == "fsdp":
        step_dir = root / iteration_name(ckpt_step) if ckpt_step is not None else iteration_dir(root)
        return [step_dir / name for name in (FSDP_MODEL_DIR, REFERENCE_DIR)] if step_dir is not None else []
    if kind == "torch_dist":
        from slime_convert.torch_dist import resolve_iteration_dir

        try:
            return [resolve_iteration_dir(root, ckpt_step)]
        except (FileNotFoundError, ValueError):  # the checks of the checkpoint's kind name these
            return []
    return []


def check_shards(flag: str, root: pathlib.Path, folders: list[pathlib.Path], hint: str) -> None:
    """Refuses a checkpoint whose DCP folders lack bytes their `.metadata` points at (`dcp_shard_problems`).

    Raises:
        ValueError: naming the flag, the folder and each damaged shard, then `hint` (where to resume from); or an
            unreadable `.metadata` (names the flag and the file).
    """
    for folder in folders:
        try:
            problems = dcp_shard_problems(folder)
        except ValueError as e:  # the reader's error names the file, not which flag gave it
            raise ValueError(f"{flag} {root}: {e}; {hint}") from None
        if problems:
            shown = folder.relative_to(root) if folder.is_relative_to(root) else folder
            raise ValueError(
                f"{flag} {root}: {shown} was damaged after it was written (a partial copy, a crash before it reached "
                f"the disk): {'; '.join(problems)}; {hint}"
            )
