"""One rank of the GPU scenarios of test_backend_gpu.py (run as a script: `python _gpu_worker.py ...`).

Usage: python _gpu_worker.py <scenario> <hf_dir> <out_dir> <tp>   (RANK/WORLD_SIZE/MASTER_* in the env)
"""

import os
import sys

import torch
import torch.distributed as dist


def batch():
    from slime_core.batch import RolloutBatch

    g = torch.Generator().manual_seed(0)
    tokens = [torch.randint(1, 300, (n,), generator=g) for n in (17, 33, 9, 24)]
    resp = [5, 12, 3, 10]
    return RolloutBatch(
        tokens=tokens,
        response_lengths=resp,
        loss_masks=[torch.ones(r) for r in resp],
        rewards=[1.0, -1.0, 0.5, -0.5],
        raw_rewards=[1.0, 0.0, 1.0, 0.0],
        loss_denominators=[float(r) for r in resp],
        micro_batches=[[[0, 1], [2, 3]]],
        step_sample_counts=[4],
        step_token_counts=[float(sum(resp))],
    )


def critic_scenario(args, tp: int) -> dict:
    """Values before/after two critic steps of `MegatronCriticBackend` (with --sequence-parallel when TP > 1)."""
    from slime_core.critic import critic_config
    from slime_train_megatron.critic_backend import MegatronCriticBackend

    flags = ["--tensor-model-parallel-size", str(tp), "--bf16", *(["--sequence-parallel"] if tp > 1 else [])]
    run = args.model_copy(update={"advantage_estimator": "ppo", "megatron_args": flags, "critic_lr": 1e-3})
    cfg = critic_config(run)
    critic = MegatronCriticBackend()
    critic.init(cfg)
    with torch.no_grad():  # the same head on every run: N(0, 0.02) drawn here from a fixed seed
        head = critic.module.output_layer
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(3)) * 0.02)
    critic.optimizer.reload_model_params()
    b = batch()
    values = critic.compute_values(b)
    metrics = [critic.train_critic(rid, b)[0] for rid in range(2)]
    return {"values": values, "metrics": metrics, "after": critic.compute_values(b)}


#: speed_all: every issue-26 speed switch of the Megatron backend on (speed_base: all off).
SPEED_FLAGS = ["--use-torch-fused-adam", "--use-foreach-grad-norm", "--bias-swiglu-fusion", "--bias-dropout-fusion",
               "--megatron-compile-layers"]  # fmt: skip

#: recompute: the original scripts' full recompute; megatron-core's checkpoint saves and replays the CUDA RNG tracker
#: (the CPU test, test_backend_cpu.py, replaces that save and restore) around the compiled layers on by default.
RECOMPUTE_FLAGS = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]


def main() -> None:
    scenario, hf_dir, out_dir, tp = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    from slime_core.config import SlimeArgs

    # attn_<backend>: train with `--attention-backend <backend>` (auto: slime's packed varlen, local: dense mask).
    # Eager layers for both: the attention is what is compared (compiled layers are the speed test's).
    attention = (
        ["--attention-backend", scenario.split("_", 1)[1], "--no-megatron-compile-layers"]
        if scenario.startswith("attn_")
        else []
    )
    # speed_base turns off what is on by default on CUDA (compiled layers, the fused head).
    speed = {
        "speed_all": SPEED_FLAGS,
        "speed_base": ["--no-megatron-compile-layers"],
        "recompute": RECOMPUTE_FLAGS,
    }.get(scenario, [])
    from slime_train_megatron.backend import MegatronTrainBackend

    args = SlimeArgs.from_dict(
        dict(
            rollout_batch_size=1,
            num_rollout=1,
            train_backend="megatron",
            hf_checkpoint=hf_dir,
            megatron_args=[*("--tensor-model-parallel-size", str(tp), "--bf16", "--lr", "1e-5"), *attention, *speed],
            log_probs_head="fused" if scenario == "speed_all" else None,
            advantage_estimator="grpo",
            rollout_temperature=0.8,
            kl_coef=0.0,
            use_kl_loss=False,
            entropy_coef=0.0,
            eps_clip=0.2,
            offload_train_pin_memory=scenario == "sleep_pinned",
        )
    )
    if scenario == "critic":  # the PPO value model; TP > 1 with sequence parallelism (the value head gathers)
        torch.save(critic_scenario(args, tp), os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
        dist.destroy_process_group()
        return
    backend = MegatronTrainBackend()
    backend.init(args, with_ref=False)
    if scenario == "speed_base":  # no flag picks megatron-core's logits head on a GPU at TP 1 (the bench's switch)
        backend.set_log_probs_head("logits")
    b = batch()
    result = {"log_probs": backend.compute_log_probs(b)}
    result["attention"] = backend.attention
    if scenario in ("train", "tp", "recompute") or attention or scenario.startswith("speed_"):
        result["metrics"] = backend.train(0, b)
        # The DDP buffers hold the step's gradients until the next step zeroes them.
        result["grads"] = {n: p.main_grad.float().cpu() for n, p in backend.module.named_parameters()}
        pushed = [kv for bucket in backend.named_hf_weights(1 << 20) for kv in bucket]
        result["pushed"] = {n: t.float().cpu() for n, t in pushed}
        from slime_convert.mapping import mcore_to_hf

        if tp == 1:
            result["own"] = {
                n: t.float().cpu()
                for name, p in backend.module.named_parameters()
                for n, t in mcore_to_hf(name, p.detach(), backend.model_args)
            }
    if scenario.startswith("speed_"):  # a second step: the optimizer's update of the first shows in its loss
        result["metrics_2"] = backend.train(1, b)
        result["after"] = backend.compute_log_probs(b)
    if scenario == "sleep":
        before = backend.compute_log_probs(b)
        free_before = torch.cuda.mem_get_info()[0]
        backend.sleep()
        result["freed"] = torch.cuda.mem_get_info()[0] - free_before
        result["offloaded"] = sum(b.numel() for _, b in backend.residency.state)
        result["param_bytes"] = sum(p.numel() * p.element_size() for p in backend.module.parameters())
        backend.wake_up()
        result["after"] = backend.compute_log_probs(b)
        result["before"] = before
    if scenario == "sleep_pinned":  # --offload-train-pin-memory: the second sleep refills the first's host buffers
        backend.train(0, b)  # torch's Adam makes its moments at the first step: both sleeps then hold the same storages
        backend.sleep()
        first = [buf.data_ptr() for _, buf in backend.residency.state]
        backend.wake_up()
        result["metrics"] = backend.train(1, b)  # new weights and moments: what the reused buffers must hold
        result["before"] = backend.compute_log_probs(b)
        backend.sleep()
        result["reused"] = [buf.data_ptr() for _, buf in backend.residency.state] == first and len(first) > 0
        result["pinned"] = all(buf.is_pinned() for _, buf in backend.residency.state)
        backend.wake_up()
        result["after"] = backend.compute_log_probs(b)
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
