"""Rank scenario of the MoE routing replay tests (`run`), or standalone: `python _routing_workers.py SCENARIO OUT CKPT`.

One rank (gloo) trains a tiny random Qwen3-MoE. Independent references are plain transformers forwards, one
sequence at a time, with the routers observed (`hf_routes`) or forced by hand (`hf_forced_log_probs`).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import pathlib
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from slime_train_fsdp import FSDPTrainBackend

_spec = importlib.util.spec_from_file_location(
    "slime_fsdp_test_worker_common", pathlib.Path(__file__).with_name("_worker_common.py")
)
w = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(w)

NUM_EXPERTS = 8


def _hf(path: str, flip_routers: bool = False):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    if flip_routers:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.gate.weight.mul_(-1.0)
    return model


def hf_routes(path: str, tokens: list[torch.Tensor], flip_routers: bool = False) -> list[torch.Tensor]:
    """Each sequence's router top-k ids `[T_i, L, K]` int32 (one sequence per forward)."""
    model, got, out = _hf(path, flip_routers), {}, []
    for i, layer in enumerate(model.model.layers):
        layer.mlp.gate.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(i, o[2].clone()))
    with torch.no_grad():
        for tok in tokens:
            model(tok[None])
            out.append(torch.stack([got[i] for i in range(len(got))], dim=1).to(torch.int32))
    return out


def hf_forced_log_probs(path: str, batch, routes: list[torch.Tensor], flip_routers: bool = False):
    """Response log-probs with every router's experts forced to `routes[i]` `[T_i, L, K]`, combine weights by hand:
    softmax over all experts, gathered at the forced ones, renormalized (Qwen3-MoE's norm_topk_prob)."""
    model = _hf(path, flip_routers)
    forced = {}

    def forced_router(layer: int, module):
        def forward(hidden):
            logits = torch.nn.functional.linear(hidden.reshape(-1, module.hidden_dim), module.weight)
            ids = forced["routes"][:, layer, :].long()
            weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(1, ids)
            return logits, (weights / weights.sum(-1, keepdim=True)).to(logits.dtype), ids

        return forward

    for i, layer in enumerate(model.model.layers):
        layer.mlp.gate.forward = forced_router(i, layer.mlp.gate)
    out = []
    with torch.no_grad():
        for tok, r, rt in zip(batch.tokens, batch.response_lengths, routes, strict=True):
            forced["routes"] = rt
            logits = model(tok[None]).logits[0, -r - 1 : -1].float() / w.TEMPERATURE
            out.append(torch.log_softmax(logits, -1).gather(-1, tok[-r:, None])[:, 0])
    return out


def _flip_routers(backend: FSDPTrainBackend) -> None:
    with torch.no_grad():
        for router in backend.routing.routers.values():
            router.weight.to_local().mul_(-1.0)


def _training_log_probs(backend: FSDPTrainBackend, batch, step: int) -> dict[int, torch.Tensor]:
    captured: dict[int, torch.Tensor] = {}

    def loss_fn(ids, log_probs, entropy):
        for i, lp in zip(ids, log_probs, strict=True):
            captured[i] = lp.detach().clone()
        return sum(lp.sum() for lp in log_probs) * 0.0, {}

    backend.forward_backward(batch, step, loss_fn, denominator=1.0)
    return captured


def scenario_routing(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    res: dict = {}
    batch = w.make_batch(0, 1)  # 8 samples, 2 steps of 2 packed micro-batches of 2
    natural = hf_routes(ckpt, batch.tokens)
    r3 = w.make_args(ckpt, train_backend="fsdp", rollout_engine="reference", use_rollout_routing_replay=True)
    off = r3.model_copy(update={"use_rollout_routing_replay": False, "use_routing_replay": False})
    record = r3.model_copy(update={"use_rollout_routing_replay": False})
    backend = FSDPTrainBackend()
    backend.init(r3, with_ref=False)

    def plain(b):
        before, backend.cfg = backend.cfg, off
        try:
            return backend.compute_log_probs(b)
        finally:
            backend.cfg = before

    plain_lp = plain(batch)
    # (b) engine routes = the router's own (the engine ran T - 1 tokens): bitwise the plain forward.
    same = dataclasses.replace(batch, rollout_routed_experts=[n[:-1] for n in natural])
    res["natural_bitwise"] = [torch.equal(a, b) for a, b in zip(backend.compute_log_probs(same), plain_lp, strict=True)]
    # (b) other routes: the log-probs of a forward with the routers forced by hand, not the plain ones.
    shifted = [(n + 1) % NUM_EXPERTS for n in natural]
    other = dataclasses.replace(batch, rollout_routed_experts=[s[:-1] for s in shifted])
    got = backend.compute_log_probs(other)
    res["forced_diff"] = w.max_diff(got, hf_forced_log_probs(ckpt, batch, shifted))
    res["forced_vs_plain"] = w.max_diff(got, plain_lp)
    res["r3_old_pass_mismatch"] = float(backend.routing.mismatched / backend.routing.counted)
    backend.routing.reset()

    # (c) --use-routing-replay: the old-log-prob pass records, the training forward replays after the weights move.
    backend.cfg = record
    old = backend.compute_log_probs(batch)
    res["record_old_bitwise"] = all(torch.equal(a, b) for a, b in zip(old, plain_lp, strict=True))
    res["recorded_equal_hf"] = [torch.equal(backend.routing.recorded[i], natural[i]) for i in range(batch.num_samples)]
    _flip_routers(backend)  # the perturbation: every router's logits change sign, so its own choice changes
    train_lp = _training_log_probs(backend, batch, 0)
    step0 = [i for mb in batch.micro_batches[0] for i in mb]
    sub = dataclasses.replace(batch, tokens=[batch.tokens[i] for i in step0],
                              response_lengths=[batch.response_lengths[i] for i in step0])  # fmt: skip
    expected = hf_forced_log_probs(ckpt, sub, [natural[i] for i in step0], flip_routers=True)
    res["replay_diff"] = w.max_diff([train_lp[i] for i in step0], expected)
    flipped_plain = plain(batch)
    res["replay_vs_free"] = w.max_diff([train_lp[i] for i in step0], [flipped_plain[i] for i in step0])
    flipped = hf_routes(ckpt, [batch.tokens[i] for i in step0], flip_routers=True)
    differ = sum(
        int((f.sort(-1).values != natural[i].sort(-1).values).any(-1).sum())
        for f, i in zip(flipped, step0, strict=True)
    )
    rows = sum(int(natural[i].shape[0]) * natural[i].shape[1] for i in step0)
    res["mismatch"] = float(backend.routing.mismatched / backend.routing.counted)
    res["mismatch_expected"] = differ / rows
    _flip_routers(backend)  # back

    # The whole RL step with --use-routing-replay: the old pass always runs and records; one metric.
    metrics = backend.train(0, batch)
    res["train_mismatch"] = metrics["train/routing_replay_mismatch"]
    res["recorded_after_train"] = len(backend.routing.recorded)
    backend.cfg = r3
    metrics = backend.train(1, same)
    res["train_r3_mismatch"] = metrics["train/routing_replay_mismatch"]
    try:
        backend.cfg = record
        backend.routing.reset()
        _training_log_probs(backend, batch, 0)  # nothing recorded
        res["unrecorded_error"] = None
    except ValueError as e:
        res["unrecorded_error"] = str(e)
    return res


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs one scenario on this rank (process group from the environment) and saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        res = {"routing": scenario_routing}[scenario](ckpt, out, out.parent)
        torch.save(copy.deepcopy(res), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
