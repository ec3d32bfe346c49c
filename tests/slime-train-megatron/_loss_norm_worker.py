"""Ranks of `test_loss_normalization_cpu.py`: the Megatron backend's step gradients over the cases of
`tests/_loss_norm_cases.py` (uneven DP splits, empty micro-batch slots, masked samples), at any DP size.

`python _loss_norm_worker.py WORLD PORT HF_DIR OUT_DIR` spawns WORLD gloo ranks (DP = WORLD) with the CPU shims of
`_layout_worker.py` (megatron-core's own optimizer and schedules run); each rank writes `OUT_DIR/rank{r}.pt`: per case
and loss mode, its schedule, the gradient every optimizer step would apply (DDP's `main_grad` after megatron-core's
DP reduction, of the embedding and the output layer) and the steps' `train/*` metrics. The optimizer never steps, so
every case is taken at the initial weights.
"""

import importlib.util
import os
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: The parameters compared with the HF reference (their layouts are HF's: `[vocab, hidden]`).
COMPARED = {"embedding.word_embeddings.weight": "model.embed_tokens.weight", "output_layer.weight": "lm_head.weight"}


def _load(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_here = pathlib.Path(__file__).resolve()
cases = _load("slime_tests_loss_norm_cases", _here.parents[1] / "_loss_norm_cases.py")
VOCAB = 300  # conftest.TINY's


def case_args(hf_dir: str, name: str, per_token: bool):
    """The Megatron run config of case `name` (fp32, local layers, megatron-core's non-distributed optimizer)."""
    from slime_core.config import SlimeArgs

    flags = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3",
             "--make-vocab-size-divisible-by", "1"]  # fmt: skip
    run = {**cases.run_config(name, per_token), "train_backend": "megatron", "hf_checkpoint": hf_dir}
    return SlimeArgs.from_dict({**run, "megatron_args": flags})


def run(rank: int, world: int, port: int, hf_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    _load("slime_megatron_test_layout_worker", _here.with_name("_layout_worker.py"))._cpu_shims()
    from slime_train_megatron.backend import MegatronTrainBackend

    backend = MegatronTrainBackend()
    backend.init(case_args(hf_dir, "even", False), with_ref=False)
    grads: list[dict[str, torch.Tensor]] = []

    def capture():  # the step's gradient after the DP reduction; the weights stay as they are
        named = dict(backend.module.named_parameters())
        grads.append({hf: named[name].main_grad.detach().clone() for name, hf in COMPARED.items()})
        return torch.zeros(()), 0.0

    backend.optimizer_step = capture
    res = cases.train_every_case(
        backend,
        lambda name, per_token: case_args(hf_dir, name, per_token),
        lambda name: cases.case_samples(name, VOCAB),
        grads,
        rank,
        world,
    )
    torch.save(res, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(sys.argv[1])
    mp.spawn(run, args=(world_size, int(sys.argv[2]), sys.argv[3], sys.argv[4]), nprocs=world_size)
