"""SGLang's per-parameter weight checksum, computed in torch on the trainer's side of a weight push.

SGLang (≥ 0.5.16) answers `POST /weights_checker {"action": "checksum"}` with a 16-hex-digit checksum of every
parameter it holds (`ranks[i].checksums`, SGLang's parameter names), computed on the GPU by
`sglang.kernels.ops.memory.gpu_tensor_hash` over the parameter's raw bytes. `tensor_checksum` computes the same
number for any tensor, on any device, with plain integer tensor ops, so the trainer can compare what it pushed
with what the engine holds without reading the weights back (SGLang's `/get_weights_by_name` is not implemented
for Qwen3 and answers 400).

The function, as SGLang defines it (bytes viewed as little-endian uint32 words `v[i]`, zero-padded to a whole
word; all arithmetic modulo 2^32 unless noted):

* per word, two keyed mixes `k_j(i) = fmix32(v[i] ^ p_j(i))`, with `p_1(i) = (i·0x27D4EB2D + s1) ^ rotl(i, 15)`,
  `p_2(i) = (i·0x165667B1 + s2) ^ rotl(i, 13)`, `s1 = 0x243F6A88`, `s2 = (s1·0x9E3779B1) ^ 0xDEADBEEF`, and
  `fmix32` MurmurHash3's finalizer (`x ^= x>>16; x *= 0x85EBCA6B; x ^= x>>13; x *= 0xC2B2AE35; x ^= x>>16`);
* per tile of 8192 words, `h_j = fmix32(Σ k_j ^ (4·n))` (n = words in the whole tensor) and the tile's value
  `h_1·2^32 + h_2`;
* the tensor's value: splitmix64's finalizer of the sum of the tile values modulo 2^64, printed as `%016x`.

Sums commute, so the tile and reduction order of the GPU kernel does not matter: the result is exact.
Cost: about 60 elementwise int64 passes over the words, most in place (a 0.6B bf16 model: ~0.3 s on an H200,
minutes on CPU for a large model; the weight check runs on the first sync and every `--check-weight-sync-interval`).
The tiny test model's 151936 x 64 fp32 embedding took 2.0-2.6 CPU-s on one thread before the in-place passes, the
16-bit split of the constant only and tile sums by reshape (not `index_add_`); 0.7-0.8 since; 0.67 with the words
widened per chunk (2026-12-07, same machine: 0.75-0.80 before). A fused parameter is hashed part by part
(`parts_checksum`): a 384 MiB bf16 `w13_weight` in 64 parts grew the peak by 1.37 GiB when concatenated and widened
whole, by < 0.2 GiB since (CPU, ru_maxrss).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from slime_core.config.true_on_policy import ENGINE_FP32_PARAM_SUFFIXES
from slime_core.fp8 import pair_fp8
from slime_core.moe_experts import fused_expert_name, per_expert_name

# One pushed part of a parameter: a tensor, or a block-FP8 `(weight, weight_scale_inv)` pair (`fp8.pair_fp8`).
Part = torch.Tensor | tuple[torch.Tensor, torch.Tensor]

__all__ = [
    "Part",
    "hash_dtype",
    "hash_parts",
    "parts_checksum",
    "sglang_checksums",
    "sglang_fp8_comparable",
    "sglang_param_name",
    "strip_wrappers",
    "tensor_checksum",
]

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_SEED1 = 0x243F6A88
_SEED2 = ((0x243F6A88 * 0x9E3779B1) ^ 0xDEADBEEF) & _M32
_FMIX_C1, _FMIX_C2 = 0x85EBCA6B, 0xC2B2AE35
_POS_A, _POS_B = 0x27D4EB2D, 0x165667B1
_TILE_WORDS = 8192
_CHUNK_TILES = 256  # tiles hashed per pass: 2M words, ~16 MiB per int64 temporary


def _mul32_(x: torch.Tensor, c: int) -> torch.Tensor:
    """`x = (x · c) mod 2^32` in place, for int64 `x` in [0, 2^32): `c` split in 16-bit halves keeps products < 2^48."""
    hi = x * (c >> 16)
    hi.bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return x.mul_(c & 0xFFFF).add_(hi).bitwise_and_(_M32)


def _fmix32_(x: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finalizer, in place."""
    x ^= x >> 16
    _mul32_(x, _FMIX_C1)
    x ^= x >> 13
    _mul32_(x, _FMIX_C2)
    x ^= x >> 16
    return x


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & _M32) | (x >> (32 - r))


