"""FSDPTrainBackend training throughput and MFU on one GPU.

`python3 benchmarks/bench_train_fsdp.py --preset qwen3-0.6b [--tokens-per-mb 8192] [--seq-len 1024]
[--response-len 512] [--steps-per-rollout 2] [--mbs-per-step 1] [--repeats 3] [--gradient-checkpointing]`

World size 1 (NCCL on CUDA, gloo on CPU), bf16 compute with fp32 master weights (the backend's mixed
precision). One `train()` call = the old-log-prob forward over the whole batch (skipped by the backend when
the rollout has a single optimizer step, hence `--steps-per-rollout 2` by default) + `steps_per_rollout`
optimizer steps of `mbs_per_step` packed micro-batches, each `tokens_per_mb // seq_len` sequences of
`seq_len` tokens (the last `response_len` are the response). One warm-up `train()`, then `--repeats` timed
calls (device-synchronized host clock), median reported.

MFU = model FLOPs of one train() / median time / `--peak-tflops` (default: 790, the bf16 matmul rate measured
on an H200 by bench_matmul.py; pass your own measurement). Model FLOPs: `_common.transformer_flops`
(fwd+bwd per step, plus one forward for the old log-probs when the backend computes them).
The checkpoint is a random-weight make_model preset written once under `--model-root` (the backend loads
safetensors). Budget on an H200: 0.6B ≈ 60 s, 4B ≈ 150 s including the checkpoint write.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import _common  # sibling module: a script's own directory is first on sys.path

VOCAB_SAMPLED = 151_000  # token ids drawn below the real Qwen3 vocab (151669)


def make_args(model_dir: Path, a: argparse.Namespace):
    """The run config (`SlimeArgs`, config defaults, GRPO) with the benchmark's model and FSDP options."""
    from slime_core.config import SlimeArgs

    return SlimeArgs.from_dict(dict(
        hf_checkpoint=str(model_dir), train_backend="fsdp", rollout_temperature=1.0, lr=1e-6, min_lr=0.0,
        lr_warmup_iters=0,
        lr_decay_style="constant", lr_decay_iters=None, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.98,
        adam_eps=1e-8, clip_grad=1.0, seed=1234, advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28,
        eps_clip_c=None, entropy_coef=0.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="low_var_kl",
        kl_coef=0.0, gamma=1.0, lambd=1.0, normalize_advantages=False, calculate_per_token_loss=False,
        use_rollout_logprobs=False, use_tis=False, log_probs_chunk_size=-1,
        attn_implementation=a.attn_implementation, log_probs_head=a.log_probs_head,
        fsdp_compile_layers={"auto": None, "on": True, "off": False}[a.compile_layers],
        gradient_checkpointing=a.gradient_checkpointing,
        fsdp_cpu_offload=False, update_weight_buffer_size=512 * 1024**2, load=None, save=None, ref_load=None,
        start_rollout_id=None, num_rollout=100, rollout_batch_size=1, n_samples_per_prompt=1, global_batch_size=1,
    ))  # fmt: skip


def make_batch(a: argparse.Namespace, seed: int = 0):
    """A RolloutBatch of `steps × mbs × seqs` random sequences; rewards ±1 alternating, all tokens trained."""
    import torch

    from slime_core.batch import RolloutBatch

    if not 0 < a.response_len < a.seq_len:
        raise ValueError(f"--response-len {a.response_len} must be in (0, --seq-len {a.seq_len})")
    per_mb = a.tokens_per_mb // a.seq_len
    if per_mb < 1:
        raise ValueError(f"--tokens-per-mb {a.tokens_per_mb} is smaller than --seq-len {a.seq_len}")
    g = torch.Generator().manual_seed(seed)
    n = a.steps_per_rollout * a.mbs_per_step * per_mb
    tokens = [torch.randint(0, VOCAB_SAMPLED, (a.seq_len,), generator=g) for _ in range(n)]
    micro, i = [], 0
    for _ in range(a.steps_per_rollout):
        step = []
        for _ in range(a.mbs_per_step):
            step.append(list(range(i, i + per_mb)))
            i += per_mb
        micro.append(step)
    per_step = a.mbs_per_step * per_mb
    rewards = [1.0 if j % 2 == 0 else -1.0 for j in range(n)]
    return RolloutBatch(
        tokens=tokens, response_lengths=[a.response_len] * n,
        loss_masks=[torch.ones(a.response_len) for _ in range(n)], rewards=rewards, raw_rewards=rewards,
        loss_denominators=[float(a.response_len)] * n, micro_batches=micro, truncated=[0] * n,
        sample_indices=list(range(n)), step_sample_counts=[per_step] * a.steps_per_rollout,
        step_token_counts=[float(per_step * a.response_len)] * a.steps_per_rollout, metadata=[{} for _ in range(n)],
    )  # fmt: skip


