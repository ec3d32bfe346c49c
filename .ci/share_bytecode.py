"""Hard-links the bytecode of one virtual environment into another where the other has the same package folder.

Usage: `python .ci/share_bytecode.py <from-venv> <to-venv>` (from `.ci/run`, for the per-package isolation runs).

The isolated environments are linked from the same uv cache as the full one, at the same locked versions, so their
sources are the same files with the same mtimes, and the full environment's `__pycache__` (compiled once at install)
is valid there. Without it every isolated run compiles torch and transformers from source on import (the CI machine
sets PYTHONDONTWRITEBYTECODE). Only folders that exist in the target get bytecode: Python never imports a module
from `__pycache__` without its source, so a package the target lacks stays unimportable. A `.pyc` whose source
differs after all is detected by its recorded mtime and size, and recompiled.
"""

from __future__ import annotations

import os
import pathlib
import sys


def site_packages(venv: pathlib.Path) -> pathlib.Path:
    """The one `lib/python3.*/site-packages` folder of `venv`.

    Raises:
        ValueError: `venv` has none, or more than one.
    """
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise ValueError(f"{venv}: expected one lib/python3*/site-packages, found {[str(f) for f in found]}")
    return found[0]


def share(source: pathlib.Path, target: pathlib.Path) -> int:
    """Links each `__pycache__` file of `source` into `target`'s same folder, where that folder exists.

    Args:
        source: a site-packages folder with bytecode.
        target: a site-packages folder (files already there are kept).

    Returns:
        The number of `.pyc` files linked.
    """
    linked = 0
    for root, dirs, files in os.walk(source):
        rel = pathlib.Path(root).relative_to(source)
        if rel.name == "__pycache__":
            if (target / rel.parent).is_dir():
                (target / rel).mkdir(exist_ok=True)
                for name in files:
                    if not (target / rel / name).exists():
                        os.link(pathlib.Path(root) / name, target / rel / name)
                        linked += 1
            dirs.clear()
        elif not (target / rel).is_dir():
            dirs.clear()  # a package the target lacks: none of its folders exist there either
    return linked


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: share_bytecode.py <from-venv> <to-venv>")
    src, dst = (site_packages(pathlib.Path(a)) for a in sys.argv[1:])
    sys.stdout.write(f"share_bytecode: {share(src, dst)} .pyc linked from {src} into {dst}\n")
