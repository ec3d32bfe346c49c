"""MegatronTrainBackend training throughput and MFU on one GPU, on the shape of bench_train_fsdp.py.

`python3 benchmarks/bench_train_megatron.py --preset qwen3-0.6b [--attention-backend auto|flash|local]
[--tokens-per-mb 8192] [--seq-len 1024] [--response-len 512] [--steps-per-rollout 2] [--mbs-per-step 1]
[--repeats 3] [--recompute] [--device cuda|cpu] [--log-probs-head fused] [--megatron-extra="FLAGS"] [--profile]
[--ab base,head,adam,gradnorm,fusions,compile,all,eager_all,all_hostnorm [--profile-variants base,all]]`

TP = PP = CP = 1, world size 1 (NCCL on CUDA, gloo on CPU), bf16 with the distributed optimizer's fp32 main
weights, the layer spec the backend picks (Transformer Engine when importable, else megatron-core's local spec).
`--attention-backend` is Megatron-LM's flag as the backend reads it: with the local spec `auto`/`flash` run
slime's packed varlen attention, `local` megatron-core's DotProductAttention with a dense `[T, T]` block mask
(the path before issue 22; at 8 × 1024 tokens per micro-batch its fp32 attention probabilities do not fit in
memory, so compare it at `--tokens-per-mb 2048 --mbs-per-step 4`: the same sequences and FLOPs per call).

Batch, timing and FLOPs are bench_train_fsdp.py's (`make_batch`, `train_flops`, `_common.transformer_flops`):
one `train()` = the old-log-prob forward + `steps_per_rollout` optimizer steps of `mbs_per_step` packed
micro-batches of `tokens_per_mb // seq_len` sequences; one warm-up call, then the median of `--repeats`.
MFU = model FLOPs / median seconds / `--peak-tflops` (the `bench_matmul.py` rate of the same session).

Speed switches of issue 26 (each a run flag, see `SWITCHES`; `adam` and `gradnorm` are on by default since 2026-12-06,
`head` and `compile` on CUDA since 2026-12-07 (`settings.head_kind`, `settings.compiles_layers`), `fusions` off;
`--ab` variants set every switch whatever the defaults): `head` = `--log-probs-head fused`,
`adam` = `--use-torch-fused-adam`, `gradnorm` = `--use-foreach-grad-norm`, `fusions` = `--bias-swiglu-fusion
--bias-dropout-fusion`, `compile` = `--megatron-compile-layers`; `all` = head, adam, gradnorm and compile; `eager_all` =
head, adam and gradnorm (no compile warm-up); `paramcopy` (always on in runs) is the one-launch copy of the updated
parameters into the model's (`base` runs megatron-core's loop, `defaults` a run without flags). A single run
takes them as flags (`--log-probs-head`, `--megatron-extra="..."`). `--ab V1,V2,...` builds the backend once and
times each variant in turn in the same process (one warm-up call per variant absorbs compilation), turning the
switches on and off on the live backend exactly as the flags would set them at init; the JSON line then carries one
entry per variant under `ab` (top-level numbers: the first variant's). `--profile` adds `_common.profile_summary` of
one more train() (CUDA; per variant with `--ab`, those of `--profile-variants`); `--profile-gaps` one more with
Python stacks, attributing the GPU's idle gaps to host frames (`_common.profile_gaps`).

`--device cpu` is a smoke mode (tiny presets; numbers meaningless): megatron-core's optimizer and pipeline
schedule hard-code CUDA, so they are replaced by plain torch Adam on the DDP gradient buffers and a sequential
micro-batch loop (what megatron-core's no-pipelining schedule does on one rank).
Budget on an H200: 0.6B ≈ 70 s, 1.7B ≈ 100 s including imports and the checkpoint write.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
from pathlib import Path

import _common  # sibling modules: a script's own directory is first on sys.path
import bench_train_fsdp


def make_args(model_dir: Path, a: argparse.Namespace):
    """The run config (`SlimeArgs`, GRPO, the FSDP benchmark's optimizer settings) for the Megatron backend."""
    from slime_core.config import SlimeArgs

    megatron = ["--bf16", "--attention-backend", a.attention_backend, *shlex.split(a.megatron_extra)]
    if a.transformer_impl:
        megatron += ["--transformer-impl", a.transformer_impl]
    if a.recompute:
        megatron += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return SlimeArgs.from_dict(dict(
        hf_checkpoint=str(model_dir), train_backend="megatron", megatron_args=megatron, rollout_temperature=1.0,
        lr=1e-6, min_lr=0.0, lr_warmup_iters=0, lr_decay_style="constant", lr_decay_iters=None, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-8, clip_grad=1.0, seed=1234, advantage_estimator="grpo",
        eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=None, entropy_coef=0.0, use_kl_loss=False, kl_loss_coef=0.0,
        kl_loss_type="low_var_kl", kl_coef=0.0, gamma=1.0, lambd=1.0, normalize_advantages=False,
        calculate_per_token_loss=False, use_rollout_logprobs=False, use_tis=False, log_probs_chunk_size=-1,
        update_weight_buffer_size=512 * 1024**2, load=None, save=None, ref_load=None, start_rollout_id=None,
        num_rollout=100, rollout_batch_size=1, n_samples_per_prompt=1, global_batch_size=1,
        log_probs_head=a.log_probs_head,
    ))  # fmt: skip


def _toggle_head(backend, on: bool, device: str) -> None:
    backend.set_log_probs_head("fused" if on else "logits")


def _toggle_adam(backend, on: bool, device: str) -> None:
    from slime_train_megatron.torch_optimizer import use_torch_fused_adam

    use_torch_fused_adam(backend.optimizer, on)


#: What the `gradnorm` and `hostnorm` switches ask of `use_foreach_grad_norm` (the two toggles set one state).
_GRAD_NORM = {"on": False, "device_norm": True}


def _set_grad_norm(**change: bool) -> None:
    from slime_train_megatron.torch_optimizer import use_foreach_grad_norm

    _GRAD_NORM.update(change)
    use_foreach_grad_norm(_GRAD_NORM["on"], device_norm=_GRAD_NORM["device_norm"])


def _toggle_gradnorm(backend, on: bool, device: str) -> None:
    _set_grad_norm(on=on)


def _toggle_hostnorm(backend, on: bool, device: str) -> None:
    # megatron-core's own norm and clip (a host read of the norm per step) under the foreach hooks: what
    # --use-foreach-grad-norm did before its norm stayed on the device.
    _set_grad_norm(device_norm=not on)


def _toggle_fusions(backend, on: bool, device: str) -> None:
    # megatron-core's MLP and TransformerLayer read these fields at every forward (all modules share one config).
    backend.module.config.bias_activation_fusion = on
    backend.module.config.bias_dropout_fusion = on


def _toggle_compile(backend, on: bool, device: str) -> None:
    from slime_train_megatron.model import compile_decoder_layers

    backend.settings.megatron_compile_layers = on  # the pipeline passes RoPE the boundaries the compiled layers want
    if on:  # CPU smoke mode: dynamo's graphs without inductor's C++ build
        # BENCH_CPU_INDUCTOR=1: inductor's C++ code on CPU too (slower; what CUDA runs, minus Triton)
        inductor = device == "cuda" or os.environ.get("BENCH_CPU_INDUCTOR")
        compile_decoder_layers(backend.module, backend="inductor" if inductor else "aot_eager")
    else:
        for layer in backend.module.decoder.layers:
            layer._compiled_call_impl = None  # what nn.Module.compile set: back to the eager call


def _toggle_paramcopy(backend, on: bool, device: str) -> None:
    from slime_train_megatron.torch_optimizer import use_foreach_param_copy

    use_foreach_param_copy(on)


#: Issue 26's speed switches: name -> (the run flags, a toggle that sets on the live backend what they set at init).
SWITCHES = {
    "head": ("--log-probs-head fused", _toggle_head),
    "adam": ("--use-torch-fused-adam", _toggle_adam),
    "gradnorm": ("--use-foreach-grad-norm", _toggle_gradnorm),
    "fusions": ("--bias-swiglu-fusion --bias-dropout-fusion", _toggle_fusions),
    "compile": ("--megatron-compile-layers", _toggle_compile),
    "paramcopy": ("", _toggle_paramcopy),  # no flag: always on in runs (one foreach copy of the updated parameters)
    "hostnorm": ("(bench only: megatron-core's host-read norm and clip)", _toggle_hostnorm),
}
#: `--ab` variants: the switches each turns on (the rest off).
#: `all_hostnorm` is `all` with megatron-core's own grad norm and clip (one host read of the norm per optimizer step, as
#: `--use-foreach-grad-norm` did before 1f79974): `all` vs `all_hostnorm` in one process measures that read.
#: `eager_all` is `all` without `compile`: whether the other three pay once the step has no host sync per micro-batch,
#: without the compile warm-up (105.7 s on the H100 at 0f85a3c) every launch pays.
#: `base` is megatron-core as it comes (its per-parameter copy loop too); `defaults` is a run without speed flags;
#: `all_loopcopy` is `all` with megatron-core's copy loop: `all` vs `all_loopcopy` measures `paramcopy`.
VARIANTS = {
    "base": (),
    **{name: (name,) for name in SWITCHES},
    "defaults": ("paramcopy",),
    "all": ("head", "adam", "gradnorm", "compile", "paramcopy"),
    "all_loopcopy": ("head", "adam", "gradnorm", "compile"),
    "eager_all": ("head", "adam", "gradnorm", "paramcopy"),
    "all_hostnorm": ("head", "adam", "gradnorm", "compile", "paramcopy", "hostnorm"),
}


def ab_variants(spec: str) -> list[str]:
    """The variant names of an `--ab` value ("base,head,gradnorm"), in order.

    Raises:
        ValueError: an unknown variant name (checked before the model loads, so a typo costs no start-up).
    """
    variants = [v.strip() for v in spec.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"--ab: unknown variants {unknown}; known: {sorted(VARIANTS)}")
    return variants


def run_ab(backend, batch, a: argparse.Namespace, flops: dict) -> list[dict]:
    """Times each `--ab` variant on the live backend (switches toggled in between); one dict per variant.

    Each variant sets every switch (on: its own; off: the others, also those the run's flags turned on). A variant
    whose train() raises is recorded with its `error` and the next one runs.

    Raises:
        ValueError: an unknown variant name.
    """
    variants = ab_variants(a.ab)
    profiled = set(variants if a.profile_variants is None else a.profile_variants.split(","))
    out: list[dict] = []
    on_now: set[str] | None = None  # unknown before the first variant (the run's flags): every switch is set then
    for name in variants:
        want = set(VARIANTS[name])
        for switch in sorted(set(SWITCHES) - want if on_now is None else on_now - want):
            SWITCHES[switch][1](backend, False, a.device)
        for switch in sorted(want if on_now is None else want - on_now):
            SWITCHES[switch][1](backend, True, a.device)
        on_now = want
        flags = " ".join(SWITCHES[switch][0] for switch in sorted(want) if SWITCHES[switch][0])
        _common.logger.info("--ab %s: switches set (%s); 1 warm-up + %d timed train()", name, flags or "none",
                            a.repeats)  # fmt: skip
        try:
            warm_s, times, metrics, peak = _common.time_train(backend, batch, a.device, a.repeats)
        except Exception as e:  # a switch that breaks on this machine is a result too; the next variant runs
            _common.logger.exception("--ab variant %s failed", name)
            out.append({"variant": name, "flags": flags, "error": f"{type(e).__name__}: {e}"[:1000]})
            continue
        t = _common.median(times)
        entry = {"variant": name, "flags": flags, "train_s_median": t, "train_s_all": times, "warmup_s": warm_s,
                 "mfu": flops["total"] / t / 1e12 / a.peak_tflops, "achieved_tflops": flops["total"] / t / 1e12,
                 "peak_mem_gib": peak, "grad_norm": metrics.get("train/grad_norm")}  # fmt: skip
        # On stderr as soon as it is known, before the profiles: a step cut by its timeout still shows the times.
        _common.logger.info("--ab %s: %.3f s per train() (warm-up %.1f s), MFU %.1f %%, grad norm %s", name, t, warm_s,
                            100 * entry["mfu"], entry["grad_norm"])  # fmt: skip
        if a.profile and a.device == "cuda" and name in profiled:
            entry["profile"] = _common.profile_summary(lambda: backend.train(0, batch))
        if a.profile_gaps and a.device == "cuda" and name in profiled:
            _common.logger.info("--ab %s: profiling with Python stacks (the gap attribution)", name)
            entry["gaps"] = _common.profile_gaps(lambda: backend.train(0, batch))
        out.append(entry)
    base = next((e for e in out if e["variant"] == variants[0] and "error" not in e), None)
    for e in out:
        if base is not None and "error" not in e:
            e["speedup_vs_first"] = base["train_s_median"] / e["train_s_median"]
    return out


class _CpuAdam:
    """CPU smoke mode: megatron-core's optimizer interface (as the backend uses it) over torch Adam."""

    def __init__(self, config, models):
        import torch

        self.params = [p for m in models for p in m.parameters() if p.requires_grad]
        self.opt = torch.optim.Adam(self.params, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2))
        self.param_groups, self.clip = self.opt.param_groups, config.clip_grad

    def scale_loss(self, loss):
        return loss

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def reload_model_params(self):
        pass

    def step(self):
        import torch

        for p in self.params:  # megatron's DDP accumulates into main_grad
            p.grad = p.main_grad.to(p.dtype)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        return True, float(norm), None