def train_flops(config, a: argparse.Namespace, old_forward: bool) -> dict[str, float]:
    """Model FLOPs of one train() call (see `_common.transformer_flops`)."""
    per_mb = a.tokens_per_mb // a.seq_len
    n_mbs = a.steps_per_rollout * a.mbs_per_step
    seqs = [a.seq_len] * per_mb
    # The lm_head scores the positions predicting response tokens: response_len per sequence.
    one = _common.transformer_flops(config, seqs, lm_head_tokens=per_mb * a.response_len, backward=True)
    fwd = _common.transformer_flops(config, seqs, lm_head_tokens=per_mb * a.response_len, backward=False)
    total = n_mbs * one["total"] + (n_mbs * fwd["total"] if old_forward else 0.0)
    attn = n_mbs * one["attention"] + (n_mbs * fwd["attention"] if old_forward else 0.0)
    return {"total": total, "attention": attn, "n_body": one["n_body"]}


def measure_swap(backend, device: str, repeats: int) -> dict[str, float]:
    """Median seconds of `sleep()` and `wake_up()` (device-synchronized) through pinned and pageable buffers.

    The state moved is the trainer's whole shard: fp32 parameters and the optimizer's moments (after a
    train() call, so Adam's states exist). Pinned first: its first sleep allocates the buffers (reported
    as `swap_pinned_first_sleep_s`), later ones reuse them.
    """
    from slime_train_fsdp.offload import HostOffloader

    out: dict[str, float] = {}
    for name, pin in (("pinned", True), ("pageable", False)):
        backend._host = HostOffloader(backend.model, backend.optimizer, pin_memory=pin)
        sleeps, wakes = [], []
        for _ in range(repeats + 1):
            sleeps.append(_common.timed(backend.sleep, device)[0])
            wakes.append(_common.timed(backend.wake_up, device)[0])
        out[f"swap_{name}_first_sleep_s"] = sleeps[0]
        out[f"swap_{name}_sleep_s"] = _common.median(sleeps[1:])
        out[f"swap_{name}_wake_s"] = _common.median(wakes[1:])
        if pin:
            out["swap_state_gib"] = backend._host.pinned_bytes / 2**30
    backend._host = None  # back to the run's own setting
    return out


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
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--attn-implementation", default=None, help="default: the backend's (slime_varlen on GPU)")
    p.add_argument("--log-probs-head", default=None, help="default: the backend's (fused on GPU, fp32 on CPU)")
    p.add_argument(
        "--compile-layers",
        default="auto",
        choices=["auto", "on", "off"],
        help="--fsdp-compile-layers (auto: on with CUDA)",
    )
    p.add_argument("--peak-tflops", type=float, default=790.0, help="MFU denominator (measured bf16 matmul rate)")
    p.add_argument(
        "--swap", action="store_true", help="also time the colocated sleep()/wake_up() swap, pinned vs pageable"
    )
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--profile", action="store_true",
        help="also profile one more train() (CUDA): GPU busy vs wall time, kernel time by category, top kernels",
    )  # fmt: skip
    a = p.parse_args(argv)
    _common.setup_logging()
    import torch
    import torch.distributed as dist

    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA GPU is visible")
    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the backend picks CUDA whenever it sees one
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    model_dir, write_s = _common.ensure_model(a.preset, a.model_root)
    from slime_core.train_step import can_reuse_old_log_probs
    from slime_train_fsdp import FSDPTrainBackend

    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    try:
        backend = FSDPTrainBackend()
        args = make_args(model_dir, a)
        load_s, _ = _common.timed(lambda: backend.init(args, with_ref=False), a.device)
        batch = make_batch(a)
        old_forward = not can_reuse_old_log_probs(args, batch)
        warm_s, times, metrics, peak = _common.time_train(backend, batch, a.device, a.repeats)
        swap = measure_swap(backend, a.device, a.repeats) if a.swap else {}
        prof = {}
        if a.profile and a.device == "cuda":
            prof = {"profile": _common.profile_summary(lambda: backend.train(0, batch))}
        flops = train_flops(backend.config, a, old_forward)
        t = _common.median(times)
        tokens = batch.num_samples * a.seq_len
        n_params = sum(int(x.numel()) for x in backend.model.parameters())
        return _common.emit("train_fsdp", {
            "device": _common.device_name(a.device), "preset": a.preset, "n_params": n_params,
            "n_body": flops["n_body"], "tokens_per_mb": a.tokens_per_mb, "seq_len": a.seq_len,
            "response_len": a.response_len, "seqs_per_mb": a.tokens_per_mb // a.seq_len,
            "steps_per_rollout": a.steps_per_rollout, "mbs_per_step": a.mbs_per_step,
            "gradient_checkpointing": a.gradient_checkpointing,
            "attn_implementation": backend.model.config._attn_implementation,
            "log_probs_head": backend.model.slime_forward_options.head, "compile_layers": a.compile_layers,
            "old_logprob_forward": old_forward, "repeats": a.repeats, "train_s_median": t, "train_s_all": times,
            "warmup_s": warm_s, "load_s": load_s, "checkpoint_write_s": write_s, "tokens_per_train": tokens,
            "tokens_per_s": tokens / t, "model_tflops_per_train": flops["total"] / 1e12,
            "attention_share": flops["attention"] / flops["total"], "achieved_tflops": flops["total"] / t / 1e12,
            "mfu": flops["total"] / t / 1e12 / a.peak_tflops, "peak_tflops": a.peak_tflops,
            "peak_mem_gib": peak, "grad_norm": metrics.get("train/grad_norm"), **swap, **prof,
        })  # fmt: skip
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
