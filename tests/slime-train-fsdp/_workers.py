"""Per-rank scenarios for the FSDP backend tests (`run`), or standalone: `python _workers.py SCENARIO OUT CKPT`.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun style). Each rank writes its results to
`OUT/rank{RANK}.pt`; the pytest side asserts on them. Scenarios run several checks on one process group.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import pathlib
import sys
import types

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.train_step import can_reuse_old_log_probs
from slime_train_fsdp import FSDPTrainBackend
from slime_train_fsdp.hf_export import save_hf
from slime_train_fsdp.packing import pack_micro_batch, response_log_probs, split_by_lengths

_spec = importlib.util.spec_from_file_location(
    "slime_fsdp_test_compile_scenario", pathlib.Path(__file__).with_name("_compile_scenario.py")
)
_compile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_compile)

TEMPERATURE = 0.8
NUM_GLOBAL = 8  # samples; 2 optimizer steps of 4


def make_args(ckpt: str, **overrides) -> SlimeArgs:
    """A validated run config: the config defaults except lr, temperature, chunk size and the KL estimator."""
    base = dict(
        hf_checkpoint=ckpt,
        train_backend="fsdp",  # the FSDP trainer's config: its flags (--attn-implementation) are checked as such
        rollout_temperature=TEMPERATURE,
        lr=1e-3,
        min_lr=0.0,
        lr_warmup_iters=0,
        lr_decay_style="constant",
        lr_decay_iters=None,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_eps=1e-8,
        clip_grad=1.0,
        seed=1234,
        advantage_estimator="grpo",
        eps_clip=0.2,
        eps_clip_high=None,
        eps_clip_c=None,
        entropy_coef=0.0,
        use_kl_loss=False,
        kl_loss_coef=0.0,
        kl_loss_type="low_var_kl",
        kl_coef=0.0,
        gamma=1.0,
        lambd=1.0,
        normalize_advantages=False,
        calculate_per_token_loss=False,
        use_rollout_logprobs=False,
        use_tis=False,
        log_probs_chunk_size=3,  # small so that chunking is exercised
        attn_implementation="sdpa",
        gradient_checkpointing=False,
        fsdp_cpu_offload=False,
        update_weight_buffer_size=512 * 1024**2,
        load=None,
        save=None,
        ref_load=None,
        start_rollout_id=None,
        num_rollout=4,
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        global_batch_size=4,
    )
    base.update(overrides)
    return SlimeArgs.from_dict(base)


def global_samples(seed: int = 0) -> dict:
    """8 samples: random tokens (vocab 64), a few masked response tokens, rewards +1/-1 alternating."""
    g = torch.Generator().manual_seed(seed)
    tokens, resp, masks = [], [], []
    for i in range(NUM_GLOBAL):
        prompt, response = 3 + i % 4, 2 + (i * 3) % 5
        tokens.append(torch.randint(0, 64, (prompt + response,), generator=g))
        mask = torch.ones(response)
        if i % 3 == 0:
            mask[0] = 0.0  # e.g. a tool-output token
        resp.append(response)
        masks.append(mask)
    rewards = [1.0 if i % 2 == 0 else -1.0 for i in range(NUM_GLOBAL)]
    return {"tokens": tokens, "resp": resp, "masks": masks, "rewards": rewards}


def make_batch(dp_rank: int, dp_size: int, seed: int = 0) -> RolloutBatch:
    """Step s holds global samples [4s, 4s+4); rank r gets a contiguous 4/dp_size slice of each step."""
    data = global_samples(seed)
    per_rank = 4 // dp_size
    ids = [4 * s + per_rank * dp_rank + j for s in range(2) for j in range(per_rank)]
    micro = []
    for s in range(2):
        local = list(range(s * per_rank, (s + 1) * per_rank))
        micro.append([local[:2], local[2:]] if per_rank == 4 else [local])
    return RolloutBatch(
        tokens=[data["tokens"][i] for i in ids],
        response_lengths=[data["resp"][i] for i in ids],
        loss_masks=[data["masks"][i] for i in ids],
        rewards=[data["rewards"][i] for i in ids],
        raw_rewards=[data["rewards"][i] for i in ids],
        loss_denominators=[max(float(data["masks"][i].sum()), 1.0) for i in ids],
        micro_batches=micro,
        sample_indices=ids,
        step_sample_counts=[4, 4],
        step_token_counts=[float(sum(data["masks"][i].sum() for i in range(4 * s, 4 * s + 4))) for s in range(2)],
    )


def make_uneven_batch(dp_rank: int) -> RolloutBatch:
    """Same global batch as `make_batch`, split 3/1 over 2 ranks; rank 1 has an empty micro-batch per step."""
    full = make_batch(0, 1)
    pos = [[0, 1, 2], [3]][dp_rank]
    ids = [4 * s + p for s in range(2) for p in pos]
    n = len(pos)
    micro = [[[s * n, s * n + 1], [s * n + 2]] if n == 3 else [[s], []] for s in range(2)]
    return dataclasses.replace(
        full,
        tokens=[full.tokens[i] for i in ids],
        response_lengths=[full.response_lengths[i] for i in ids],
        loss_masks=[full.loss_masks[i] for i in ids],
        rewards=[full.rewards[i] for i in ids],
        raw_rewards=[full.raw_rewards[i] for i in ids],
        loss_denominators=[full.loss_denominators[i] for i in ids],
        sample_indices=ids,
        micro_batches=micro,
    )


def full_params(backend: FSDPTrainBackend) -> dict[str, torch.Tensor]:
    return {name: t.cpu().clone() for bucket in backend.named_hf_weights(1 << 30) for name, t in bucket}


def hf_reference_log_probs(path: str, batch: RolloutBatch) -> list[torch.Tensor]:
    """Plain transformers forward, one sequence at a time (eager attention), fp32."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    out = []
    with torch.no_grad():
        for tok, r in zip(batch.tokens, batch.response_lengths, strict=True):
            logits = model(tok[None]).logits[0, -r - 1 : -1].float() / TEMPERATURE
            out.append(torch.log_softmax(logits, -1).gather(-1, tok[-r:, None])[:, 0])
    return out


