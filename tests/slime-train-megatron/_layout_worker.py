"""Ranks of `test_parallel_layouts_cpu.py`: the Megatron backend's RL step under one parallel layout after another.

`python _layout_worker.py WORLD PORT HF_DIR OUT_DIR SCENARIOS_JSON` spawns WORLD gloo ranks; each runs the scenarios in
order (megatron-core's parallel groups rebuilt for each) and rank 0 writes `OUT_DIR/<name>.pt`: the per-sample
log-probs before and after one rollout's training (gathered over DP, keyed by sample index), the metrics of rank 0
(what the trainer group returns) and of the last rank, the rollout id `init` returned and the Adam step count.

Unlike the one-rank `cpu_backend_env` fixture, nothing of the backend is replaced: megatron-core's own optimizer (fp32,
not distributed: that one needs CUDA tensors) and pipeline schedules run; only their `device="cuda"` tensor factories
land on the CPU (`_TorchOnCpu`), with the RoPE-device, RNG-fork and synchronize shims of conftest.py. A scenario's
`hf` names another HF directory than HF_DIR.
"""

import contextlib
import json
import os
import sys
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Six samples of 3 GRPO groups: (total length, response length, reward); one masked response token each from 4 on.
SAMPLES = [(17, 5, 1.0), (33, 12, -1.0), (9, 3, 0.5), (24, 10, -0.5), (13, 4, 0.25), (6, 2, 1.0)]


class _TorchOnCpu(types.ModuleType):
    """`torch` for megatron-core modules that build `device="cuda"` tensors (token counters, norms, scales)."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name):
        value = getattr(torch, name)
        if name not in ("zeros", "tensor", "ones", "empty", "full"):
            return value

        def factory(*args, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return value(*args, **kwargs)

        return factory


def _cpu_shims() -> None:
    from megatron.core.optimizer import clip_grads, optimizer
    from megatron.core.pipeline_parallel import p2p_communication, schedules
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a: None
    # Tied embeddings under PP: megatron-core moves the last stage's copy with `.cuda()` before summing the two stages'.
    torch.Tensor.cuda = lambda self, *a, **k: self
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    for module in (schedules, p2p_communication, optimizer, clip_grads):
        module.torch = _TorchOnCpu()


def _samples():
    from slime_core.sample import Sample

    g = torch.Generator().manual_seed(0)
    out = []
    for i, (n, r, reward) in enumerate(SAMPLES):
        mask = [1] * r
        if r > 3:
            mask[1] = 0
        tokens = torch.randint(1, 300, (n,), generator=g).tolist()
        out.append(Sample(tokens=tokens, response_length=r, reward=reward, index=i, group_index=i // 2, loss_mask=mask))
    return out


def _by_index(batch, values) -> dict[int, torch.Tensor]:
    """This DP rank's per-sample values, gathered from every rank: sample index → tensor."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, dict(zip(batch.sample_indices, values, strict=True)))
    return {i: v for part in out for i, v in part.items()}


def _scenario(spec: dict, hf_dir: str) -> dict:
    from megatron.core import parallel_state

    from slime_core.config import SlimeArgs
    from slime_core.train_data import build_rollout_batches
    from slime_train_megatron.backend import MegatronTrainBackend

    run = dict(rollout_batch_size=3, n_samples_per_prompt=2, global_batch_size=3, micro_batch_size=1, num_rollout=2,
               train_backend="megatron", hf_checkpoint=hf_dir, advantage_estimator="grpo", rollout_temperature=0.8,
               kl_coef=0.0, use_kl_loss=False, entropy_coef=0.01, eps_clip=0.2)  # fmt: skip
    flags = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]
    flags += ["--make-vocab-size-divisible-by", "1", *spec.get("flags", [])]
    run["hf_checkpoint"] = spec.get("hf", hf_dir)
    cfg = SlimeArgs.from_dict({**run, **spec.get("cfg", {}), "megatron_args": flags})
    backend = MegatronTrainBackend()
    start = backend.init(cfg, with_ref=False)
    batch = build_rollout_batches(cfg, _samples(), dp_size=parallel_state.get_data_parallel_world_size())
    batch = batch[parallel_state.get_data_parallel_rank()]
    adam = [state["step"] for state in backend.optimizer.optimizer.state.values() if "step" in state]
    result = {"start": start, "adam_steps": int(adam[0]) if adam else 0}
    if spec.get("export_first"):
        backend.save_hf(spec["export_first"])
    result["lp"] = _by_index(batch, backend.compute_log_probs(batch))
    metrics = backend.train(start, batch)
    last: list = [None] * dist.get_world_size()
    dist.all_gather_object(last, metrics)
    result["metrics"], result["metrics_last"] = metrics, last[-1]
    result["after"] = _by_index(batch, backend.compute_log_probs(batch))
    if spec.get("save"):
        backend.save(start)
        if spec.get("export"):
            backend.save_hf(spec["export"])
        # A later iteration in the tracker: the loads pick iteration `start` with --ckpt-step.
        result["metrics_2"] = backend.train(start + 1, batch)
        result["after_2"] = _by_index(batch, backend.compute_log_probs(batch))
        backend.save(start + 1)
    parallel_state.destroy_model_parallel()
    return result


def run(rank: int, world: int, port: int, hf_dir: str, out_dir: str, scenarios: list[dict]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _cpu_shims()
    for spec in scenarios:
        result = _scenario(spec, hf_dir)
        if rank == 0:
            torch.save(result, os.path.join(out_dir, f"{spec['name']}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(sys.argv[1])
    mp.spawn(run, args=(world_size, int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5])),
             nprocs=world_size)  # fmt: skip