def _cpu_schedule(*, forward_step_func, data_iterator, model, num_microbatches, forward_only, **_):
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model[0])
        loss, _, _ = loss_func(output)
        if not forward_only:
            (loss / num_microbatches).backward()  # as megatron-core's forward_step (the backend multiplies it back)
    if not forward_only:
        model[0].config.finalize_model_grads_func(model)


def _cpu_shims() -> None:
    """CPU smoke mode: stand-ins for megatron-core's CUDA-only pieces (see the module docstring)."""
    import torch
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    from slime_train_megatron import pipeline, trainer_parts

    torch.cuda.current_device = lambda: "cpu"  # RoPE buffers and the attention dropout RNG ask for it
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    trainer_parts.get_megatron_optimizer = _CpuAdam
    pipeline.get_forward_backward_func = lambda: _cpu_schedule


def main(argv: list[str] | None = None) -> dict:
    """Parses flags, runs the benchmark, emits the JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-0.6b", help="make_model preset (qwen3-tiny for a CPU smoke test)")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--tokens-per-mb", type=int, default=8192)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--steps-per-rollout", type=int, default=2)
    p.add_argument("--mbs-per-step", type=int, default=1)
    p.add_argument("--repeats", "--steps", type=int, default=3, help="timed train() calls after one warm-up call")
    p.add_argument("--attention-backend", default="auto", choices=["auto", "flash", "fused", "unfused", "local"])
    p.add_argument("--transformer-impl", default=None, choices=["transformer_engine", "local"])
    p.add_argument("--recompute", action="store_true", help="full activation recomputation of every layer")
    p.add_argument("--peak-tflops", type=float, default=790.0, help="MFU denominator (measured bf16 matmul rate)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--log-probs-head", default=None, choices=["fused"], help="the run flag (default: fused on CUDA)")
    p.add_argument(
        "--megatron-extra",
        default="",
        help="more Megatron flags, given with '=': --megatron-extra='--use-torch-fused-adam'",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile one more train() (CUDA): GPU busy vs wall time, kernels by category",
    )
    p.add_argument(
        "--profile-gaps",
        action="store_true",
        help="also profile one more train() with Python stacks (CUDA): the GPU's idle gaps by host frame and op",
    )
    p.add_argument("--ab", default=None, help=f"variants timed in one process, comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--profile-variants", default=None, help="with --ab --profile: the variants profiled (default all)")
    a = p.parse_args(argv)
    if a.ab:
        try:
            ab_variants(a.ab)
        except ValueError as e:
            p.error(str(e))
    _common.setup_logging()
    import torch
    import torch.distributed as dist

    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA GPU is visible")
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    model_dir, write_s = _common.ensure_model(a.preset, a.model_root)
    import transformers

    from slime_core.train_step import can_reuse_old_log_probs
    from slime_train_megatron import MegatronTrainBackend

    if a.device == "cuda":
        torch.cuda.set_device(0)
    else:
        _cpu_shims()
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    try:
        backend = MegatronTrainBackend()
        args = make_args(model_dir, a)
        load_s, _ = _common.timed(lambda: backend.init(args, with_ref=False), a.device)
        batch = bench_train_fsdp.make_batch(a)
        old_forward = not can_reuse_old_log_probs(args, batch)
        flops = bench_train_fsdp.train_flops(transformers.AutoConfig.from_pretrained(model_dir), a, old_forward)
        ab, prof = [], {}
        if a.ab:
            ab = run_ab(backend, batch, a, flops)
            first = ab[0]
            if "error" in first:
                raise RuntimeError(f"--ab: the first variant ({first['variant']}) failed: {first['error']}")
            warm_s, times, peak = first["warmup_s"], first["train_s_all"], first["peak_mem_gib"]
            metrics = {"train/grad_norm": first["grad_norm"]}
            head = "fused" if "head" in VARIANTS[first["variant"]] else "logits"
        else:
            warm_s, times, metrics, peak = _common.time_train(backend, batch, a.device, a.repeats)
            head = backend.head
            if a.profile and a.device == "cuda":
                prof = {"profile": _common.profile_summary(lambda: backend.train(0, batch))}
            if a.profile_gaps and a.device == "cuda":
                prof["gaps"] = _common.profile_gaps(lambda: backend.train(0, batch))
        t = _common.median(times)
        tokens = batch.num_samples * a.seq_len
        n_params = sum(int(x.numel()) for x in backend.module.parameters())
        return _common.emit("train_megatron", {
            "device": _common.device_name(a.device), "preset": a.preset, "n_params": n_params,
            "n_body": flops["n_body"], "tokens_per_mb": a.tokens_per_mb, "seq_len": a.seq_len,
            "response_len": a.response_len, "seqs_per_mb": a.tokens_per_mb // a.seq_len,
            "steps_per_rollout": a.steps_per_rollout, "mbs_per_step": a.mbs_per_step, "recompute": a.recompute,
            "tp": 1, "pp": 1, "cp": 1, "transformer_engine": backend.attention == "transformer_engine",
            "attention_backend": a.attention_backend, "attention": backend.attention,
            "old_logprob_forward": old_forward, "repeats": a.repeats, "train_s_median": t, "train_s_all": times,
            "warmup_s": warm_s, "load_s": load_s, "checkpoint_write_s": write_s, "tokens_per_train": tokens,
            "tokens_per_s": tokens / t, "model_tflops_per_train": flops["total"] / 1e12,
            "attention_share": flops["attention"] / flops["total"], "achieved_tflops": flops["total"] / t / 1e12,
            "mfu": flops["total"] / t / 1e12 / a.peak_tflops, "peak_tflops": a.peak_tflops,
            "peak_mem_gib": peak, "grad_norm": metrics.get("train/grad_norm"), "log_probs_head": head,
            "compile_layers": backend.settings.megatron_compile_layers, "megatron_extra": a.megatron_extra,
            **prof, **({"ab": ab} if a.ab else {}),
        })  # fmt: skip
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