def _splitmix64(x: int) -> int:
    x &= _M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _word_chunks(tensor: torch.Tensor, chunk: int) -> Iterator[torch.Tensor]:
    """The tensor's bytes as little-endian uint32 words in int64, `[<= chunk]` at a time (zero-padded to a whole word).

    An int32 view of the bytes read as unsigned: torch runs on little-endian hosts and devices only. Only one chunk
    is widened to int64 at a time (widening a whole bf16 tensor took 4x its size).
    """
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad or raw.storage_offset() % 4:  # a view as int32 needs whole, aligned words: a copy has them
        raw = torch.cat([raw, raw.new_zeros(pad)])
    words = raw.view(torch.int32)
    for start in range(0, words.numel(), chunk):
        yield words[start : start + chunk].to(torch.int64).bitwise_and_(_M32)


def _add_tile_sums(v: torch.Tensor, start: int, sums: list[torch.Tensor]) -> None:
    """Adds the words `v` (global word indices `start ...`) to the per-tile sums `Σ k_j` of both keyed mixes.

    A chunk need not start on a tile: its words are placed in their tiles by zero padding on both sides (zeros add
    nothing to a sum). Σ over a tile of 8192 words < 2^45: exact in int64.
    """
    i = torch.arange(start, start + v.numel(), device=v.device, dtype=torch.int64).bitwise_and_(_M32)
    head, first = start % _TILE_WORDS, start // _TILE_WORDS
    tail = (-(head + v.numel())) % _TILE_WORDS
    for sum_j, (pos_mul, seed, rot) in zip(sums, ((_POS_A, _SEED1, 15), (_POS_B, _SEED2, 13)), strict=True):
        k = _mul32_(i.clone(), pos_mul).add_(seed).bitwise_and_(_M32)  # p_j(i), then k_j(i) = fmix32(v ^ p_j)
        k ^= _rotl32(i, rot)
        k ^= v
        tiles = torch.nn.functional.pad(_fmix32_(k), (head, tail)).view(-1, _TILE_WORDS).sum(1)
        sum_j[first : first + tiles.numel()] += tiles


