"""Free space for the run's first save, checked against the model's size before anything starts.

A `--save` (or `--save-hf`) on a filesystem too small for one checkpoint failed at the first save, after the engines
started and a whole rollout trained. Every save holds at least the model's parameters in 16 bits, whatever the
backend (FSDP and Megatron keep fp32 master weights and optimizer moments besides, unless `--no-save-optim`); that
lower bound, read from the sizes of `--hf-checkpoint`'s weight files, is compared with the free space of each
filesystem the run saves to. LoRA checkpoints hold only the adapters: not checked.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from slime_app.outputs import fixed_folder, nearest_existing
from slime_core.config import SlimeArgs

__all__ = ["check_free_space", "min_save_bytes"]

_GIB = 1024**3
# Bytes per parameter of the weight files, by config.json's dtype (the safe default: 2, a 16-bit checkpoint).
_ITEMSIZE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def min_save_bytes(hf_checkpoint: str) -> int:
    """The smallest size one save of this model can have: its parameters in 16 bits.

    Args:
        hf_checkpoint: the `--hf-checkpoint` folder.

    Returns:
        Bytes: the size of its `*.safetensors` files (else `*.bin`) scaled from config.json's dtype to 2 bytes per
        parameter; 0 when it holds no weight files.
    """
    import json

    folder = pathlib.Path(hf_checkpoint)
    files = list(folder.glob("*.safetensors")) or list(folder.glob("*.bin"))
    total = sum(f.stat().st_size for f in files)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "bfloat16") if isinstance(config, dict) else ""
    return total * 2 // _ITEMSIZE.get(dtype.removeprefix("torch."), 2)


def check_free_space(cfg: SlimeArgs) -> None:
    """Each filesystem `--save` / `--save-hf` write to must hold one save of the model (`min_save_bytes` each).

    Args:
        cfg: reads `hf_checkpoint`, `save`, `save_hf`, `lora_rank`, `num_rollout`, `debug_rollout_only`.

    Raises:
        OSError: naming the flag(s), the folder, the bytes needed and the bytes free there.
    """
    if not cfg.hf_checkpoint or cfg.debug_rollout_only or cfg.num_rollout == 0 or cfg.lora_rank:
        return
    if not os.path.isdir(cfg.hf_checkpoint):
        return
    targets = [(flag, pathlib.Path(path)) for flag, path in (("--save", cfg.save), ("--save-hf", cfg.save_hf)) if path]
    if not targets:
        return
    need = min_save_bytes(cfg.hf_checkpoint)
    by_device: dict[int, list[tuple[str, pathlib.Path]]] = {}
    for flag, path in targets:
        folder = nearest_existing(fixed_folder(str(path)) if flag == "--save-hf" else path)
        by_device.setdefault(folder.stat().st_dev, []).append((flag, folder))
    for named in by_device.values():
        free = shutil.disk_usage(named[0][1]).free
        wanted = need * len(named)
        if free < wanted:
            flags = " and ".join(f"{flag} {folder}" for flag, folder in named)
            raise OSError(
                f"{flags}: one save needs at least {wanted / _GIB:.2f} GiB (the parameters of --hf-checkpoint "
                f"{cfg.hf_checkpoint} in 16 bits, before any optimizer state), only {free / _GIB:.2f} GiB free "
                "there; free space or save elsewhere"
            )
