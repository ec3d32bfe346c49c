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
import math
import pathlib
import re
import shutil

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from tqdm import tqdm

from slime_convert.hf_io import INDEX_NAME
from slime_convert.staged import staged_output
from slime_core.fp8 import FP8_DTYPE, SCALE_SUFFIX, Fp8Config, is_quantized_weight, quantize_named
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
        ValueError: the input is already quantized, a block size is not positive, a weight SGLang fuses has a row
            count that is not a multiple of the block's (`_check_servable_blocks`; named with its shape, before
            anything is written), an input shard is not a complete safetensors file, or the index names a shard
            that does not exist (named). Shards the index does not name are not read (a warning names them).
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
    _check_servable_blocks(src, _weight_shapes(files), (int(block_size[0]), int(block_size[1])))
    with staged_output(out, force=force, flag="--save", inputs={"--hf-checkpoint": src}) as tmp:
        cfg, num_quantized, total = _write_fp8(src, tmp, files, config, block_size, progress)
    logger.info("%s: %d weights quantized to FP8 (block %s), %d kept; %.2f GB", out, num_quantized,
                list(cfg.weight_block_size), len(cfg.modules_to_not_convert), total / 1e9)  # fmt: skip
    return cfg


# The weights SGLang loads into one fused linear layer (q/k/v_proj into qkv_proj, gate/up_proj into gate_up_proj,
# an MoE expert's gate/up too): its FP8 block check (`Fp8LinearMethod.create_weights`, `Fp8MoEMethod`) needs each
# part's rows to be a multiple of the block's, even on one GPU, since a block may not straddle two parts.
_FUSED_PARTS = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$")
_FLOAT_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


def _weight_shapes(files: list[pathlib.Path]) -> dict[str, tuple[int, ...]]:
    """The shapes of the floating tensors of `files`, read from their headers (no tensor data read).

    Raises:
        ValueError: a shard is not a complete safetensors file.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                    view = handle.get_slice(name)
                    if view.get_dtype() in _FLOAT_DTYPES:
                        shapes[name] = tuple(view.get_shape())
        except SafetensorError as e:  # a truncated copy
            raise ValueError(f"{f}: not a complete safetensors file ({e})") from e
    return shapes


def _check_servable_blocks(src: pathlib.Path, shapes: dict[str, tuple[int, ...]], block: tuple[int, int]) -> None:
    """Refuses a block SGLang cannot serve these weights with; warns when only the run's weight check cannot.

    A fused part whose rows are not a multiple of the block's rows (qwen3-tiny's 16-row q_proj with 128 x 128
    blocks) makes SGLang refuse the checkpoint when it loads; it was written and then refused by the run, whose
    message named the weight check. A partial column block is served, but the weight check after each sync
    dequantizes as SGLang's `/weights_checker` does, which takes it as a whole one (`slime_app.fp8_rollout`).

    Raises:
        ValueError: a fused part's rows are not a multiple of `block[0]`; names the weights, their shapes, the
            block and a `--block-size` that fits.
    """
    cfg = Fp8Config(weight_block_size=block)
    quantized = {
        name: shape for name, shape in shapes.items()
        if is_quantized_weight(name, torch.empty(shape, device="meta"), cfg)
    }  # fmt: skip
    rows = {n: shape for n, shape in quantized.items() if _FUSED_PARTS.search(n) and shape[-2] % block[0]}
    cols = {n: shape for n, shape in quantized.items() if shape[-1] % block[1]}
    if not rows and not cols:
        return
    # The largest power of two up to 128 that divides every fused part's rows and every weight's columns.
    sizes = [shape[-2] for n, shape in quantized.items() if _FUSED_PARTS.search(n)]
    sizes += [shape[-1] for shape in quantized.values()]
    common = math.gcd(*sizes)
    fits = min(common & -common, 128)
    block_flag = f"--block-size {block[0]} {block[1]}"

    def named(misfits: dict[str, tuple[int, ...]]) -> str:
        shown = ", ".join(f"{n} {list(shape)}" for n, shape in list(misfits.items())[:3])
        return shown + (f" and {len(misfits) - 3} more" if len(misfits) > 3 else "")

    if rows:
        raise ValueError(
            f"--hf-checkpoint {src}: {len(rows)} weight(s) cannot be served in {block[0]}x{block[1]} FP8 blocks "
            f"({block_flag}): SGLang fuses q/k/v_proj and gate/up_proj, and each part's row count must be a "
            f"multiple of the block's {block[0]} rows ({named(rows)}); nothing was written. Pass a --block-size "
            f"that divides them, e.g. --block-size {fits} {fits}"
        )
    logger.warning(
        "--hf-checkpoint %s: %d weight(s) have a column count that is not a multiple of the %d-column block (%s): "
        "SGLang serves them, but a run's weight check after each sync (--check-weight-sync, on by default) cannot "
        "dequantize them as SGLang's checker does; such a run needs --no-check-weight-sync, or convert with "
        "--block-size %d %d",
        src, len(cols), block[1], named(cols), fits, fits,
    )  # fmt: skip


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
