"""Blockwise FP8 weights: BF16 training, FP8 serving (the original slime's "stable" low-precision rollout).

An FP8 serving checkpoint is an HF checkpoint whose `config.json` carries

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128], "modules_to_not_convert": [...]}

and whose decoder-layer linear weights are stored as `<module>.weight` (`torch.float8_e4m3fn`, `[M, N]`) plus
`<module>.weight_scale_inv` (float32, `[ceil(M/bm), ceil(N/bn)]`, one per bm×bn block), with
`weight ≈ fp8_weight · scale_inv` block by block. Embeddings, `lm_head`, norms, biases and MoE routers stay in
their original dtype. This is the layout of DeepSeek-V3's and Qwen3-*-FP8's checkpoints, what SGLang's `Fp8Config`
loads (`srt/layers/quantization/fp8.py`: `weight_scale_inv` of shape `[ceil(out/bn), ceil(in/bk)]`), and what the
original's `tools/convert_hf_to_fp8.py --strategy block` writes.

The scheme (per block, as the original's blockwise quantizer): `amax = max |w|` over the block, `scale_inv =
max(amax, 1e-12) / 448` (448 = largest finite e4m3fn), `q = clamp(w / scale_inv, ±448)` cast to e4m3fn (round to
nearest even). A partial block at the right or bottom edge is zero-padded for its amax, then cropped. Everything
runs in float32 on the tensor's device, so it works on CPU (no FP8 matmul is needed to quantize).

Which run serves FP8 is decided by the original's rule: `--hf-checkpoint` (what the engines load) has an FP8
`quantization_config`; the trainer keeps BF16 weights and quantizes every pushed tensor (`quantize_buckets`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Iterable, Iterator

import torch

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "SCALE_SUFFIX",
    "Fp8Config",
    "dequantize_blockwise",
    "dequantize_named",
    "pair_fp8",
    "is_quantized_weight",
    "quantize_blockwise",
    "quantize_buckets",
    "quantize_named",
    "read_fp8_config",
    "strip_quantization_config",
    "trainer_weights_dir",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
SCALE_SUFFIX = ".weight_scale_inv"
_AMAX_FLOOR = 1e-12  # an all-zero block (padding, an unused expert) would give 0/0 = NaN otherwise

# Never quantized (the original's converter and SGLang's FP8 models keep these in BF16): embeddings, the output head,
# norms, MoE routers (`mlp.gate.`, not `gate_proj`) and Qwen2-MoE's shared-expert gate (a plain Linear in SGLang),
# MTP projections, vision towers, and the gated delta-net's per-head gates and short conv (Qwen3-Next / Qwen3.5:
# SGLang builds `in_proj_ba` and `conv1d` with quant_config=None; the original quantizes only in_proj_qkv/z, out_proj).
_KEEP = re.compile(
    r"embed|lm_head|norm|\.mlp\.gate\.|router|shared_expert_gate|eh_proj|visual|vision"
    r"|linear_attn\.(in_proj_ba|in_proj_b|in_proj_a|conv1d)\."
)
_IN_LAYER = re.compile(r"(^|\.)layers\.\d+\.")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Fp8Config:
    """An FP8 serving checkpoint's `quantization_config` (blockwise e4m3, dynamic activation scales).

    Attributes:
        weight_block_size: `(bm, bn)` rows × columns per scale, e.g. `(128, 128)`.
        modules_to_not_convert: module names (no `.weight`) kept in their original dtype besides the built-in
            exclusions (embeddings, lm_head, norms, routers).

    Example:
        >>> Fp8Config(weight_block_size=(128, 128)).to_quantization_config()["quant_method"]
        'fp8'
    """

    weight_block_size: tuple[int, int] = (128, 128)
    modules_to_not_convert: tuple[str, ...] = ()

    def to_quantization_config(self) -> dict:
        """The `config.json` `quantization_config` entry SGLang and transformers read."""
        out: dict = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(self.weight_block_size),
        }
        if self.modules_to_not_convert:
            out["modules_to_not_convert"] = sorted(self.modules_to_not_convert)
        return out

    @classmethod
    def from_quantization_config(cls, qc: dict, *, source: str = "quantization_config") -> Fp8Config:
        """Validates a `quantization_config` dict.

        Raises:
            ValueError: not blockwise e4m3 FP8 with dynamic activation scales (names `source` and the key).
        """
        want = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
        for key, value in want.items():
            got = qc.get(key, "e4m3" if key == "fmt" else None)  # `fmt` is optional in Qwen3-*-FP8's configs
            if got != value:
                raise ValueError(f"{source}: {key}={got!r}; FP8 rollout needs {value!r} (blockwise e4m3, dynamic)")
        block = qc.get("weight_block_size")
        if not (
            isinstance(block, list | tuple) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
        ):
            raise ValueError(
                f"{source}: weight_block_size={block!r}; FP8 rollout needs blockwise scales, e.g. [128, 128] "
                "(per-tensor/per-channel FP8 checkpoints: convert with `slime-convert hf-to-fp8`)"
            )
        # SGLang's Fp8Config takes the first key present, `ignored_layers` before `modules_to_not_convert`.
        keep = qc["ignored_layers"] if "ignored_layers" in qc else qc.get("modules_to_not_convert")
        keep = keep or ()
        return cls(weight_block_size=(int(block[0]), int(block[1])), modules_to_not_convert=tuple(keep))


def read_fp8_config(hf_dir: str | pathlib.Path | None) -> Fp8Config | None:
    """The FP8 config of an HF checkpoint directory, or None when it holds unquantized weights.

    Args:
        hf_dir: HF checkpoint directory (e.g. `--hf-checkpoint`); None or a directory without `config.json` → None.

    Raises:
        ValueError: `quantization_config` names another method (int4, per-channel, ...) or is not blockwise e4m3;
            the message names the file.
    """
    if not hf_dir:
        return None
    path = pathlib.Path(hf_dir) / "config.json"
    if not path.is_file():
        return None
    qc = json.loads(path.read_text()).get("quantization_config")
    if qc is None:
        return None
    if qc.get("quant_method") != "fp8":
        raise ValueError(
            f"{path}: quantization_config.quant_method={qc.get('quant_method')!r}; this version serves unquantized "
            "or blockwise-FP8 checkpoints only (convert a BF16 checkpoint with `slime-convert hf-to-fp8`)"
        )
    return Fp8Config.from_quantization_config(qc, source=str(path))


def trainer_weights_dir(hf_checkpoint: str | pathlib.Path, ref_load: str | pathlib.Path | None) -> str:
    """Where the trainer's initial BF16 weights come from (before `--load`), given an FP8 or unquantized checkpoint.

    The original's BF16-training + FP8-rollout rule: `--hf-checkpoint` is what the engines serve (and the tokenizer
    and architecture); when it is an FP8 serving checkpoint, the trainer starts from the BF16 weights in `--ref-load`
    and never from the FP8 ones.

    Args:
        hf_checkpoint: `--hf-checkpoint`.
        ref_load: `--ref-load` (an HF directory for FSDP; torch_dist or HF for Megatron).

    Returns:
        `hf_checkpoint` when it is unquantized, else `ref_load`.

    Raises:
        ValueError: `--hf-checkpoint` is FP8 and `--ref-load` is not given.
    """
    if read_fp8_config(hf_checkpoint) is None:
        return str(hf_checkpoint)
    if not ref_load:
        raise ValueError(
            f"--hf-checkpoint {hf_checkpoint} is an FP8 serving checkpoint (quantization_config fp8): the trainer "
            "trains BF16 weights, pass them as --ref-load (the BF16 model, or its torch_dist for Megatron)"
        )
    return str(ref_load)


def strip_quantization_config(config_path: str | pathlib.Path) -> None:
    """Removes `quantization_config` from a config.json copied next to unquantized weights (an HF export).

    A trainer's export holds BF16 weights even when `--hf-checkpoint` (whose config is copied) is FP8.
    """
    path = pathlib.Path(config_path)
    if not path.is_file():
        return
    config = json.loads(path.read_text())
    if config.pop("quantization_config", None) is not None:
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _blocks(shape: torch.Size, block: tuple[int, int]) -> tuple[int, int, int, int]:
    m, n = shape[-2], shape[-1]
    bm, bn = block
    return m, n, -(-m // bm), -(-n // bn)


def quantize_blockwise(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantizes a weight to e4m3 with one float32 scale per `block` (the scheme in the module docstring).

    Args:
        w: `[..., M, N]` floating weight (any float dtype, any device); leading dims (stacked experts) are kept.
        block: `(bm, bn)`; edge blocks smaller than that are zero-padded for their amax.

    Returns:
        `(q, scale_inv)`: `q` `[..., M, N]` float8_e4m3fn and `scale_inv` `[..., ceil(M/bm), ceil(N/bn)]` float32,
        with `w ≈ q · scale_inv` per block (relative error ≤ 2^-4 of the block's amax for values within e4m3's
        normal range).

    Raises:
        ValueError: `w` has fewer than 2 dims or is not floating point.
    """
    if w.dim() < 2 or not w.is_floating_point():
        raise ValueError(f"quantize_blockwise: need a floating [..., M, N] weight, got {w.dtype} {tuple(w.shape)}")
    m, n, mb, nb = _blocks(w.shape, block)
    bm, bn = block
    lead = w.shape[:-2]
    x = torch.nn.functional.pad(w.float(), (0, nb * bn - n, 0, mb * bm - m))  # [..., mb·bm, nb·bn]
    x = x.reshape(*lead, mb, bm, nb, bn)
    amax = x.abs().amax(dim=(-3, -1), keepdim=True)  # [..., mb, 1, nb, 1]
    scale = amax.clamp(min=_AMAX_FLOOR) / FP8_MAX
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.reshape(*lead, mb * bm, nb * bn)[..., :m, :n].contiguous()
    return q, scale.reshape(*lead, mb, nb).contiguous()


