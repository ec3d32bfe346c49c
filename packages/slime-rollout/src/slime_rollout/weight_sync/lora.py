"""LoRA weight sync (`--weight-sync lora`): only the adapter moves; the engines keep the base weights.

The trainer's buckets hold the adapter's tensors under PEFT names (`slime_core.lora`). Each update writes them
as a PEFT directory `<update_weight_disk_dir>/lora_v<N>` (`adapter_config.json` + `adapter_model.safetensors`,
written to a temporary name and renamed), then on every engine, generation paused: `/unload_lora_adapter` of the
previous version (an engine that holds none answers 400: the first update, a restarted engine), then
`/load_lora_adapter {lora_name, lora_path}`; the shared push sequence then sets the version
(`/update_weight_version`, which loading an adapter does not change). Requests select the adapter by name
(`lora_path` of `/generate`, set by `slime_rollout.engines.client.RolloutClient`).

The directory must be readable by the engines (a shared file system across machines). An adapter is small (for
rank r, `r · (in + out)` values per adapted layer), so the files cost milliseconds, not the model's gigabytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import shutil
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from slime_core.dir_swap import prepare_staging, swap_in
from slime_core.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LORA_NAME, adapter_config
from slime_core.safetensors_io import save_safetensors
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.transport import EngineError
from slime_rollout.weight_sync.updaters import Bucket, _EngineUpdater, _version_dir_name

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["LoraWeightUpdater", "write_adapter"]

logger = logging.getLogger(__name__)


def write_adapter(cfg: SlimeArgs, buckets: Iterable[Bucket], path: str | os.PathLike[str]) -> int:
    """Writes an adapter's tensors as a PEFT directory at `path` (atomically: `path.tmp`, then a rename).

    Args:
        cfg: the run config (`lora_*`, `hf_checkpoint` as the base model).
        buckets: lists of `(PEFT name, tensor)`.
        path: the directory: absent, empty or written by slime (replaced), else refused (`slime_core.dir_swap`).

    Returns:
        Bytes of tensor data written.

    Raises:
        ValueError: a name occurs twice.
        slime_core.dir_swap.ReplaceRefused: `path` (or its `.tmp`/`.old`) holds something slime did not write.
    """
    out = pathlib.Path(path)
    tmp = prepare_staging(out, flag="--update-weight-disk-dir")  # never deletes a folder slime did not write
    tensors: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        for name, tensor in bucket:
            if name in tensors:
                raise ValueError(f"adapter tensor {name!r} occurs twice")
            tensors[name] = tensor.detach().to("cpu").contiguous()
    save_safetensors(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(cfg), indent=2))
    swap_in(tmp, out, flag="--update-weight-disk-dir")
    return sum(t.numel() * t.element_size() for t in tensors.values())


async def _unload(engine: Any) -> None:
    """Unloads the run's adapter from one engine; an engine that holds none (first push, restarted) answers 400."""
    try:
        await engine.unload_lora_adapter(LORA_NAME)
    except EngineError as exc:
        if exc.status_code != 400:
            raise


class LoraWeightUpdater(_EngineUpdater):
    """Pushes the trainer's adapter into the engines as a freshly loaded LoRA adapter (see module docstring).

    Args:
        cfg: run config; reads `update_weight_disk_dir` (validation fills it with `--lora-rank`),
            `update_weight_disk_keep_files`, and the `lora_*` fields of the adapter config.
        client: the engines.
        pause_mode: `/pause_generation` mode around the update.

    Raises:
        ValueError: no `--update-weight-disk-dir`.
    """

    def __init__(self, cfg: SlimeArgs, client: RolloutClient, *, pause_mode: str = "abort"):
        super().__init__(client, pause_mode=pause_mode)
        if not cfg.update_weight_disk_dir:
            raise ValueError("--weight-sync lora writes adapter files: set --update-weight-disk-dir")
        self.cfg = cfg
        self.root = pathlib.Path(cfg.update_weight_disk_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self._current: pathlib.Path | None = None
        self._previous: pathlib.Path | None = None

    async def _send(self, buckets: Iterable[Bucket], weight_version: str) -> None:
        path = self.root / _version_dir_name(weight_version).replace("weight_v", "lora_v", 1)
        num_bytes = await asyncio.to_thread(write_adapter, self.cfg, buckets, path)
        await self.session.apply("unload_lora_adapter", _unload)  # a dead engine is dropped, as at any step
        await self.session.each("load_lora_adapter", lora_name=LORA_NAME, lora_path=str(path.resolve()))
        self._previous, self._current = self._current, path
        logger.info("LoRA adapter v%s (%.2f MB) loaded on %d engine(s)", weight_version, num_bytes / 1e6,
                    len(self.client.urls))  # fmt: skip

    def _after_update(self, weight_version: str) -> None:
        # The engines read the new directory; the one before it is no longer needed.
        if self._previous is not None and not self.cfg.update_weight_disk_keep_files:
            shutil.rmtree(self._previous, ignore_errors=True)
