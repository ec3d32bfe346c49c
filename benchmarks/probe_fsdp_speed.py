"""Probe of the FSDP trainer's hot spots (issue 22): packed attention, the log-prob head, the whole step.

Run on one H200 (torch + transformers only; no pydantic, no ray, no checkpoint on disk):
    PYTHONPATH=packages/slime-train-fsdp/src:packages/slime-core/src python3 benchmarks/probe_fsdp_speed.py
CPU smoke (tiny shapes, < 1 min): add `--smoke`.

Sections (`--sections attn,head,model`), qwen3-1.7b shapes (random weights from `Qwen3Config`), one packed row
of 8 sequences × 1024 tokens (`--smoke`: 4 × 64 on a tiny config):

- `attn`: one attention layer's fwd+bwd (bf16) for transformers' sdpa with its dense block-causal mask and
  repeated K/V (today's path), per-sequence SDPA, `slime_varlen` and `slime_flex` (compiled once with dynamic
  shapes: the first call's seconds, then a second row length's first call, which must not recompile).
- `head`: the log-prob/entropy head on R = 8192 response positions (V = 151936): fwd+bwd ms, peak extra
  memory, max/mean |log-prob error| and |entropy error| against an fp64 reference; liger only when
  `liger_kernel` imports.
- `model`: the whole response forward + backward of the model (FSDP2 on one rank, bf16 compute, fp32 master
  weights, as the backend runs it) for attention × head combinations: ms, tokens/s, MFU, peak memory, grad
  norm and log-prob difference to the first combination.

Timing: CUDA events around each call after `--warmup` calls, median of `--repeats`. Output: one JSON line per
measurement on stdout (`bench: probe_fsdp_speed`), then a short table on stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import _common  # noqa: E402
import torch

logger = logging.getLogger("probe")
ROWS: list[dict] = []


def _config(smoke: bool):
    from transformers import Qwen3Config

    if smoke:
        return Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    # qwen3-1.7b (Qwen/Qwen3-1.7B config.json), untied head as in the 1.7b-class training runs.
    return Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1000000.0,
                       max_position_embeddings=40960, tie_word_embeddings=False)  # fmt: skip


def _record(section: str, name: str, **fields) -> None:
    row = _common.emit("probe_fsdp_speed", {"section": section, "name": name, **fields})
    ROWS.append(row)


def _guarded(section: str, name: str, fn) -> None:
    """Runs one measurement; a failure is recorded as an `error` line and the probe goes on (one GPU call)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001  (any kernel/compile failure is a result here)
        logger.exception("%s %s failed", section, name)
        _record(section, name, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _time_ms(fn, device: torch.device, warmup: int, repeats: int) -> float:
    """Median milliseconds of `fn()` (CUDA events on GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return _common.median(times)


def _peak_extra_gib(fn, device: torch.device) -> float | None:
    """Peak memory above what was allocated before one call of `fn` (GiB); None on CPU."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


# ---------------------------------------------------------------- attention
def _dense_sdpa(module, lengths):
    """transformers' sdpa path as it runs for a packed row: a dense [1, 1, S, S] bool mask, K/V repeated."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    total = sum(lengths)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(module.device)
    pos = torch.arange(total, device=module.device)
    mask = ((doc[:, None] == doc[None, :]) & (pos[:, None] >= pos[None, :]))[None, None]  # [1, 1, S, S]
    return lambda q, k, v: sdpa_attention_forward(module, q, k, v, mask, dropout=0.0, scaling=None)[0]


def probe_attention(cfg, lengths, device, a) -> None:
    from slime_train_fsdp import attention as attn

    heads, kv, dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    total = sum(lengths)
    q, k, v = (torch.randn(1, h, total, dim, device=device, dtype=dtype, generator=g).requires_grad_()
               for h in (heads, kv, kv))  # fmt: skip
    grad_out = torch.randn(1, total, heads, dim, device=device, dtype=dtype, generator=g)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.device = heads // kv, True, device
    ref = attn.sdpa_per_sequence(q.float(), k.float(), v.float(), tuple(lengths), None).detach()
    variants = {"sdpa_dense": _dense_sdpa(module, lengths),
                "sdpa_per_seq": lambda q, k, v: attn.sdpa_per_sequence(q, k, v, tuple(lengths), None)}  # fmt: skip
    if device.type == "cuda":
        for kind in (attn.SLIME_VARLEN, attn.SLIME_FLEX):
            kwargs = attn.packed_attention_kwargs(lengths, device, kind)
            variants[kind] = lambda q, k, v, kind=kind, kw=kwargs: attn.slime_attention_forward(
                None, q, k, v, None, kind=kind, **kw
            )[0]
    for name, fn in variants.items():
        _guarded("attn", name, lambda name=name, fn=fn: _attention_variant(name, fn, q, k, v, grad_out, ref, lengths,
                                                                           device, a))  # fmt: skip


def _attention_variant(name, fn, q, k, v, grad_out, ref, lengths, device, a) -> None:
    from slime_train_fsdp import attention as attn

    def step():
        out = fn(q, k, v)
        out.backward(grad_out)
        return out

    first = time.perf_counter()
    out = step()
    _common.sync(device.type)
    first_s = time.perf_counter() - first
    err = float((out.detach().float() - ref).abs().max())
    ms = _time_ms(step, device, a.warmup, a.repeats)
    extra = {}
    if name == attn.SLIME_FLEX:
        # A new row length must reuse the dynamic-shape graph: its first call should cost about one step.
        other = [n - 24 for n in lengths]
        kw2 = attn.packed_attention_kwargs(other, device, name)
        q2, k2, v2 = (t.detach()[:, :, : sum(other)].clone().requires_grad_() for t in (q, k, v))
        t0 = time.perf_counter()
        attn.slime_attention_forward(None, q2, k2, v2, None, kind=name, **kw2)[0].sum().backward()
        _common.sync(device.type)
        extra["second_shape_first_call_s"] = round(time.perf_counter() - t0, 3)
    mem = _peak_extra_gib(step, device)
    _record("attn", name, fwd_bwd_ms=round(ms, 3), first_call_s=round(first_s, 3), peak_extra_gib=mem,
            max_abs_err_vs_fp32=err, seq_lens=lengths, **extra)  # fmt: skip
    logger.info("attn %-13s %8.3f ms (first call %.1f s) err %.2e", name, ms, first_s, err)


# --------------------------------------------------------------------- head
def _fp64_reference(hidden, weight, targets, temperature, chunk=1024):
    logps, ents = [], []
    with torch.no_grad():
        for s in range(0, targets.numel(), chunk):
            z = hidden[s : s + chunk].double() @ weight.double().t() / temperature
            lp = torch.log_softmax(z, -1)
            logps.append(lp.gather(-1, targets[s : s + chunk, None])[:, 0])
            ents.append(-(lp.exp() * lp).sum(-1))
    return torch.cat(logps), torch.cat(ents)


def probe_head(cfg, num_tokens, device, a) -> None:
    from slime_train_fsdp.logprob_head import HEADS

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(1)
    # Peaked distributions as in a trained model: logits with std ~4 (random 0.02-std weights alone give ~1).
    hidden = (torch.randn(num_tokens, cfg.hidden_size, device=device, generator=g) * 4.0).to(dtype)
    weight = (torch.randn(cfg.vocab_size, cfg.hidden_size, device=device, generator=g) * 0.02).to(dtype)
    targets = torch.randint(0, cfg.vocab_size, (num_tokens,), device=device, generator=g)
    ref_logp, ref_ent = _fp64_reference(hidden, weight, targets, a.temperature)
    heads = [h for h in HEADS if h != "liger" or _liger_available(device)]
    for head in heads:
        _guarded("head", head, lambda head=head: _head_variant(head, hidden, weight, targets, ref_logp, ref_ent,
                                                               device, a))  # fmt: skip


def _head_variant(head, hidden, weight, targets, ref_logp, ref_ent, device, a) -> None:
    from slime_train_fsdp.logprob_head import head_log_probs

    num_tokens, vocab = targets.numel(), weight.shape[0]
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_()

    def step(head=head, h=h, w=w):
        logp, ent = head_log_probs(h, w, targets, temperature=a.temperature, chunk_size=1024, with_entropy=True,
                                   head=head)  # fmt: skip
        (logp.sum() + 0.01 * ent.sum()).backward()
        h.grad = w.grad = None
        return logp, ent

    logp, ent = step()
    ms = _time_ms(step, device, a.warmup, a.repeats)
    mem = _peak_extra_gib(step, device)
    lp_err, ent_err = (logp.detach().double() - ref_logp).abs(), (ent.detach().double() - ref_ent).abs()
    _record("head", head, fwd_bwd_ms=round(ms, 3), peak_extra_gib=mem, tokens=num_tokens, vocab=vocab,
            logp_max_err=float(lp_err.max()), logp_mean_err=float(lp_err.mean()),
            entropy_max_err=float(ent_err.max()), entropy_mean_err=float(ent_err.mean()))  # fmt: skip
    logger.info("head %-6s %8.3f ms  logp err max %.2e mean %.2e", head, ms, lp_err.max(), lp_err.mean())


def _liger_available(device: torch.device) -> bool:
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (an incompatible install is reported, not fatal)
        logger.info("liger_kernel not importable (%s): the liger head is skipped", exc)
        return False
    return device.type == "cuda"


# -------------------------------------------------------------------- model
def _build_model(cfg, device, fused: str = "none"):
    """FSDP2-sharded (one rank) Qwen3 with fp32 master weights and bf16 compute on CUDA, like `model_loading`.

    `fused`: "none"; "liger" (liger-kernel's RMSNorm/SwiGLU/RoPE kernels patched into the model); "compile"
    (`torch.compile` of every decoder layer, dynamic shapes, before sharding, as torchtitan does).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    from slime_train_fsdp.attention import register_attention

    register_attention()
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    if fused == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3

        apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False, model=model)  # fmt: skip
    elif fused == "compile":
        for layer in model.model.layers:
            layer.compile(dynamic=True)
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
    kwargs = {"mesh": mesh}
    if device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    model.train()
    return model


def probe_model(cfg, lengths, device, a, peak_tflops: float) -> None:
    from slime_train_fsdp import packing
    from slime_train_fsdp.attention import SLIME_FLEX, SLIME_VARLEN

    model = _build_model(cfg, device)
    g = torch.Generator().manual_seed(2)
    tokens = [torch.randint(0, cfg.vocab_size, (n,), generator=g) for n in lengths]
    resp = [n // 2 for n in lengths]
    mb = packing.pack_micro_batch(tokens, resp, list(range(len(lengths))), device)
    combos = [("sdpa", "fp32"), ("sdpa", "tf32"), (SLIME_VARLEN, "tf32"), (SLIME_FLEX, "tf32"), (SLIME_VARLEN, "bf16")]
    if _liger_available(device):
        combos.append((SLIME_VARLEN, "liger"))
    flops = _common.transformer_flops(cfg, lengths, lm_head_tokens=sum(resp), backward=True)["total"]
    base: dict = {}
    for attn, head in combos:
        _guarded("model", f"{attn}+{head}", lambda attn=attn, head=head: _model_combo(
            model, mb, attn, head, base, flops, lengths, device, a, peak_tflops))  # fmt: skip


def _model_combo(model, mb, attn, head, base, flops, lengths, device, a, peak_tflops, section="model", name=None):
    from slime_train_fsdp import packing

    model.zero_grad(set_to_none=True)  # a failed combination may have left gradients behind
    model.set_attn_implementation(attn)
    packing.install_response_forward(model, packing.ForwardOptions(head=head))
    norms: list[float] = []

    def step(norms=norms):
        logp, ent, anchor = packing.response_log_probs(model, mb, temperature=a.temperature, chunk_size=1024,
                                               with_entropy=True)  # fmt: skip
        (-logp.mean() + anchor).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(model.parameters()), float("inf")).full_tensor()))
        model.zero_grad(set_to_none=True)
        return logp.detach()

    t0 = time.perf_counter()
    logp = step()
    _common.sync(device.type)
    first_s = time.perf_counter() - t0
    base_logp = base.setdefault("logp", logp)
    ms = _time_ms(step, device, min(a.warmup, 2), min(a.repeats, 5))
    mem = _peak_extra_gib(step, device)
    diff = (logp.double() - base_logp.double()).abs()
    name = name or f"{attn}+{head}"
    _record(section, name, fwd_bwd_ms=round(ms, 2), first_call_s=round(first_s, 2),
            tokens_per_s=round(sum(lengths) / ms * 1e3, 1), mfu=round(flops / (ms / 1e3) / (peak_tflops * 1e12), 4),
            peak_extra_gib=mem, grad_norm=norms[0], logp_max_diff_vs_first=float(diff.max()),
            logp_mean_diff_vs_first=float(diff.mean()), seq_lens=lengths)  # fmt: skip
    logger.info("%s %-22s %9.2f ms  grad norm %.6g", section, name, ms, norms[0])


