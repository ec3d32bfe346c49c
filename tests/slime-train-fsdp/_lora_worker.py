"""Per-rank LoRA scenarios for `test_lora.py` (uses the helpers of `_worker_common.py`): `run(out, ckpt, scenario)`.

One process group of WORLD_SIZE ranks (gloo). `lora`: a LoRA backend starts as the base model, trains two rollouts
(only the adapters move), pushes only the adapter, and exports it (PEFT dir) and the merged model. `init`: on a
tied-embedding checkpoint, with every parameter and buffer poisoned with NaN between `to_empty` and the load (as
a GPU's caching allocator hands back old data where a CPU hands back zeroed pages), a LoRA backend and a full
fine-tuning backend are built with compiled layers (dynamo's `eager` backend: same guards and recompiles as
inductor, no C++ build), their log-probs compared bit for bit, their dynamo graphs counted, and each decoder
layer's `hidden_states.requires_grad` recorded in grad and no-grad forwards. `resume`: `--save` then `--load` of a
LoRA run, in the checkpoint layout of now and of before (`scenario_resume`).
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

_COMMON = pathlib.Path(__file__).with_name("_worker_common.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_workers", _COMMON)
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
    pushed = {n: t.detach().clone() for bucket in b.named_hf_weights() for n, t in bucket}
    res["pushed"] = [(n, tuple(t.shape)) for n, t in pushed.items()]
    lps = b.compute_log_probs(full)
    res["trained_vs_base"] = W.max_diff(lps, W.hf_reference_log_probs(ckpt, full))
    export = out.parent / "lora_export"
    b.save_hf(export)
    if rank == 0:
        res["export_files"] = sorted(p.name for p in export.iterdir())
        res["peft_diff"] = W.max_diff(lps, _peft_log_probs(ckpt, export, full))
        res["merged_diff"] = W.max_diff(lps, W.hf_reference_log_probs(str(export / "merged"), full))
        res["sglang_diff"] = W.max_diff(lps, _sglang_log_probs(ckpt, export, cfg, full))
        from safetensors.torch import load_file

        exported = load_file(str(export / "adapter_model.safetensors"))
        res["pushed_equals_export"] = sorted(pushed) == sorted(exported) and all(
            torch.equal(pushed[n].float(), exported[n]) for n in pushed)  # fmt: skip
    return res


def _sglang_log_probs(base: str, adapter: pathlib.Path, cfg, batch) -> list[torch.Tensor]:
    """The exported adapter read as SGLang reads it (`tests/slime-rollout/_sglang_lora_reader.py`, under the
    `--max-lora-rank` / `--lora-target-modules` our launcher passes: the run's rank and targets), merged into the
    base checkpoint; eager attention, fp32."""
    import sys

    from transformers import AutoModelForCausalLM

    path = pathlib.Path(__file__).parents[1] / "slime-rollout" / "_sglang_lora_reader.py"
    spec = importlib.util.spec_from_file_location("sglang_lora_reader", path)
    reader = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(reader)
    served = reader.read_like_sglang(adapter, max_lora_rank=cfg.lora_rank, target_modules=cfg.lora_target_modules)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager")
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    with torch.no_grad():
        for name, delta in reader.delta_weights(served, {n: m.out_features for n, m in linears.items()}).items():
            linears[name].weight += delta
    out = []
    with torch.no_grad():
        for tok, r in zip(batch.tokens, batch.response_lengths, strict=True):
            logits = model(tok[None]).logits[0, -r - 1 : -1].float() / W.TEMPERATURE
            out.append(torch.log_softmax(logits, -1).gather(-1, tok[-r:, None])[:, 0])
    return out


def _poison_before_load() -> None:
    """Fills every parameter and buffer with NaN right after `to_empty` (before the checkpoint is loaded)."""
    import slime_train_fsdp.model_loading as model_loading

    init_buffers = model_loading._init_buffers

    def poisoned(model, config, device):
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                (t.to_local() if isinstance(t, DTensor) else t).fill_(float("nan"))
        init_buffers(model, config, device)

    model_loading._init_buffers = poisoned


def _compile_with_eager_backend() -> None:
    """`nn.Module.compile` with dynamo's `eager` backend: guards and recompiles as with inductor, no codegen."""
    compile_module = torch.nn.Module.compile
    torch.nn.Module.compile = lambda self, *a, **kw: compile_module(self, *a, **{**kw, "backend": "eager"})


def _non_finite(backend) -> list[str]:
    named = [*backend.model.named_parameters(), *backend.model.named_buffers()]
    return [n for n, t in named if not torch.isfinite(t.full_tensor() if isinstance(t, DTensor) else t).all()]


def _layer_input_requires_grad(backend, batch) -> dict[bool, list[set[bool]]]:
    """`{grad enabled: [per decoder layer: the set of hidden_states.requires_grad seen at its input]}` over one
    train step (its no-grad old-log-prob forward and its grad-mode forward-backward)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    layers = [m for m in backend.model.modules() if isinstance(m, Qwen3DecoderLayer)]
    seen: dict[bool, list[set[bool]]] = {True: [set() for _ in layers], False: [set() for _ in layers]}

    def record(index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            seen[torch.is_grad_enabled()][index].add(hidden.requires_grad)

        return hook

    hooks = [m.register_forward_pre_hook(record(i), with_kwargs=True) for i, m in enumerate(layers)]
    backend.train(0, batch)
    for h in hooks:
        h.remove()
    return seen


def scenario_init(ckpt: str, out: pathlib.Path) -> dict:
    from torch._dynamo.utils import counters

    rank, world = dist.get_rank(), dist.get_world_size()
    _poison_before_load()
    _compile_with_eager_backend()
    batch = W.make_batch(rank, world)  # 2 samples per rank: one packed row per micro-batch
    res: dict = {}
    log_probs = {}
    for kind, extra in (("full", {}), ("lora", {"lora_rank": 4, "lora_alpha": 8.0})):
        torch._dynamo.reset()
        counters.clear()
        b = W.FSDPTrainBackend()
        b.init(W.make_args(ckpt, train_backend="fsdp", fsdp_compile_layers=True, **extra), with_ref=False)
        res[f"{kind}_non_finite"] = _non_finite(b)
        log_probs[kind] = b.compute_log_probs(batch)
        b.train(0, batch)
        res[f"{kind}_graphs"] = int(counters["stats"]["unique_graphs"])
        del b
    res["lora_equals_full"] = all(torch.equal(a, f) for a, f in zip(log_probs["lora"], log_probs["full"], strict=True))
    res["lora_vs_full"] = W.max_diff(log_probs["lora"], log_probs["full"])
    res["lora_vs_hf"] = W.max_diff(log_probs["lora"], W.hf_reference_log_probs(ckpt, batch))
    eager = W.FSDPTrainBackend()
    eager.init(W.make_args(ckpt, train_backend="fsdp", lora_rank=4, lora_alpha=8.0), with_ref=False)
    res["layer_input_requires_grad"] = _layer_input_requires_grad(eager, batch)
    return res


def scenario_resume(ckpt: str, out: pathlib.Path) -> dict:
    """`--save` after one rollout, then a fresh backend with `--load`: what it restores, and what the files hold.

    With `--ref-update-interval 1` the KL reference is the trained adapter and is saved with it.

    Run twice: with the checkpoint as saved now (adapters only) and as saved before (the whole model, written with
    `_persisted` bypassed), which must resume the same. Both runs then train one more rollout on the same batch.
    """
    import torch.distributed.checkpoint as dcp

    import slime_train_fsdp.checkpoint as checkpoint

    rank, world = dist.get_rank(), dist.get_world_size()
    res: dict = {}
    for layout in ("adapters", "whole"):
        save = out.parent / f"save_{layout}"
        flags = dict(lora_rank=4, lora_alpha=8.0, lr=1e-2, save=str(save), load=str(save), train_backend="fsdp",
                     use_kl_loss=True, kl_loss_coef=0.1, ref_update_interval=1)  # fmt: skip
        first = W.FSDPTrainBackend()
        first.init(W.make_args(ckpt, **flags), with_ref=True)
        probe = W.make_batch(0, 1)
        base_ref = first.compute_log_probs(probe, model="ref")
        first.train(0, W.make_batch(rank, world, seed=0))
        first.update_ref()  # --ref-update-interval 1: the reference becomes the trained adapter
        persisted = getattr(checkpoint, "_persisted", None)  # None: a version that saves the whole model anyway
        if layout == "whole" and persisted is not None:
            checkpoint._persisted = lambda sd: sd
        try:
            first.save(0)
        finally:
            if persisted is not None:
                checkpoint._persisted = persisted
        saved = dcp.FileSystemReader(str(save / "iter_0000001" / "model_and_optim")).read_metadata().state_dict_metadata
        resumed = W.FSDPTrainBackend()
        start = resumed.init(W.make_args(ckpt, **flags), with_ref=True)
        ref_first, ref_resumed = (m.compute_log_probs(probe, model="ref") for m in (first, resumed))
        a, b = _state(first), _state(resumed)
        opt_a, opt_b = W.optimizer_states(first), W.optimizer_states(resumed)
        res[layout] = {
            "saved_model_keys": sorted(k.removeprefix("model.") for k in saved if k.startswith("model.")),
            "start": start,
            "steps": (first.global_step, resumed.global_step),
            "params_equal": sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a),
            "optimizer_equal": sorted(opt_a) == sorted(opt_b) and all(torch.equal(opt_a[k], opt_b[k]) for k in opt_a),
            "num_optimizer_tensors": len(opt_a),
            "ref_equal": all(torch.equal(x, y) for x, y in zip(ref_first, ref_resumed, strict=True)),
            "ref_moved": W.max_diff(ref_first, base_ref),
            "next_loss": [m.train(1, W.make_batch(rank, world, seed=1))["train/loss"] for m in (first, resumed)],
        }
        a, b = _state(first), _state(resumed)
        res[layout]["params_equal_after_step"] = all(torch.equal(a[n], b[n]) for n in a)
    return res


def scenario_reference(ckpt: str, out: pathlib.Path) -> dict:
    """KL's reference on 2 ranks, full fine-tuning and LoRA: after init, after an actor forward, after training.

    Each rank scores its own data shard, then one shared batch, whose reference log-probs must be the base
    checkpoint's (HF forward, rank 0 compares).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    shared = W.make_batch(0, 1)
    base = W.hf_reference_log_probs(ckpt, shared)
    res: dict = {}
    for kind, extra in (("full", {}), ("lora", {"lora_rank": 4, "lora_alpha": 8.0})):
        b = W.FSDPTrainBackend()
        b.init(W.make_args(ckpt, use_kl_loss=True, kl_loss_coef=0.1, lr=1e-2, **extra), with_ref=True)
        own = W.make_batch(rank, world)
        b.compute_log_probs(own)  # an actor forward first, as the train step does
        res[f"{kind}_ref_vs_base"] = W.max_diff(b.compute_log_probs(shared, model="ref"), base)
        b.train(0, own)
        res[f"{kind}_ref_vs_base_after_step"] = W.max_diff(b.compute_log_probs(shared, model="ref"), base)
        res[f"{kind}_actor_vs_base_after_step"] = W.max_diff(b.compute_log_probs(shared), base)
        res[f"{kind}_kl_steps"] = [s.get("train/kl_loss") for s in b.step_metrics]
    return res


def _state(backend) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in backend.model.named_parameters()
    }


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs `scenario` (a `scenario_*` name) on this rank (process group from the environment); saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        fn = globals()[f"scenario_{scenario}"]
        torch.save(fn(ckpt, out), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()
