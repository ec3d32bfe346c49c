"""The one-rank scenario `single`: log-probs against plain transformers (packed, top-p replay), HF export,
weight buckets, the reference model and KL (its --ref-load, updates, save and resume), GRPO, sleep/wake-up, the
one-step old-log-prob reuse and the per-token loss reference that the 2-rank runs are compared with."""

from __future__ import annotations

import dataclasses
import pathlib

import torch
from slime_fsdp_test_compile_scenario import gathered_states
from slime_fsdp_test_worker_common import (
    TEMPERATURE,
    full_params,
    hf_reference_log_probs,
    make_args,
    make_batch,
    max_diff,
    with_top_p_sets,
)
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from slime_core.batch import RolloutBatch
from slime_core.train_step import can_reuse_old_log_probs
from slime_train_fsdp import FSDPTrainBackend
from slime_train_fsdp.hf_export import save_hf
from slime_train_fsdp.packing import pack_micro_batch, response_log_probs, split_by_lengths


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
    res["gathered"] = gathered_states(t, batch)
    return res