def probe_packing(cfg, device, a) -> None:
    """Packed rows against the ground truth: every sequence run alone (its own causal attention, no packing).

    bf16 compute on CUDA; the same model and tokens for every attention implementation, so a difference above
    the bf16 noise of `sdpa` on single sequences means attention leaked across sequences of the row.
    """
    from transformers import AutoModelForCausalLM

    from slime_train_fsdp import packing
    from slime_train_fsdp.attention import SLIME_FLEX, SLIME_VARLEN, register_attention

    register_attention()
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(3)
    lengths = [300, 17, 1024, 511] if device.type == "cuda" else [40, 9, 64]
    tokens = [torch.randint(0, cfg.vocab_size, (n,), generator=g) for n in lengths]
    resp = [n // 2 for n in lengths]
    packing.install_response_forward(model, packing.ForwardOptions(head="fp32"))
    with torch.no_grad():
        alone = []
        for i in range(len(lengths)):
            one = packing.pack_micro_batch(tokens, resp, [i], device)
            alone.append(packing.response_log_probs(model, one, temperature=1.0, chunk_size=1024)[0].double())
        ref = torch.cat(alone)
        mb = packing.pack_micro_batch(tokens, resp, list(range(len(lengths))), device)
        impls = ["sdpa", "eager"] + ([SLIME_VARLEN, SLIME_FLEX] if device.type == "cuda" else [])
        for impl in impls:
            model.set_attn_implementation(impl)
            logp = packing.response_log_probs(model, mb, temperature=1.0, chunk_size=1024)[0].double()
            diff = (logp - ref).abs()
            _record("packing", impl, fwd_bwd_ms=0.0, logp_max_diff_vs_alone=float(diff.max()),
                    logp_mean_diff_vs_alone=float(diff.mean()), seq_lens=lengths, dtype=str(dtype))  # fmt: skip
            logger.info("packing %-13s vs alone: max %.3e mean %.3e", impl, diff.max(), diff.mean())
        model.set_attn_implementation("sdpa")


def probe_fused(cfg, device, a, peak_tflops: float) -> None:
    """The whole step with fused elementwise kernels (liger / regional compile) and a larger micro-batch."""
    from slime_train_fsdp import packing
    from slime_train_fsdp.attention import SLIME_VARLEN

    # liger patches transformers' Qwen3 classes process-wide: its variants go last (`--fused-variants` reorders).
    variants = [(f, int(n)) for f, n in (v.split(":") for v in a.fused_variants.split(","))]
    if not _liger_available(device):
        variants = [v for v in variants if v[0] != "liger"]
    for fused, num_seqs in variants:
        name = f"varlen+tf32+{fused}x{num_seqs}"

        def run(fused=fused, num_seqs=num_seqs, name=name):
            model = _build_model(cfg, device, fused)
            lengths = [1024] * num_seqs if device.type == "cuda" else [64] * num_seqs
            g = torch.Generator().manual_seed(2)
            tokens = [torch.randint(0, cfg.vocab_size, (n,), generator=g) for n in lengths]
            resp = [n // 2 for n in lengths]
            mb = packing.pack_micro_batch(tokens, resp, list(range(len(lengths))), device)
            flops = _common.transformer_flops(cfg, lengths, lm_head_tokens=sum(resp), backward=True)["total"]
            base: dict = {}
            _model_combo(model, mb, SLIME_VARLEN, "tf32", base, flops, lengths, device, a, peak_tflops,
                         section="fused", name=name)  # fmt: skip
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()

        _guarded("fused", name, run)


def _table() -> str:
    lines = [f"{'section':8} {'name':24} {'ms':>10} {'peak GiB':>9} {'error':>10} {'extra':>12}"]
    for r in ROWS:
        if "error" in r:
            lines.append(f"{r['section']:8} {r['name']:24} FAILED {r['error'][:80]}")
            continue
        err = r.get("max_abs_err_vs_fp32", r.get("logp_max_err", r.get("logp_max_diff_vs_first")))
        err = r.get("logp_mean_diff_vs_alone", err)
        extra = r.get("mfu", r.get("first_call_s", ""))
        mem = r.get("peak_extra_gib")
        lines.append(f"{r['section']:8} {r['name']:24} {r['fwd_bwd_ms']:>10.3f} "
                     f"{'-' if mem is None else f'{mem:.2f}':>9} {err:>10.2e} {extra!s:>12}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parses flags, runs the chosen sections, prints JSON lines and the table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (runs anywhere in < 1 min)")
    p.add_argument("--sections", default="attn,head,model", help="any of attn,head,model,packing,fused")
    p.add_argument(
        "--fused-variants",
        default="none:8,compile:8,none:16,compile:16,liger:8,liger:16",
        help="fused section: comma-separated kernels:num_seqs (kernels: none, compile, liger)",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--peak-tflops", type=float, default=790.0, help="bf16 matmul ceiling for MFU (bench_matmul)")
    a = p.parse_args(argv)
    _common.setup_logging()
    device = torch.device("cuda" if torch.cuda.is_available() and not a.smoke else "cpu")
    if a.smoke:
        a.warmup, a.repeats = 1, 2
        torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = _config(a.smoke)
    lengths = [64] * 4 if a.smoke else [1024] * 8
    sections = set(a.sections.split(","))
    if "attn" in sections:
        probe_attention(cfg, lengths, device, a)
    if "head" in sections:
        probe_head(cfg, 64 if a.smoke else 8192, device, a)
    if "packing" in sections:
        _guarded("packing", "all", lambda: probe_packing(cfg, device, a))
    if "model" in sections or "fused" in sections:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
        try:
            if "model" in sections:
                probe_model(cfg, lengths, device, a, a.peak_tflops)
            if "fused" in sections:
                probe_fused(cfg, device, a, a.peak_tflops)
        finally:
            dist.destroy_process_group()
    logger.info("device %s\n%s", _common.device_name(device.type), _table())


if __name__ == "__main__":
    main()