def with_top_p_sets(batch: RolloutBatch, vocab: int = 64, seed: int = 0) -> RolloutBatch:
    """The batch with random top-p replay sets: per position 0-5 random ids (the target in some, not in others)."""
    g = torch.Generator().manual_seed(seed)
    ids, offsets = [], []
    for r in batch.response_lengths:
        sizes = torch.randint(0, 6, (r,), generator=g)
        ids.append(torch.cat([torch.randperm(vocab, generator=g)[: int(k)] for k in sizes] + [torch.zeros(0).long()]))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]))
    return dataclasses.replace(batch, rollout_top_p_token_ids=ids, rollout_top_p_token_offsets=offsets)


def hf_reference_top_p_log_probs(path: str, batch: RolloutBatch) -> list[torch.Tensor]:
    """Plain transformers logits; log-softmax over each position's kept ids plus its target (fp64, dense)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    out = []
    with torch.no_grad():
        for i, (tok, r) in enumerate(zip(batch.tokens, batch.response_lengths, strict=True)):
            z = model(tok[None]).logits[0, -r - 1 : -1].double() / TEMPERATURE
            ids, offsets = batch.rollout_top_p_token_ids[i], batch.rollout_top_p_token_offsets[i]
            lps = []
            for t in range(r):
                cols = sorted(set(ids[offsets[t] : offsets[t + 1]].tolist()) | {int(tok[-r + t])})
                lps.append(z[t, tok[-r + t]] - torch.logsumexp(z[t, cols], -1))
            out.append(torch.stack(lps).float())
    return out


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def packed_vs_single(backend: FSDPTrainBackend, batch: RolloutBatch) -> dict:
    """Log-probs and gradients of Σ w·logp with one packed row vs one sequence per forward."""
    model = backend.model
    w = [torch.linspace(-1, 1, r) for r in batch.response_lengths]
    ids = list(range(batch.num_samples))

    def grads():
        return {
            n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
            for n, p in model.named_parameters()
        }

    model.zero_grad(set_to_none=True)
    mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, torch.device("cpu"))
    lp, _, anchor = response_log_probs(model, mb, temperature=TEMPERATURE, chunk_size=4)
    packed_lp = [x.detach() for x in split_by_lengths(lp, mb.response_lengths)]
    (
        sum((x * wi).sum() for x, wi in zip(split_by_lengths(lp, mb.response_lengths), w, strict=True)) + anchor
    ).backward()
    g_packed = grads()
    model.zero_grad(set_to_none=True)
    single_lp = []
    for i in ids:
        mb = pack_micro_batch(batch.tokens, batch.response_lengths, [i], torch.device("cpu"))
        lp, _, anchor = response_log_probs(model, mb, temperature=TEMPERATURE, chunk_size=4)
        single_lp.append(lp.detach())
        ((lp * w[i]).sum() + anchor).backward()
    g_single = grads()
    model.zero_grad(set_to_none=True)
    return {
        "lp_diff": max_diff(packed_lp, single_lp),
        "grad_diff": max(float((g_packed[n] - g_single[n]).abs().max()) for n in g_packed),
        "grad_scale": max(float(g.abs().max()) for g in g_packed.values()),
    }


def masked_mean_lp(lps: list[torch.Tensor], batch: RolloutBatch, sign: float) -> float:
    vals = [
        float((lp * m).sum() / m.sum())
        for lp, m, r in zip(lps, batch.loss_masks, batch.rewards, strict=True)
        if r * sign > 0
    ]
    return sum(vals) / len(vals)


def scenario_single(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    res: dict = {}
    batch = make_batch(0, 1)
    b = FSDPTrainBackend()
    assert b.init(make_args(ckpt), with_ref=False) == 0
    # 1. parity with plain transformers.
    lps = b.compute_log_probs(batch)
    res["hf_diff"] = max_diff(lps, hf_reference_log_probs(ckpt, batch))
    # 2. packed vs single forward.
    res["packed"] = packed_vs_single(b, batch)
    # 2b. top-p replay: log-probs over each position's kept ids + target, as the engine sampled them.
    topp = with_top_p_sets(batch)
    res["topp_diff"] = max_diff(b.compute_log_probs(topp), hf_reference_top_p_log_probs(ckpt, topp))
    res["topp_changes_values"] = max_diff(b.compute_log_probs(topp), lps)
    # 3. HF export (single file and sharded with index) loads back and matches.
    save_hf(b.model, work / "hf_single", source_dir=ckpt)
    save_hf(b.model, work / "hf_sharded", source_dir=ckpt, max_shard_bytes=20_000)
    res["export_diff_single"] = max_diff(lps, hf_reference_log_probs(str(work / "hf_single"), batch))
    res["export_diff_sharded"] = max_diff(lps, hf_reference_log_probs(str(work / "hf_sharded"), batch))
    res["export_files"] = sorted(p.name for p in (work / "hf_sharded").iterdir())
    # 4. buckets.
    res["buckets"] = [
        [(n, tuple(t.shape), t.numel() * t.element_size()) for n, t in bk] for bk in b.named_hf_weights(10_000)
    ]
    # 5. first step with rollout log-probs from the same weights: ratio 1 exactly.
    rb = dataclasses.replace(batch, rollout_log_probs=b.compute_log_probs(batch))
    b.cfg = b.cfg.model_copy(update={"use_rollout_logprobs": True})
    b.train(0, rb)
    res["onpolicy_steps"] = b.step_metrics
    # 6a. --ref-load pointing at other weights (the trained actor, exported).
    save_hf(b.model, work / "hf_trained", source_dir=ckpt)
    r = FSDPTrainBackend()
    r.init(make_args(ckpt, use_kl_loss=True, kl_loss_coef=0.1, ref_load=str(work / "hf_trained")), with_ref=True)
    res["ref_load_diff"] = max_diff(
        r.compute_log_probs(batch, model="ref"), hf_reference_log_probs(str(work / "hf_trained"), batch)
    )
    res["ref_load_actor_diff"] = max_diff(r.compute_log_probs(batch), lps)
    r.train(0, batch)
    res["ref_load_kl_steps"] = r.step_metrics
    del r
    # 6. reference / KL loss: ref forward equals actor at init, stays put after training.
    k = FSDPTrainBackend()
    k.init(make_args(ckpt, use_kl_loss=True, kl_loss_coef=0.1), with_ref=True)
    ref0 = k.compute_log_probs(batch, model="ref")
    res["ref_init_diff"] = max_diff(ref0, k.compute_log_probs(batch))
    k.cfg = k.cfg.model_copy(update={"ref_update_interval": 2})
    k.train(0, batch)
    res["kl_steps"] = k.step_metrics
    res["ref_after_diff"] = max_diff(ref0, k.compute_log_probs(batch, model="ref"))
    res["actor_after_diff"] = max_diff(ref0, k.compute_log_probs(batch))
    k.train(1, batch)  # (1 + 1) % 2 == 0: the reference becomes the actor
    res["ref_updated_diff"] = max_diff(k.compute_log_probs(batch, model="ref"), k.compute_log_probs(batch))
    # 6b. the reference that follows the actor is saved with it and resumed (it was rebuilt from the initial weights).
    k.cfg = k.cfg.model_copy(update={"save": str(work / "ref_ckpt")})
    k.train(2, batch)  # the actor moves on; the reference stays at rollout 1's weights
    ref_saved = k.compute_log_probs(batch, model="ref")
    k.save(2)
    res["ref_ckpt_files"] = sorted(p.name for p in (work / "ref_ckpt" / "iter_0000003").iterdir())
    resumed = FSDPTrainBackend()
    resumed_args = make_args(ckpt, use_kl_loss=True, kl_loss_coef=0.1, ref_update_interval=2, load=k.cfg.save)
    res["ref_resume_start"] = resumed.init(resumed_args, with_ref=True)
    res["ref_resumed_diff"] = max_diff(resumed.compute_log_probs(batch, model="ref"), ref_saved)
    res["ref_resumed_initial_diff"] = max_diff(resumed.compute_log_probs(batch, model="ref"), ref0)
    res["ref_resumed_actor_diff"] = max_diff(resumed.compute_log_probs(batch), k.compute_log_probs(batch))
    # --load naming the iteration folder itself: FSDP resumes only a --save root (as the original's FSDP backend), so
    # the actor starts from the HF weights, and the reference must not come from the folder either.
    folder = FSDPTrainBackend()
    folder_args = make_args(ckpt, use_kl_loss=True, kl_loss_coef=0.1, ref_update_interval=2, start_rollout_id=3,
                            load=str(work / "ref_ckpt" / "iter_0000003"))  # fmt: skip
    res["ref_folder_start"] = folder.init(folder_args, with_ref=True)
    res["ref_folder_initial_diff"] = max_diff(folder.compute_log_probs(batch, model="ref"), ref0)
    res["ref_folder_actor_diff"] = max_diff(folder.compute_log_probs(batch), ref0)
    del k, resumed, folder
    # 7. GRPO improves positive-advantage responses.
    g = FSDPTrainBackend()
    g.init(make_args(ckpt), with_ref=False)
    before = g.compute_log_probs(batch)
    for rid in range(3):
        g.train(rid, batch)
    after = g.compute_log_probs(batch)
    res["grpo"] = {
        "pos_before": masked_mean_lp(before, batch, 1.0),
        "pos_after": masked_mean_lp(after, batch, 1.0),
        "neg_before": masked_mean_lp(before, batch, -1.0),
        "neg_after": masked_mean_lp(after, batch, -1.0),
    }
    del g
    # 8. DP reference update, plus the same with sleep/wake_up around training.
    d = FSDPTrainBackend()
    d.init(make_args(ckpt, normalize_advantages=True), with_ref=False)
    res["init_params"] = full_params(d)
    res["dp_metrics"] = d.train(0, batch)
    res["dp_steps"] = d.step_metrics
    res["dp_params"] = full_params(d)
    s = FSDPTrainBackend()
    s.init(make_args(ckpt, normalize_advantages=True, gradient_checkpointing=True), with_ref=False)
    assert s.model.is_gradient_checkpointing
    s.sleep()
    try:
        s.train(0, batch)
    except RuntimeError as exc:
        res["asleep_error"] = str(exc)
    s.wake_up()
    s.train(0, batch)
    res["sleep_params"] = full_params(s)
    # 9. one-step rollout: the reused detached log-probs give the same update as a separate old forward.
    one = dataclasses.replace(
        batch,
        **{f: getattr(batch, f)[:4] for f in ("tokens", "response_lengths", "loss_masks", "rewards", "raw_rewards",
                                               "loss_denominators", "sample_indices")},
        micro_batches=batch.micro_batches[:1],
        step_sample_counts=[4],
        step_token_counts=batch.step_token_counts[:1],
    )  # fmt: skip
    reuse = FSDPTrainBackend()
    reuse.init(make_args(ckpt), with_ref=False)
    assert can_reuse_old_log_probs(reuse.cfg, one)
    reuse.train(0, one)
    recompute = FSDPTrainBackend()
    recompute.init(make_args(ckpt, use_rollout_logprobs=True), with_ref=False)
    recompute.train(0, dataclasses.replace(one, rollout_log_probs=recompute.compute_log_probs(one)))
    res["reuse_params"], res["recompute_params"] = full_params(reuse), full_params(recompute)
    # 10. per-token loss reference (compared with an uneven 3/1 split on 2 ranks).
    t = FSDPTrainBackend()
    t.init(make_args(ckpt, calculate_per_token_loss=True), with_ref=False)
    t.train(0, batch)
    res["per_token_params"] = full_params(t)
    res["per_token_steps"] = t.step_metrics
    # 11. one rank keeps a layer's gathered parameters from forward to backward, then everything is sharded again.
    res["gathered"] = _compile.gathered_states(t, batch)
    return res


def scenario_dp(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    u = FSDPTrainBackend()
    u.init(make_args(ckpt, calculate_per_token_loss=True), with_ref=False)
    u.train(0, make_uneven_batch(rank))
    res = {"uneven_params": full_params(u), "uneven_steps": u.step_metrics}
    del u
    b = FSDPTrainBackend()
    b.init(make_args(ckpt, normalize_advantages=True, save=str(work / "ckpt")), with_ref=False)
    res["dp_metrics"] = b.train(0, make_batch(rank, world))
    res["dp_steps"] = b.step_metrics
    res["dp_params"] = full_params(b)
    b.save(0)
    res["ckpt_dir"] = str(work / "ckpt")
    res["resume_metrics_expected"] = b.train(1, make_batch(rank, world, seed=1))
    res["resume_params_expected"] = full_params(b)
    return res


def scenario_resume(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    b = FSDPTrainBackend()
    args = make_args(ckpt, normalize_advantages=True, load=str(work / "ckpt"), save=str(work / "ckpt"))
    start = b.init(args, with_ref=False)
    res = {"start": start, "global_step": b.global_step, "lr_last": b.optimizer.param_groups[0]["lr"]}
    res["resume_metrics"] = b.train(start, make_batch(rank, world, seed=1))
    res["resume_params"] = full_params(b)
    return res


def optimizer_states(b, to_cpu: bool = True) -> dict[str, torch.Tensor]:
    """This rank's optimizer tensor states (local shards), keyed by parameter index and state name."""
    from torch.distributed.tensor import DTensor

    out = {}
    for i, state in enumerate(b.optimizer.state.values()):
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":
                local = v._local_tensor if isinstance(v, DTensor) else v
                out[f"{i}.{k}"] = local.detach().cpu().clone() if to_cpu else local
    return out


