"""One Megatron core attention on a packed micro-batch: dense block mask vs slime's packed attention.

`python3 benchmarks/probe_megatron_attention.py [--seqs 8] [--seq-len 1024] [--heads 16] [--kv-heads 8]
[--head-dim 128] [--repeats 5] [--device cuda|cpu]`

Runs forward + backward of one layer's core attention, as megatron-core's local spec calls it, for:

- `dense`: megatron-core's `DotProductAttention` on the row as one sequence with the `[1, 1, T, T]` block-diagonal
  causal mask the backend builds for `--attention-backend local` (K/V repeated to all heads, `[H, T, T]` scores,
  fp32 softmax with bf16 inputs);
- `packed`: `slime_train_megatron.attention.PackedCoreAttention` on the THD row (flash varlen on CUDA with
  bf16, per-sequence SDPA otherwise).

Prints one JSON line (`bench: megatron_attention`) with, per path, the median fwd+bwd milliseconds, the bytes
autograd keeps for the backward (distinct storages seen by `saved_tensors_hooks`), the peak CUDA memory
above the inputs, and the max |difference| of the outputs. Defaults: qwen3-1.7b's attention (16 query heads, 8
key-value heads, head dim 128) on the benchmark's 8 × 1024-token micro-batch, bf16 on CUDA, fp32 on CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import _common  # sibling module: a script's own directory is first on sys.path


def _saved_bytes(fn) -> tuple[object, int]:
    """Runs `fn` and returns (its output, bytes of the distinct storages autograd saved for the backward)."""
    import torch

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def _measure(name: str, run, q, k, v, grad, device: str, repeats: int) -> dict:
    import torch

    def step():
        for t in (q, k, v):
            t.grad = None
        out = run(q, k, v)
        out.backward(grad)
        return out

    out = step()  # warm-up (kernel selection, allocator)
    times = []
    for _ in range(repeats):
        _common.sync(device)
        start = time.perf_counter()
        step()
        _common.sync(device)
        times.append(time.perf_counter() - start)
    for t in (q, k, v):
        t.grad = None
    peak = None
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    _, saved = _saved_bytes(lambda: run(q, k, v))
    return {f"{name}_ms": 1e3 * statistics.median(times), f"{name}_saved_gib": saved / 2**30,
            f"{name}_peak_gib": peak}, out.detach()  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    """Parses flags, runs both paths, emits the JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args(argv)
    _common.setup_logging()
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from slime_train_megatron.attention import PackedCoreAttention

    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA GPU is visible")
    if a.device == "cpu":
        torch.cuda.current_device = lambda: "cpu"  # megatron-core's scores buffer and RNG ask for it
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().fork = lambda *x, **k: contextlib.nullcontext()
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    parallel_state.initialize_model_parallel(1, 1)
    try:
        bf16 = a.device == "cuda"
        dtype = torch.bfloat16 if bf16 else torch.float32
        config = TransformerConfig(
            num_layers=1, hidden_size=a.heads * a.head_dim, num_attention_heads=a.heads, num_query_groups=a.kv_heads,
            kv_channels=a.head_dim, attention_dropout=0.0, bf16=bf16, params_dtype=dtype, masked_softmax_fusion=False,
        )  # fmt: skip
        dense = DotProductAttention(config, 1, AttnMaskType.causal, "self")
        packed = PackedCoreAttention(config, 1, AttnMaskType.causal, "self")
        total = a.seqs * a.seq_len
        g = torch.Generator().manual_seed(0)

        def leaf(heads):  # [T, heads, D] THD layout
            return torch.randn(total, heads, a.head_dim, generator=g).to(a.device, dtype).requires_grad_()

        q, k, v = leaf(a.heads), leaf(a.kv_heads), leaf(a.kv_heads)
        grad = torch.randn(total, a.heads * a.head_dim, generator=g).to(a.device, dtype)
        cu_host = torch.arange(0, total + 1, a.seq_len, dtype=torch.int32)
        start = time.perf_counter()
        seg = torch.repeat_interleave(torch.arange(a.seqs), a.seq_len)  # the backend's dense mask, as it builds it
        allowed = (seg[:, None] == seg[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
        mask = (~allowed)[None, None].to(a.device)
        _common.sync(a.device)
        mask_s = time.perf_counter() - start
        cu = cu_host.to(a.device)  # as the backend passes them: device copies, host copies for RoPE / fallback
        params = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu,
            cu_seqlens_kv=cu,
            cu_seqlens_q_padded=cu_host,
            cu_seqlens_kv_padded=cu_host,
            max_seqlen_q=a.seq_len,
            max_seqlen_kv=a.seq_len,
        )

        def run_dense(q, k, v):  # [s, b=1, heads, D] in, [s, 1, H·D] out
            return dense(q[:, None], k[:, None], v[:, None], mask)[:, 0]

        def run_packed(q, k, v):
            return packed(q, k, v, None, packed_seq_params=params)

        result = {"device": _common.device_name(a.device), "dtype": str(dtype).removeprefix("torch."),
                  "seqs": a.seqs, "seq_len": a.seq_len, "tokens": total, "heads": a.heads, "kv_heads": a.kv_heads,
                  "head_dim": a.head_dim, "repeats": a.repeats, "mask_build_s": mask_s}  # fmt: skip
        dense_res, out_dense = _measure("dense", run_dense, q, k, v, grad, a.device, a.repeats)
        packed_res, out_packed = _measure("packed", run_packed, q, k, v, grad, a.device, a.repeats)
        result.update(dense_res)
        result.update(packed_res)
        result["speedup"] = result["dense_ms"] / result["packed_ms"]
        result["max_abs_diff"] = float((out_dense.float() - out_packed.float()).abs().max())
        return _common.emit("megatron_attention", result)
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
