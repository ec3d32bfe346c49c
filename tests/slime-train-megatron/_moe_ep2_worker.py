"""Two gloo ranks, expert parallelism 2: HF load, HF export, logits and torch_dist round trips of a Qwen3-MoE.

Run by `test_moe_cpu.py::test_expert_parallel_two_ranks_export_logits_and_torch_dist`:
`python _moe_ep2_worker.py PORT HF_DIR CKPT_DIR LAYOUTS` prints `RESULT <json list, one dict per rank>`. LAYOUTS is
a JSON list of `initialize_model_parallel` kwargs tried first on the same two ranks (the spawn, the imports and the
process group are the cost of a two-rank check): each one's `[expert-TP, EP]` world sizes, or its RuntimeError.
"""

import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _layouts(layouts: list[dict]) -> list:
    """`[expert-TP world size, EP world size]` that megatron-core builds from each kwargs, or its error text."""
    from megatron.core import parallel_state

    results = []
    for kwargs in layouts:
        try:
            parallel_state.initialize_model_parallel(**kwargs)
            results.append([parallel_state.get_expert_tensor_parallel_world_size(),
                            parallel_state.get_expert_model_parallel_world_size()])  # fmt: skip
        except RuntimeError as e:
            results.append(str(e))
        parallel_state.destroy_model_parallel()
    return results


def run(rank: int, port: int, hf_dir: str, ckpt_dir: str, layouts: list[dict]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from slime_convert import ModelArgs, hf_to_mcore
    from slime_train_megatron.model import build_gpt_model, build_transformer_config, iter_hf_weights, load_hf_weights
    from slime_train_megatron.settings import MegatronSettings

    # The CPU shims of the tests' `megatron_cpu_world`: RoPE's device, no CUDA RNG to fork, no stream to synchronize.
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a: None
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    result: dict = {"rank": rank, "layouts": _layouts(layouts)}
    settings = MegatronSettings(fp32=True, transformer_impl="local", expert_model_parallel_size=2)
    parallel_state.initialize_model_parallel(**settings.parallel_state_kwargs())
    model_args = ModelArgs.from_hf_dir(hf_dir)
    original = load_file(os.path.join(hf_dir, "model.safetensors"))

    def build():
        return build_gpt_model(model_args, settings, build_transformer_config(model_args, settings, cpu=True)).eval()

    def differing(model) -> list[str]:
        """HF names whose exported tensor is missing, extra or not bit-equal to the checkpoint's."""
        exported = dict(iter_hf_weights(model, model_args))
        both = sorted(set(exported) & set(original))
        return sorted(set(exported) ^ set(original)) + [n for n in both if not torch.equal(exported[n], original[n])]

    def load_torch_dist(path: str):
        fresh = build()
        state = dist_checkpointing.load({"model": fresh.sharded_state_dict()}, path)
        fresh.load_state_dict(state["model"], strict=True)
        return fresh

    model = build()
    result["local_experts"] = [int(e) for e in model.decoder.layers[0].mlp.local_expert_indices]
    load_hf_weights(model, hf_dir, model_args, settings)
    result["export_differs"] = differing(model)
    tokens = torch.tensor([[3, 17, 250, 8, 99, 1, 42, 7]])
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), 1)[None, None]
    with torch.no_grad():
        logits = model(tokens, torch.arange(8)[None], attention_mask=mask)[..., : model_args.vocab_size]
        ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()(tokens).logits
    result["logits_max_diff"] = float((logits - ref).abs().max())

    saved = os.path.join(ckpt_dir, "ep2")
    if rank == 0:
        os.makedirs(saved)
        hf_to_mcore(hf_dir, os.path.join(ckpt_dir, "converted"), progress=False)  # no parallelism in the file
    dist.barrier()
    dist_checkpointing.save({"model": model.sharded_state_dict()}, saved)
    result["fresh_model_differs"] = bool(differing(build()))  # the round trips below are not vacuous
    result["roundtrip_differs"] = differing(load_torch_dist(saved))
    result["converted_differs"] = differing(load_torch_dist(os.path.join(ckpt_dir, "converted", "release")))
    # Router-loss metrics over DP 2 (`router_metrics`): rank r tracked layer losses [1 + r, 3 + r] (load balancing,
    # summed over the TP×CP group of one) and [10 + 2r, 20 + 2r] (z-loss, no group) in its one micro-batch.
    from megatron.core.transformer.moe import moe_utils

    from slime_train_megatron.router_metrics import reset_router_losses, router_loss_metrics

    reset_router_losses()
    tp_cp = parallel_state.get_tensor_and_context_parallel_group()
    for layer, value in ((1, 1.0), (2, 3.0)):
        moe_utils.save_to_aux_losses_tracker("load_balancing_loss", torch.tensor(value + rank), layer, 2, tp_cp)
        moe_utils.save_to_aux_losses_tracker("z_loss", torch.tensor(10.0 * layer + 2 * rank), layer, 2)
    result["router_metrics"] = router_loss_metrics(num_moe_layers=2, num_micro_batches=1)
    out = [None, None]
    dist.all_gather_object(out, result)
    if rank == 0:
        print("RESULT " + json.dumps(out))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])), nprocs=2)