def dequantize_blockwise(
    q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The inverse of `quantize_blockwise`: `q · scale_inv` per block, computed in float32, cast to `dtype`.

    Args:
        q: `[..., M, N]` float8_e4m3fn.
        scale_inv: `[..., ceil(M/bm), ceil(N/bn)]` float32.
        block: `(bm, bn)` the scales were made with.
        dtype: result dtype.

    Returns:
        `[..., M, N]` tensor of `dtype`.

    Raises:
        ValueError: `scale_inv` does not have the block grid's shape.
    """
    m, n, mb, nb = _blocks(q.shape, block)
    if tuple(scale_inv.shape) != (*q.shape[:-2], mb, nb):
        raise ValueError(
            f"dequantize_blockwise: weight {tuple(q.shape)} with block {tuple(block)} needs scales "
            f"{(*q.shape[:-2], mb, nb)}, got {tuple(scale_inv.shape)}"
        )
    s = scale_inv.float().repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)[..., :m, :n]
    return (q.float() * s).to(dtype)


def is_quantized_weight(name: str, tensor: torch.Tensor, cfg: Fp8Config) -> bool:
    """Whether an HF-named tensor is stored as FP8 in a serving checkpoint.

    True for a ≥2-D floating `*.weight` inside a decoder layer (`layers.<i>.`) that is not a norm, router, vision
    module or linear-attention gate/conv (`in_proj_b`, `in_proj_a`, `in_proj_ba`, `conv1d`) and not kept by
    `cfg.modules_to_not_convert` (`_kept_module`); embeddings and `lm_head` stay unquantized.
    """
    if not name.endswith(".weight") or tensor.dim() < 2 or not tensor.is_floating_point():
        return False
    if tensor.dtype == FP8_DTYPE or not _IN_LAYER.search(name) or _KEEP.search(name):
        return False
    module = name.removesuffix(".weight").removeprefix("model.")
    return not any(_kept_module(k.removeprefix("model.").rstrip("."), module) for k in cfg.modules_to_not_convert)


def _kept_module(entry: str, module: str) -> bool:
    """Whether a `modules_to_not_convert` entry keeps `module` unquantized, matched on dotted path boundaries.

    As SGLang's `is_layer_skipped` (`layers/quantization/utils.py`, sglang PR #23467): the module itself, a parent of
    it (`layers.1.mlp`), or a run of whole segments inside its path (`mlp.gate_proj` for every layer's), never a
    partial segment (`self_attn.q` keeps no `q_proj`). Both sides are given without the leading `model.`.
    """
    return bool(entry) and (f".{entry}." in f".{module}.")


def _quantize_stream(named: Iterable[tuple[str, torch.Tensor]], cfg: Fp8Config) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named:
        if is_quantized_weight(name, tensor, cfg):
            q, scale = quantize_blockwise(tensor.detach(), cfg.weight_block_size)
            yield name, q
            yield name.removesuffix(".weight") + SCALE_SUFFIX, scale
        else:
            yield name, tensor


def _check_finite_scales(named: list[tuple[str, torch.Tensor]]) -> None:
    """Refuses inf/NaN weights: one inf makes its block's scale inf, and the engine reads the whole block as NaN.

    One device-to-host read for all the scales in `named` (a bucket), not one per tensor.
    """
    scales = [(n, t) for n, t in named if n.endswith(SCALE_SUFFIX)]
    if not scales or bool(torch.stack([torch.isfinite(t).all() for _, t in scales]).all()):
        return
    bad = [n.removesuffix(SCALE_SUFFIX) + ".weight" for n, t in scales if not bool(torch.isfinite(t).all())]
    raise ValueError(
        f"FP8 quantization: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} hold(s) inf or NaN; a block with one "
        f"of them gets an inf/NaN scale and dequantizes to NaN as a whole; the weights diverged "
        "(check the loss, lower the learning rate, or resume from an earlier checkpoint)"
    )


def quantize_named(named: Iterable[tuple[str, torch.Tensor]], cfg: Fp8Config) -> Iterator[tuple[str, torch.Tensor]]:
    """Quantizes the FP8 weights of an HF-named stream; yields `(name, q)` then `(name_scale_inv, scale)`.

    Other tensors pass through unchanged, in order.

    Raises:
        ValueError: a weight to quantize holds inf or NaN (names it; `_check_finite_scales`).
    """
    for name, tensor in named:
        pair = list(_quantize_stream([(name, tensor)], cfg))
        _check_finite_scales(pair)
        yield from pair


def quantize_buckets(
    buckets: Iterable[list[tuple[str, torch.Tensor]]], cfg: Fp8Config
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`quantize_named` bucket by bucket: a weight and its scale always travel in the same bucket.

    Raises:
        ValueError: a weight to quantize holds inf or NaN (names it; checked once per bucket).
    """
    for bucket in buckets:
        out = list(_quantize_stream(bucket, cfg))
        _check_finite_scales(out)
        yield out


def pair_fp8(
    named: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]]:
    """Joins each FP8 `X.weight` with its `X.weight_scale_inv` (in either order) into `(X.weight, (weight, scale))`.

    Unquantized tensors pass through as they come; a pair is yielded once both halves have arrived.

    Raises:
        ValueError: an FP8 weight or a scale without its partner at the end of the stream (names up to three).
    """
    weights: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for name, tensor in named:
        if name.endswith(SCALE_SUFFIX):
            module, store = name.removesuffix(SCALE_SUFFIX), scales
        elif tensor.dtype == FP8_DTYPE:
            module, store = name.removesuffix(".weight"), weights
        else:
            yield name, tensor
            continue
        store[module] = tensor
        if module in weights and module in scales:
            yield module + ".weight", (weights.pop(module), scales.pop(module))
    if weights or scales:
        lone = sorted([f"{m}.weight (no scale)" for m in weights] + [f"{m}{SCALE_SUFFIX} (no weight)" for m in scales])
        raise ValueError(f"FP8 tensors without their partner: {', '.join(lone[:3])}{' ...' if len(lone) > 3 else ''}")


def dequantize_named(
    named: Iterable[tuple[str, torch.Tensor]], block: tuple[int, int] | None, dtype: torch.dtype = torch.float32
) -> Iterator[tuple[str, torch.Tensor]]:
    """Joins each FP8 `*.weight` with its `*.weight_scale_inv` and yields the dequantized weight (in either order).

    Unquantized tensors pass through as they come; a pair is yielded once both halves have arrived (`pair_fp8`).

    Args:
        named: HF-named tensors, e.g. one safetensors file or one pushed bucket.
        block: the serving checkpoint's `weight_block_size`; None when the engine serves an unquantized model.
        dtype: dtype of the dequantized weights.

    Raises:
        ValueError: an FP8 weight or a scale without its partner at the end of the stream, or an FP8 tensor when
            `block` is None (names the tensor).
    """

    def refuse_fp8_if_unquantized() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named:
            if block is None and (name.endswith(SCALE_SUFFIX) or tensor.dtype == FP8_DTYPE):
                raise ValueError(
                    f"{name}: an FP8 tensor, but this model is served unquantized (no FP8 quantization_config)"
                )
            yield name, tensor

    for name, item in pair_fp8(refuse_fp8_if_unquantized()):
        yield name, (dequantize_blockwise(*item, block, dtype) if isinstance(item, tuple) else item)
