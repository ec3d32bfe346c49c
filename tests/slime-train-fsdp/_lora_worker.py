"""Per-rank LoRA scenario for `test_lora.py` (uses the helpers of `_workers.py`): `run(out, ckpt)`.

One process group of WORLD_SIZE ranks (gloo): a LoRA backend starts as the base model, trains two rollouts
(only the adapters move), pushes only the adapter, and exports it (PEFT dir) and the merged model.
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch
import torch.distributed as dist

_WORKERS = pathlib.Path(__file__).with_name("_workers.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_workers", _WORKERS)
W = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(W)


def _peft_log_probs(base: str, adapter: pathlib.Path, batch) -> list[torch.Tensor]:
    """The exported adapter loaded by peft itself on the base checkpoint, eager attention, fp32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(model, str(adapter)).eval()
    out = []
    with torch.no_grad():
        for tok, r in zip(batch.tokens, batch.response_lengths, strict=True):
            logits = model(input_ids=tok[None]).logits[0, -r - 1 : -1].float() / W.TEMPERATURE
            out.append(torch.log_softmax(logits, -1).gather(-1, tok[-r:, None])[:, 0])
    return out


def scenario_lora(ckpt: str, out: pathlib.Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    res: dict = {}
    b = W.FSDPTrainBackend()
    cfg = W.make_args(ckpt, lora_rank=4, lora_alpha=8.0, lr=1e-2, lora_save_merged=True, train_backend="fsdp")
    b.init(cfg, with_ref=False)
    res["trainable"] = sorted(n for n, p in b.model.named_parameters() if p.requires_grad)
    res["num_params"] = len(list(b.model.parameters()))
    res["optimizer_params"] = sum(len(g["params"]) for g in b.optimizer.param_groups)
    full = W.make_batch(0, 1)
    res["init_vs_base"] = W.max_diff(b.compute_log_probs(full), W.hf_reference_log_probs(ckpt, full))
    base_before = {n: t.clone() for n, t in _state(b).items() if ".lora_" not in n}
    for rollout_id in range(2):
        b.train(rollout_id, W.make_batch(rank, world, seed=rollout_id))
    res["steps"] = b.step_metrics
    after = _state(b)
    res["base_changed"] = [n for n, t in base_before.items() if not torch.equal(t, after[n])]
    res["lora_B_norm"] = sum(float(t.norm()) for n, t in after.items() if ".lora_B." in n)
    res["pushed"] = [(n, tuple(t.shape)) for bucket in b.named_hf_weights() for n, t in bucket]
    lps = b.compute_log_probs(full)
    res["trained_vs_base"] = W.max_diff(lps, W.hf_reference_log_probs(ckpt, full))
    export = out.parent / "lora_export"
    b.save_hf(export)
    if rank == 0:
        res["export_files"] = sorted(p.name for p in export.iterdir())
        res["peft_diff"] = W.max_diff(lps, _peft_log_probs(ckpt, export, full))
        res["merged_diff"] = W.max_diff(lps, W.hf_reference_log_probs(str(export / "merged"), full))
    return res


def _state(backend) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in backend.model.named_parameters()
    }


def run(out: pathlib.Path, ckpt: str) -> None:
    """Runs the scenario on this rank (process group from the environment) and saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        torch.save(scenario_lora(ckpt, out), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()