def scenario_gpu(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """CUDA/NCCL smoke: bf16 log-probs near fp32 HF, training, offload, buckets, save/resume."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = make_batch(rank, world)
    args = make_args(
        ckpt, save=str(work / "gpu_ckpt"), use_kl_loss=True, kl_loss_coef=0.01, offload_train_pin_memory=True
    )
    b = FSDPTrainBackend()
    b.init(args, with_ref=True)
    res = {"lp_diff": max_diff(b.compute_log_probs(batch), hf_reference_log_probs(ckpt, batch))}
    res["metrics"] = [b.train(rid, batch) for rid in range(2)]
    before = torch.cuda.memory_allocated()
    params_before, states_before = full_params(b), optimizer_states(b)
    b.sleep()
    res["mem_before_after_sleep"] = (before, torch.cuda.memory_allocated())
    host = b.residency._host._buffers
    res["pinned_buffers"] = (len(host), all(t.is_pinned() for t in host), b.residency._host.pinned_bytes)
    ptrs = [t.data_ptr() for t in host]
    b.wake_up()
    res["wake_params_equal"] = all(torch.equal(v, params_before[k]) for k, v in full_params(b).items())
    res["wake_states_equal"] = all(torch.equal(v, states_before[k]) for k, v in optimizer_states(b).items())
    res["states_device"] = sorted({t.device.type for t in optimizer_states(b, to_cpu=False).values()})
    b.sleep()  # the second sleep writes into the same pinned buffers
    res["buffers_reused"] = [t.data_ptr() for t in b.residency._host._buffers] == ptrs
    b.wake_up()
    b.train(2, batch)
    bucket = next(iter(b.named_hf_weights(1 << 20)))
    res["bucket_dtype_device"] = (str(bucket[0][1].dtype), bucket[0][1].device.type)
    b.save(2)
    expected = full_params(b)
    c = FSDPTrainBackend()
    res["start"] = c.init(make_args(ckpt, load=str(work / "gpu_ckpt")), with_ref=False)
    res["resume_max_diff"] = max(
        float((full_params(c)[k].float() - v.float()).abs().max()) for k, v in expected.items()
    )
    return res


def scenario_resume_one_rank(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """Loads the 2-rank checkpoint on 1 rank (DCP reshards) and trains the next rollout on the full batch."""
    b = FSDPTrainBackend()
    args = make_args(ckpt, normalize_advantages=True, load=str(work / "ckpt"))
    res = {"start": b.init(args, with_ref=False), "loaded_params": full_params(b)}
    b.train(res["start"], make_batch(0, 1, seed=1))
    res["resume_params"] = full_params(b)
    return res


def scenario_tied(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """Tied embeddings (as small Qwen3 checkpoints have), 2 ranks: parity, training keeps the tie, export."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = make_batch(rank, world)
    b = FSDPTrainBackend()
    b.init(make_args(ckpt), with_ref=False)
    res = {"hf_diff": max_diff(b.compute_log_probs(batch), hf_reference_log_probs(ckpt, batch))}
    b.train(0, batch)
    b.save_hf(work / "hf_tied_trained")
    res["export_diff"] = max_diff(
        b.compute_log_probs(batch), hf_reference_log_probs(str(work / "hf_tied_trained"), batch)
    )
    res["tied_after_train"] = b.model.lm_head.weight is b.model.model.embed_tokens.weight
    res["names"] = sorted(full_params(b))
    return res


def pipeline_samples() -> list:
    """4 prompts x 2 responses as `Sample`s (varied lengths, one masked token, rewards 0/1)."""
    from slime_core.sample import Sample, Status

    g = torch.Generator().manual_seed(7)
    samples = []
    for i in range(8):
        prompt, response = 3 + i % 3, 2 + (i * 5) % 4
        mask = [1] * response
        if i == 5:
            mask[0] = 0
        samples.append(
            Sample(tokens=torch.randint(0, 64, (prompt + response,), generator=g).tolist(), response_length=response,
                   loss_mask=mask, reward=float(i % 3 == 0), status=Status.COMPLETED, group_index=i // 2, index=i)
        )  # fmt: skip
    return samples


def scenario_pipeline(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """Real `build_rollout_batches` (GRPO rewards, dynamic batch size) feeding the backend, any world size."""
    from slime_core.train_data import build_rollout_batches

    rank, world = dist.get_rank(), dist.get_world_size()
    args = make_args(
        ckpt,
        reward_key=None,
        disable_rewards_normalization=False,
        disable_grpo_std_normalization=False,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=16,
        micro_batch_size=1,
        balance_data=False,
    )
    batch = build_rollout_batches(args, pipeline_samples(), dp_size=world)[rank]
    b = FSDPTrainBackend()
    b.init(args, with_ref=False)
    init = full_params(b)
    b.train(0, batch)
    return {"init": init, "params": full_params(b), "steps": b.step_metrics, "micro_batches": batch.micro_batches}


def _custom_loss(args, batch, logits, sum_of_sample_mean):
    """`--custom-loss-function-path` plugin of `scenario_loss_types`: twice the SFT loss; records its inputs."""
    _custom_loss.seen.append(
        {
            "advantages_none": batch["advantages"] is None,
            "entropy_grad": all(e.requires_grad for e in logits["entropy"]),
            "token_lengths": [int(t.numel()) for t in batch["tokens"]],
            "total_lengths": list(batch["total_lengths"]),
        }
    )
    nll = -sum_of_sample_mean(torch.cat(logits["log_probs"]))
    return 2.0 * nll, {"nll": nll}


_custom_loss.seen = []


def scenario_loss_types(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """--loss-type sft_loss / custom_loss with --disable-compute-advantages-and-returns, from the same weights."""
    plugin = types.ModuleType("slime_fsdp_test_custom_loss")
    plugin.loss = _custom_loss
    sys.modules[plugin.__name__] = plugin
    batch = make_batch(0, 1)
    res: dict = {}
    sft = FSDPTrainBackend()
    sft.init(make_args(ckpt, loss_type="sft_loss", disable_compute_advantages_and_returns=True), with_ref=False)
    res["before"] = sft.compute_log_probs(batch)
    sft.train(0, batch)
    res["sft_steps"], res["sft_after"] = sft.step_metrics, sft.compute_log_probs(batch)
    del sft
    custom = FSDPTrainBackend()
    args = make_args(
        ckpt,
        loss_type="custom_loss",
        custom_loss_function_path=f"{plugin.__name__}.loss",
        disable_compute_advantages_and_returns=True,
    )
    custom.init(args, with_ref=False)
    custom.train(0, batch)
    res["custom_steps"], res["custom_seen"] = custom.step_metrics, list(_custom_loss.seen)
    del custom
    for key, flags in (
        ("freeze", {"freeze_params_name_list": [r"\.mlp\.", "embed_tokens"]}),
        ("only_train", {"only_train_params_name_list": [r"layers\.1\.self_attn\.", "lm_head"]}),
    ):
        f = FSDPTrainBackend()
        f.init(make_args(ckpt, **flags), with_ref=False)
        before_params = full_params(f)
        f.train(0, batch)
        res[key] = {n: bool((p != before_params[n]).any()) for n, p in full_params(f).items()}
        del f
    policy = FSDPTrainBackend()
    # Validation rejects this combination; the copy skips it to reach the loss's own check.
    policy.init(make_args(ckpt).model_copy(update={"disable_compute_advantages_and_returns": True}), with_ref=False)
    try:
        policy.train(0, batch)
    except ValueError as exc:
        res["policy_error"] = str(exc)
    return res


SCENARIOS = {
    "loss_types": scenario_loss_types,
    "pipeline": scenario_pipeline,
    "tied": scenario_tied,
    "single": scenario_single,
    "dp": scenario_dp,
    "resume": scenario_resume,
    "resume1": scenario_resume_one_rank,
    "gpu": scenario_gpu,
    "compile": functools.partial(_compile.scenario_compile, make_args=make_args),
    "compile_gpu": functools.partial(_compile.scenario_compile, make_args=make_args),
}


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs one scenario on this rank (process group from the environment) and saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if scenario.endswith("gpu") else "gloo")
    try:
        res = SCENARIOS[scenario](ckpt, out, out.parent)
        torch.save(copy.deepcopy(res), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
