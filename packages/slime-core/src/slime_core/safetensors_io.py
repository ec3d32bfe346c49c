"""Write safetensors files with the permissions any other file of the directory gets.

safetensors >= 0.8 writes through a temporary file that is always created with mode 0600 and renamed into place
(safetensors/safetensors#782, fix pending in #789), so a `model.safetensors` next to a 0644 `config.json` is
readable by its owner only: a serving process or a teammate under another uid then cannot load the export.
`save_safetensors` gives the file what `open()` would: `0o666` masked by the process umask.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from safetensors.torch import save_file

__all__ = ["new_file_mode", "save_safetensors"]


def _umask() -> int:
    # /proc tells without changing it; os.umask(0) would briefly give files other threads create mode 0666.
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The permission bits `open(path, "w")` gives a new file in this process: `0o666 & ~umask` (e.g. 0o644)."""
    return 0o666 & ~_umask()


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None
) -> None:
    """`safetensors.torch.save_file`, then the file's mode set to `new_file_mode()` (not safetensors' 0600).

    Args:
        tensors: name → contiguous tensor, as `save_file` takes them.
        path: the file to write.
        metadata: the header's `__metadata__` strings (e.g. `{"format": "pt"}`).

    Raises:
        Whatever `save_file` or `os.chmod` raise (OSError for a full disk or a read-only folder).
    """
    save_file(dict(tensors), os.fspath(path), metadata=None if metadata is None else dict(metadata))
    os.chmod(path, new_file_mode())
