"""A `--train-backend fsdp --lora-rank` checkpoint exported as a PEFT adapter folder (`slime-convert fsdp-to-hf`).

The trainer's DCP shards (`slime_train_fsdp.checkpoint`) hold a LoRA model's adapters under
`model.<module>.lora_A.default.weight` (`[r, in]`) and `model.<module>.lora_B.default.weight` (`[out, r]`),
`default` being peft's adapter name inside the trainer and `<module>` the adapted layer's HF name (checkpoints of
an earlier version hold the frozen base as well, which is not read); `meta.json`'s `model_flags` record
`--lora-rank`, `--lora-alpha` and `--lora-target-modules`. The folder written is what the run's `--save-hf` writes
(`slime_core.lora`): `adapter_model.safetensors` under PEFT names, `adapter_config.json` and the tokenizer files of
the base, so `PeftModel.from_pretrained(<origin model>, <out>)` and SGLang's `--lora-paths` load it. The adapter is
not merged into the base here: `PeftModel.merge_and_unload()` does that.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import shutil
from typing import Any

import torch

from slime_convert.hf_io import HFCheckpointReader
from slime_convert.staged import staged_output
from slime_convert.torch_dist import TorchDistReader
from slime_core.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, PEFT_PREFIX, TOKENIZER_FILE_PREFIXES, peft_config
from slime_core.safetensors_io import save_safetensors

__all__ = ["fsdp_lora_to_peft"]

logger = logging.getLogger(__name__)

_ADAPTER_KEY = re.compile(r"^model\.(?P<module>.+)\.(?P<part>lora_[AB])\.default\.weight$")


def fsdp_lora_to_peft(
    model_dir: pathlib.Path,
    model_flags: dict[str, Any],
    output_dir: str | os.PathLike[str],
    origin_hf_dir: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    force: bool = False,
) -> pathlib.Path:
    """Writes the adapter of the LoRA checkpoint `model_dir` as a PEFT folder at `output_dir` (see module doc).

    Args:
        model_dir: the checkpoint's `model_and_optim` folder.
        model_flags: its `meta.json`'s `model_flags` (`slime_train_fsdp.checkpoint.model_flags_of`).
        output_dir: the folder to create.
        origin_hf_dir: the run's `--hf-checkpoint`: every adapted layer must be one of its linear weights, of the
            adapter's in/out sizes; recorded as the adapter's base model, its tokenizer files copied.
        dtype: cast the adapter to this dtype (default: keep the stored float32).
        force: replace `output_dir` if it exists, once the new folder is complete.

    Returns:
        `output_dir`.

    Raises:
        ValueError: the checkpoint does not record `--lora-alpha` (saved by an earlier version: export with the run's
            `--save-hf`), holds no adapter, an A without its B, a rank other than `--lora-rank`, a layer outside
            `--lora-target-modules` or not in `origin_hf_dir` at the adapter's sizes, or a non-finite value.
        FileExistsError: `output_dir` exists and not `force`.
    """
    where = model_dir.parent
    rank, alpha, targets = (model_flags.get(k) for k in ("--lora-rank", "--lora-alpha", "--lora-target-modules"))
    if alpha is None or not targets:
        raise ValueError(
            f"{where}: a LoRA checkpoint whose meta.json does not record --lora-alpha (saved by an earlier version); "
            "export its adapter with the run's --save-hf (resume it with --save-hf set)"
        )
    ckpt = TorchDistReader(model_dir)
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, (shape, _) in ckpt.tensor_keys().items():
        if match := _ADAPTER_KEY.match(key):
            pairs.setdefault(match["module"], {})[match["part"]] = tuple(shape)
    origin = HFCheckpointReader(origin_hf_dir)
    try:
        problems = _problems(pairs, int(rank), set(targets), {n: tuple(origin.shape(n)) for n in origin.keys()})
    finally:
        origin.close()
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... ({len(problems)} in all)" if len(problems) > 5 else "")
        raise ValueError(f"{where}: not an adapter of --lora-rank {rank} on {origin_hf_dir}: {shown}")
    tensors: dict[str, torch.Tensor] = {}
    for module in sorted(pairs):
        for part in ("lora_A", "lora_B"):
            (tensor,) = ckpt.read([(f"model.{module}.{part}.default.weight", ())])
            tensor = tensor if dtype is None else tensor.to(dtype)
            name = f"{PEFT_PREFIX}{module}.{part}.weight"
            if not torch.isfinite(tensor).all():
                raise ValueError(f"{where}: {name} holds inf or NaN{'' if dtype is None else f' as {dtype}'}")
            tensors[name] = tensor.contiguous()
    config = peft_config(int(rank), float(alpha), list(targets), base_model=os.path.abspath(origin_hf_dir))
    inputs = {"--input-dir": where, "--origin-hf-dir": origin_hf_dir}
    with staged_output(pathlib.Path(output_dir), force=force, flag="--output-dir", inputs=inputs) as tmp:
        save_safetensors(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))
        for f in pathlib.Path(origin_hf_dir).iterdir():
            if f.is_file() and f.name.startswith(TOKENIZER_FILE_PREFIXES):
                shutil.copy2(f, tmp / f.name)
    logger.info("wrote the LoRA adapter (%d layers, r=%s) to %s", len(pairs), rank, output_dir)
    return pathlib.Path(output_dir)


def _problems(
    pairs: dict[str, dict[str, tuple[int, ...]]], rank: int, targets: set[str], origin: dict[str, tuple[int, ...]]
) -> list[str]:
    """What keeps `pairs` (`{module: {"lora_A": shape, "lora_B": shape}}`) from being an adapter on `origin`."""
    if not pairs:
        return ["it holds no lora_A/lora_B tensor"]
    problems = []
    for module, parts in sorted(pairs.items()):
        base = origin.get(f"{module}.weight")
        if set(parts) != {"lora_A", "lora_B"}:
            problems.append(f"{module}: lora_A without lora_B or the reverse")
        elif module.rsplit(".", 1)[-1] not in targets:
            problems.append(f"{module}: not one of --lora-target-modules {sorted(targets)}")
        elif base is None or len(base) != 2:
            problems.append(f"{module}: no such linear weight in the origin")
        elif parts["lora_A"] != (rank, base[1]) or parts["lora_B"] != (base[0], rank):
            problems.append(
                f"{module}: A {list(parts['lora_A'])}, B {list(parts['lora_B'])} do not fit r={rank} on its "
                f"{list(base)} weight"
            )
    return problems
