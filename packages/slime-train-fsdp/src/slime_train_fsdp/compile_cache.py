"""torch.compile's artifacts kept beside the checkpoints, so a resumed run skips the compile warm-up.

The compiled decoder layers (`--fsdp-compile-layers`) cost tens of seconds at the first step of every launch
(issue 26). torch keeps them in a per-machine cache directory; a restart on the same machine finds them, a restart
on another machine (a preempted job rescheduled elsewhere) does not. torch's portable "mega-cache"
(`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) serializes what this process compiled: it is
written next to `--save`'s checkpoints and loaded from `--load` before the first forward. Artifacts made by
another torch/triton version or GPU kind are keyed differently and simply miss.
"""

from __future__ import annotations

import logging
import os
import pathlib

import torch

__all__ = ["CACHE_FILE", "load_compile_cache", "save_compile_cache"]

logger = logging.getLogger(__name__)

CACHE_FILE = "torch_compile_cache.bin"
"""File name under `--save` / `--load` (beside `iter_*` and the tracker file)."""


def save_compile_cache(save_dir: str | pathlib.Path) -> int:
    """Writes this process's compile artifacts to `save_dir/CACHE_FILE` (temp file, then rename).

    Args:
        save_dir: `--save`.

    Returns:
        Bytes written; 0 when the process compiled nothing (an existing file is then kept). torch's artifacts are
        cumulative over the process, so each save holds everything compiled since start-up.
    """
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is None or not artifacts[0]:
        return 0
    data = artifacts[0]
    path = pathlib.Path(save_dir) / CACHE_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(data)


def load_compile_cache(load_dir: str | pathlib.Path) -> bool:
    """Loads `load_dir/CACHE_FILE` into torch's compile caches, if present.

    A file torch cannot read is reported with a warning and skipped: the run then compiles as usual.

    Args:
        load_dir: `--load`.

    Returns:
        Whether artifacts were loaded.
    """
    path = pathlib.Path(load_dir) / CACHE_FILE
    if not path.is_file():
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - a stale or foreign cache must not stop a resume
        logger.warning("%s: not loaded (%s: %s); the first step compiles", path, type(exc).__name__, exc)
        return False
    if info is None:  # torch logs why and returns None for a corrupt or foreign file
        logger.warning("%s: not loaded (torch could not read it); the first step compiles", path)
        return False
    logger.info("%s: loaded torch.compile artifacts (%s)", path, info)
    return True
