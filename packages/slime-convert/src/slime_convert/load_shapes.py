"""A checkpoint given by a flag, checked against `--hf-checkpoint`'s config.json from headers alone.

The trainers build the model from `--hf-checkpoint`'s config.json and then read weights from `--hf-checkpoint`,
`--ref-load` or `--load`. A checkpoint of another size (a 2-layer `--ref-load` for a 4B config) used to fail inside
the load, after the GPUs were set up, with "linear_qkv has 32 rows, expected 256", naming neither flag. These
checks read only safetensors headers or the torch_dist `.metadata` (no tensor data) and raise one error naming
the flag, the path, the first mismatching keys and the config fields; the dry run and every loader call them.
"""

from __future__ import annotations

import os
import re

from slime_convert.hf_io import HFCheckpointReader
from slime_convert.mapping import expand_mappings
from slime_convert.model_args import ModelArgs
from slime_convert.shapes import check_hf_shapes, check_torch_dist_shapes
from slime_convert.vocab_padding import check_torch_dist_padding

__all__ = ["check_hf_checkpoint", "check_torch_dist_checkpoint"]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _hint(flag: str, config_dir: str | os.PathLike[str]) -> str:
    if flag == "--hf-checkpoint":
        return "The weights do not match their own config.json: a field is missing or wrong there."
    return f"Is {flag} a checkpoint of the model --hf-checkpoint {config_dir} describes?"


def check_hf_checkpoint(
    flag: str,
    hf_dir: str | os.PathLike[str],
    args: ModelArgs,
    *,
    config_dir: str | os.PathLike[str],
    mapped_only: bool = False,
) -> bool:
    """Checks the safetensors of an HF directory against the architecture the trainer builds.

    Every tensor the trainer reads must be stored with the shape `args` implies (`slime_convert.shapes`), and the
    stored layers must be exactly `num_layers` (a missing layer or one beyond the config is a mismatch).
    `lm_head.weight` may be absent: the loaders then use the embedding.

    Args:
        flag: the flag that named `hf_dir` (`--hf-checkpoint`, `--ref-load`), for the message.
        hf_dir: the HF directory (safetensors shards; only their headers are read).
        args: the architecture from `<config_dir>/config.json`.
        config_dir: the directory whose config.json gave `args` (`--hf-checkpoint`).
        mapped_only: check nothing when no stored tensor has a name the mapping uses (a dry run's config-only
            folder, or names of another layout that its field comparison judges).

    Returns:
        Whether the tensors were checked (False only with `mapped_only`).

    Raises:
        ValueError: `"{flag} {hf_dir}: <key> in <file> has shape [...], expected [...]; <config> says <fields>."`,
            or a header that does not read (from `HFCheckpointReader`).
    """
    reader = HFCheckpointReader(hf_dir)
    try:
        needed = [n for mapping, layer, expert in expand_mappings(args) for n in mapping.hf_names(layer, expert)]
        present = [n for n in needed if n in reader]
        if mapped_only and not present:
            return False
        missing = [n for n in needed if n not in reader and n != "lm_head.weight"]
        beyond = sorted(
            {int(m.group(1)) for k in reader.keys() if (m := _LAYER.match(k))} - set(range(args.num_layers))
        )
        known = [f"{missing[0]} is missing ({len(missing)} tensors missing)"] if missing else []
        if beyond:
            known.append(f"layer {beyond[0]} is stored ({len(beyond)} layers beyond num_hidden_layers)")
        check_hf_shapes(
            present, reader.shape, args, hf_dir=config_dir, file_of=lambda n: reader.file(n).name,
            where=f"{flag} {hf_dir}", hint=_hint(flag, config_dir), known=known,
        )  # fmt: skip
    finally:
        reader.close()
    return True


def check_torch_dist_checkpoint(
    flag: str,
    path: str | os.PathLike[str],
    args: ModelArgs,
    *,
    config_dir: str | os.PathLike[str],
    ckpt_step: int | None = None,
    tensor_model_parallel_size: int | None = None,
) -> None:
    """Checks a torch_dist checkpoint (`--load`, `--ref-load`) against the architecture the trainer builds.

    Reads only the `.metadata` (and `common.pt` with `tensor_model_parallel_size`) of the iteration the loader would
    read; every mapped key must hold `num_layers` layers of the shape `args` implies
    (`slime_convert.shapes.check_torch_dist_shapes`).

    Args:
        flag: the flag that named `path`, for the message.
        path: a save dir (tracker file) or an iteration dir.
        args: the architecture from `<config_dir>/config.json`.
        config_dir: the directory whose config.json gave `args` (`--hf-checkpoint`).
        ckpt_step: the iteration the loader reads (`--ckpt-step`), else the tracker's.
        tensor_model_parallel_size: the TP degree of a Megatron model the checkpoint loads into: its vocabulary
            padding must then be the model's (`slime_convert.vocab_padding`); None (an export to HF) accepts any.

    Raises:
        ValueError: `"{flag} {path}: <key> has shape [...], expected [...]; <config> says <fields>."`, or a
            checkpoint written with another `--make-vocab-size-divisible-by` (naming both values).
        FileNotFoundError: no torch_dist checkpoint at `path`.
    """
    # Here, not at the top: torch's distributed checkpoint package (~2 CPU-s of imports) is needed only for a
    # torch_dist checkpoint, and every run's driver checks --hf-checkpoint through this module.
    from slime_convert.torch_dist import TorchDistReader, resolve_iteration_dir

    ckpt = TorchDistReader(resolve_iteration_dir(path, ckpt_step))
    check_torch_dist_shapes(
        ckpt.tensor_keys(), args, ckpt_dir=ckpt.dir, origin_hf_dir=config_dir, where=f"{flag} {path}",
        hint=_hint(flag, config_dir),
    )  # fmt: skip
    if tensor_model_parallel_size is not None:
        check_torch_dist_padding(f"{flag} {path}", ckpt.dir, args, tensor_model_parallel_size)