@torch.no_grad()
def parts_checksum(parts: Sequence[torch.Tensor]) -> str:
    """SGLang's checksum of the concatenated bytes of `parts`, without concatenating them.

    Equal to `tensor_checksum(torch.cat([p.reshape(-1) for p in parts]))` (the parts' bytes one after another):
    each word's contribution depends on its global index only, so the per-tile sums are accumulated part by part
    and finished once the total length is known. The extra memory is two int64 sums per tile of 8192 words and one
    chunk's temporaries (~16 MiB each), not a copy of the whole parameter (a MoE layer's `w13_weight`).

    Args:
        parts: tensors of any dtypes and shapes on one device (cast each to the engine's dtype first). A part whose
            byte count is not a multiple of 4, except the last, shifts the word boundaries: those are concatenated.

    Returns:
        16 lowercase hex digits (an empty whole: `"0000000000000000"`, as SGLang).
    """
    if any(p.numel() * p.element_size() % 4 for p in parts[:-1]):
        return tensor_checksum(torch.cat([p.detach().reshape(-1).view(torch.uint8) for p in parts]))
    nbytes = sum(p.numel() * p.element_size() for p in parts)
    n = -(-nbytes // 4)
    if n == 0:
        return f"{0:016x}"
    device = parts[0].device
    sums = [torch.zeros(-(-n // _TILE_WORDS), dtype=torch.int64, device=device) for _ in range(2)]
    chunk, offset = _TILE_WORDS * _CHUNK_TILES, 0
    for part in parts:
        for v in _word_chunks(part, chunk):
            _add_tile_sums(v, offset, sums)
            offset += v.numel()
    # h_j = fmix32(Σ k_j ^ 4n) per tile; the tensor's value: Σ (h_1·2^32 + h_2) mod 2^64, then splitmix64.
    nbytes4 = (4 * n) & _M32
    h1, h2 = (_fmix32_(s.bitwise_and_(_M32) ^ nbytes4) for s in sums)
    return f"{_splitmix64((int(h1.sum()) << 32) + int(h2.sum())):016x}"


def tensor_checksum(tensor: torch.Tensor) -> str:
    """SGLang's weight-checker checksum of a tensor's bytes (see the module docstring for the function).

    Args:
        tensor: any dtype and shape, any device (the work runs where the tensor is); the bytes hashed are the
            tensor's own, so cast it to the dtype the engine holds first (a bf16 engine: `.to(torch.bfloat16)`).

    Returns:
        16 lowercase hex digits, equal to `ranks[i].checksums[name]` of SGLang's `/weights_checker` for a parameter
        holding the same bytes (an empty tensor: `"0000000000000000"`, as SGLang).
    """
    return parts_checksum([tensor])


# ----------------------------------------------------------------------------------------- SGLang's names
# SGLang fuses some HF linear layers into one parameter (its `stacked_params_mapping`): the parts are concatenated
# along dim 0 in this order. The vision towers of Qwen-VL keep their own (already fused) layout.
_FUSED = {
    ".q_proj.": (".qkv_proj.", 0, 3),
    ".k_proj.": (".qkv_proj.", 1, 3),
    ".v_proj.": (".qkv_proj.", 2, 3),
    ".gate_proj.": (".gate_up_proj.", 0, 2),
    ".up_proj.": (".gate_up_proj.", 1, 2),
}
# HF prefixes → SGLang's module prefixes (Qwen2.5-VL / Qwen3-VL `load_weights`).
_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))
# SGLang's FusedMoE parameters (`make_expert_params_mapping`): gate and up projections in `w13_weight`, down in `w2`.
_W13, _W2 = "w13_weight", "w2_weight"


def _expert_param(name: str, num_experts: int | None) -> tuple[str, int, int] | None:
    """Where an MoE expert tensor lives in SGLang's FusedMoE (see `sglang_param_name`); None for a non-expert name."""
    if (fused := fused_expert_name(name)) is not None:  # transformers >= 5 holds an MoE block's experts whole
        prefix, proj = fused
        return f"{prefix}.{_W13 if proj == 'gate_up_proj' else _W2}", 0, 1
    if num_experts is None or (per_expert := per_expert_name(name)) is None:
        return None
    prefix, expert, proj = per_expert
    if expert >= num_experts:
        raise ValueError(f"{name}: expert {expert} of a model with {num_experts} experts per layer (config.json)")
    if proj == "down_proj":
        return f"{prefix}.{_W2}", expert, num_experts
    return f"{prefix}.{_W13}", 2 * expert + (proj == "up_proj"), 2 * num_experts


def sglang_param_name(hf_name: str, *, num_experts: int | None = None) -> tuple[str, int, int]:
    """Where an HF checkpoint tensor lives in SGLang: `(SGLang parameter name, part index, number of parts)`.

    A fused parameter (`qkv_proj` = [q; k; v], `gate_up_proj` = [gate; up] along dim 0) has several parts; any
    other tensor is part 0 of 1. Engine-side LoRA wrappers (`.base_layer.`) are not part of the name: strip them
    with `strip_wrappers` on the engine's names.

    MoE experts: SGLang (0.5.16, `layers/moe/fused_moe_triton/layer.py`) holds a layer's `E` experts as
    `mlp.experts.w13_weight` `[E, 2I, H]` (expert `e`'s gate_proj rows, then its up_proj rows) and
    `mlp.experts.w2_weight` `[E, H, I]` (down_proj), and its weight checker hashes a parameter's bytes whatever its
    shape. So with `num_experts` given, `experts.{e}.gate_proj.weight` is part `2e` of `2E` of `w13_weight`,
    `up_proj` part `2e + 1`, and `down_proj` part `e` of `E` of `w2_weight`; without it a per-expert name keeps the
    dense mapping (which no SGLang parameter has: the check counts it unmatched). transformers' fused
    `experts.gate_up_proj` `[E, 2I, H]` (gate first per expert, as `Qwen3MoeExperts.forward` chunks it) and
    `experts.down_proj` are the whole `w13_weight` / `w2_weight`, part 0 of 1 (the `[E, 2I, H]` gate-first layout
    `slime_core.moe_experts` assumes; gpt-oss and Llama-4 hold `[E, H, 2I]` and would hash differently). This is
    the unquantized layout of SGLang's default (triton) MoE runner at TP = EP = 1 (a TP > 1 engine's expert shards
    are counted `sharded`, not compared); other runners and quantized MoE methods may reorder or transpose
    (flashinfer TRT-LLM swaps gate and up, the `triton_kernels` runner transposes), which this does not model.

    Args:
        hf_name: a checkpoint tensor name (or a transformers module name for fused experts).
        num_experts: routed experts per MoE layer (`slime_core.config.architecture.config_num_experts`); None for
            a dense model, or where unknown.

    Returns:
        `(name, index, count)`: the tensor is part `index` of the `count` parts concatenated along dim 0.

    Raises:
        ValueError: a per-expert name whose expert index is not below `num_experts`.

    Example:
        >>> sglang_param_name("model.layers.0.self_attn.k_proj.weight")
        ('model.layers.0.self_attn.qkv_proj.weight', 1, 3)
        >>> sglang_param_name("model.visual.blocks.0.attn.qkv.weight")
        ('visual.blocks.0.attn.qkv_proj.weight', 0, 1)
        >>> sglang_param_name("model.layers.0.mlp.experts.3.up_proj.weight", num_experts=8)
        ('model.layers.0.mlp.experts.w13_weight', 7, 16)
    """
    name = hf_name
    for hf_prefix, prefix in _PREFIXES:
        if name.startswith(hf_prefix):
            name = prefix + name[len(hf_prefix) :]
            break
    if name.startswith("visual."):
        return name.replace(".attn.qkv.", ".attn.qkv_proj."), 0, 1
    if (expert := _expert_param(name, num_experts)) is not None:
        return expert
    for part, (fused, index, count) in _FUSED.items():
        if part in name:
            return name.replace(part, fused), index, count
    return name, 0, 1


def hash_dtype(name: str, tensor: torch.Tensor, engine_dtype: torch.dtype, *, fp32_params: bool = False) -> torch.dtype:
    """The dtype an unquantized tensor is hashed in: the engine's (block-FP8 weights: `sglang_fp8_comparable`).

    With `fp32_params` (`--true-on-policy-mode`) the embeddings and norms are held in float32
    (`slime_core.config.true_on_policy.ENGINE_FP32_PARAM_SUFFIXES`).
    """
    if fp32_params and name.endswith(ENGINE_FP32_PARAM_SUFFIXES):
        return torch.float32
    return engine_dtype


def sglang_fp8_comparable(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """What SGLang's weight checker hashes for a block-FP8 weight: the weight dequantized to bfloat16.

    SGLang (0.5.16, `utils/weight_checker.py`) hashes `Fp8BlockComparable.dequantize()`, i.e. `(q · s)` in float32
    per square block of `k / s.shape[-1]` columns, cast to bfloat16, so two (weight, scale) pairs that dequantize
    alike hash alike; it lists no `*.weight_scale_inv`. Fused parameters are dequantized whole (parts concatenated
    along dim 0 first), as the engine holds them.

    Args:
        weight: `[..., M, N]` float8_e4m3fn.
        scale_inv: `[..., ceil(M/b), N/b]` float32 (or any float dtype; used in float32).

    Returns:
        `[..., M, N]` bfloat16.

    Raises:
        ValueError: `N` is not a multiple of the scale's column count, or the scale's shape does not fit the weight.
    """
    n, cols = weight.shape[-1], scale_inv.shape[-1]
    if cols == 0 or n % cols:
        raise ValueError(f"FP8 weight {tuple(weight.shape)}: {cols} scale columns do not divide {n} columns")
    block, m = n // cols, weight.shape[-2]
    # SGLang's block_quant_dequant: scales repeated over the grid and cut to the weight (a fused weight's part
    # boundaries need not be block-aligned), one float32 product, one rounding to bfloat16.
    s = scale_inv.float().repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)[..., :m, :n]
    if s.shape[-2] != m:
        raise ValueError(f"FP8 weight {tuple(weight.shape)}: scales {tuple(scale_inv.shape)} cover {s.shape[-2]} rows")
    return (weight.float() * s).to(torch.bfloat16)


def hash_parts(
    name: str,
    parts: list[Part],
    engine_dtype: torch.dtype,
    *,
    fp32_params: bool = False,
) -> str:
    """SGLang's checksum of one parameter from its parts in order (`sglang_param_name`): tensors, or FP8 pairs."""
    if isinstance(parts[0], tuple):
        weight = torch.cat([w for w, _ in parts], dim=0)  # type: ignore[misc]
        scale = torch.cat([s for _, s in parts], dim=0)  # type: ignore[misc]
        return tensor_checksum(sglang_fp8_comparable(weight, scale))
    # Parts already in their hash dtype (`PushChecksums` keeps its copies so) are not copied again.
    pieces = [p.to(hash_dtype(name, p, engine_dtype, fp32_params=fp32_params)) for p in parts]  # type: ignore[union-attr]
    return parts_checksum(pieces)


def strip_wrappers(engine_name: str) -> str:
    """An engine parameter name without SGLang's LoRA wrapper (`qkv_proj.base_layer.weight` → `qkv_proj.weight`)."""
    return engine_name.replace(".base_layer.", ".")


def sglang_checksums(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    *,
    fp32_params: bool = False,
    num_experts: int | None = None,
) -> dict[str, str]:
    """Checksums of HF-named tensors under SGLang's names, fused parameters assembled (`tensor_checksum`).

    Args:
        named_tensors: `(HF name, tensor)`, every part of a fused parameter present; a block-FP8 weight with its
            `*.weight_scale_inv` (hashed dequantized, the scale not listed: `sglang_fp8_comparable`).
        dtype: the dtype the engine holds (unquantized tensors are cast first: `hash_dtype`).
        fp32_params: the engine holds embeddings and norms in float32 (`--true-on-policy-mode`).
        num_experts: routed experts per MoE layer: per-expert tensors are assembled into SGLang's `w13_weight` /
            `w2_weight` (`sglang_param_name`); None for a dense model.

    Returns:
        `{SGLang name: 16 hex digits}`.

    Raises:
        ValueError: a fused parameter lacks a part, an FP8 weight its scale, or an expert index is out of range.
    """
    parts: dict[str, dict[int, Part]] = {}
    counts: dict[str, int] = {}
    for hf_name, item in pair_fp8(named_tensors):
        name, index, count = sglang_param_name(hf_name, num_experts=num_experts)
        parts.setdefault(name, {})[index] = item
        counts[name] = count
    out = {}
    for name, by_index in parts.items():
        if len(by_index) != counts[name]:
            raise ValueError(f"{name}: parts {sorted(by_index)} of {counts[name]} given")
        out[name] = hash_parts(name, [by_index[i] for i in range(counts[name])], dtype, fp32_params=fp32_params)
    return out
