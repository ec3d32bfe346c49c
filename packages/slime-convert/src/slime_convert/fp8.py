"""BF16 HF checkpoint → blockwise-FP8 serving checkpoint (`slime-convert hf-to-fp8`).

The result is what SGLang serves for FP8 rollout and what `--hf-checkpoint` names in that mode (the original's
`tools/convert_hf_to_fp8.py --strategy block --block-size 128 128`): decoder-layer linear weights as e4m3 plus
`weight_scale_inv` per block (`slime_core.fp8`), everything else copied as is, and `config.json` with the
`quantization_config` SGLang's `Fp8Config` reads. The trainer keeps training the BF16 original (`--ref-load`);
every weight push is quantized the same way, so engine and checkpoint agree on the format.

Usage:
    slime-convert hf-to-fp8 --hf-checkpoint /models/Qwen3-4B --save /models/Qwen3-4B-FP8 [--block-size 128 128]
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil

from safetensors import SafetensorError
from safetensors.torch import load_file
from tqdm import tqdm

from slime_convert.hf_io import INDEX_NAME
from slime_convert.staged import staged_output
from slime_core.fp8 import FP8_DTYPE, SCALE_SUFFIX, Fp8Config, quantize_named
from slime_core.hf_checkpoint import read_weight_map
from slime_core.safetensors_io import save_safetensors

logger = logging.getLogger(__name__)

__all__ = ["hf_to_fp8"]


def hf_to_fp8(
    hf_dir: str | pathlib.Path,
    save_dir: str | pathlib.Path,
    *,
    block_size: tuple[int, int] = (128, 128),
    force: bool = False,
    progress: bool = True,
) -> Fp8Config:
    """Writes the blockwise-FP8 serving checkpoint of an unquantized HF checkpoint, one safetensors file at a time.

    Peak memory is one input shard plus its quantized copy. Shard names are kept; the index is rewritten with the
    added `*.weight_scale_inv` tensors. `modules_to_not_convert` lists every ≥2-D weight left unquantized
    (embeddings, `lm_head`, routers, vision towers), as the original converter does.

    Args:
        hf_dir: input HF directory (config.json + *.safetensors + tokenizer files).
        save_dir: output directory (created; must not exist unless `force`). Written as `<save_dir>.tmp` and
            renamed when complete, so a failure (a full disk, a truncated input) leaves `save_dir` as it was.
        block_size: `(rows, columns)` per scale (`--block-size`).
        force: replace an existing `save_dir` once the new checkpoint is complete.
        progress: show a progress bar over the shards.

    Returns:
        The `Fp8Config` written into the output's `config.json`.

    Raises:
        FileNotFoundError: `hf_dir` has no config.json or no safetensors file.
        FileExistsError: `save_dir` exists and `force` is False (ValueError if it is or holds `hf_dir`).
        ValueError: the input is already quantized, a block size is not positive, an input shard is not a
            complete safetensors file, or the index names a shard that does not exist (named). Shards the index
            does not name are not read (a warning names them).
    """
    src, out = pathlib.Path(hf_dir), pathlib.Path(save_dir)
    if len(block_size) != 2 or min(block_size) <= 0:
        raise ValueError(f"--block-size needs two positive integers, got {list(block_size)}")
    config_path = src / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: no such file (--hf-checkpoint must be an HF model directory)")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_path}: not JSON ({e})") from e
    if config.get("quantization_config"):
        raise ValueError(f"{config_path}: already quantized ({config['quantization_config'].get('quant_method')!r})")
    files = _input_shards(src)
    with staged_output(out, force=force, flag="--save", inputs={"--hf-checkpoint": src}) as tmp:
        cfg, num_quantized, total = _write_fp8(src, tmp, files, config, block_size, progress)
    logger.info("%s: %d weights quantized to FP8 (block %s), %d kept; %.2f GB", out, num_quantized,
                list(cfg.weight_block_size), len(cfg.modules_to_not_convert), total / 1e9)  # fmt: skip
    return cfg


def _input_shards(src: pathlib.Path) -> list[pathlib.Path]:
    """The shards to quantize: those the index names (a left-over shard beside them is warned of, not read).

    Every `*.safetensors` was read, so a stale shard of an older save holding the same names won the index (last in
    sorted order) and the FP8 checkpoint served the old weights.

    Raises:
        FileNotFoundError: no index and no `*.safetensors`.
        ValueError: the index does not parse, or names a shard outside `src` or one that does not exist.
    """
    index = src / INDEX_NAME
    if not index.is_file():
        files = sorted(src.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{src}: no *.safetensors")
        return files
    listed = sorted(set(read_weight_map(index).values()))
    missing = [name for name in listed if not (src / name).is_file()]
    if missing:
        raise ValueError(f"{index}: names {missing[:3]}, which do not exist")
    stray = sorted(p.name for p in src.glob("*.safetensors") if p.name not in listed)
    if stray:
        logger.warning(
            "%s: %d safetensors files are not in the index and are not read: %s", index, len(stray), stray[:3]
        )
    return [src / name for name in listed]


def _write_fp8(
    src: pathlib.Path,
    out: pathlib.Path,
    files: list[pathlib.Path],
    config: dict,
    block_size: tuple[int, int],
    progress: bool,
) -> tuple[Fp8Config, int, int]:
    """Writes the quantized shards, the other files, config and index into `out`; (config, quantized, bytes)."""
    cfg = Fp8Config(weight_block_size=(int(block_size[0]), int(block_size[1])))
    weight_map: dict[str, str] = {}
    kept: set[str] = set()
    total = num_quantized = 0
    for f in tqdm(files, desc="hf-to-fp8", disable=not progress):
        try:
            loaded = load_file(str(f))
        except SafetensorError as e:  # a truncated copy
            raise ValueError(f"{f}: not a complete safetensors file ({e})") from e
        tensors = {}
        for name, t in quantize_named(loaded.items(), cfg):
            tensors[name] = t.contiguous()
            num_quantized += name.endswith(SCALE_SUFFIX)
            if name.endswith(".weight") and t.dim() >= 2 and t.is_floating_point() and t.dtype != FP8_DTYPE:
                kept.add(name.removesuffix(".weight"))
        save_safetensors(tensors, str(out / f.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, f.name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    cfg = Fp8Config(weight_block_size=cfg.weight_block_size, modules_to_not_convert=tuple(sorted(kept)))
    config["quantization_config"] = cfg.to_quantization_config()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return cfg, num_quantized, total
