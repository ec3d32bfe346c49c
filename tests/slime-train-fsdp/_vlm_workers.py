"""Per-rank scenarios of the vision-language FSDP tests (`test_vlm.py`); `run(scenario, out, ckpt)` like `_workers`.

The checkpoint is a tiny random Qwen2.5-VL or Qwen3-VL (`make_tiny_vlm`); samples are built with its processor
from solid-colour PIL images (image tokens expanded), plus text-only samples, with random response tokens.
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.sample import Sample
from slime_core.train_data import build_rollout_batches
from slime_train_fsdp import FSDPTrainBackend
from slime_train_fsdp.packing import pack_micro_batch, response_log_probs, split_by_lengths

TEMPERATURE = 0.7
PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n<|im_start|>assistant\n"
TEXT_PROMPT = "<|im_start|>user\nNo picture.<|im_end|>\n<|im_start|>assistant\n"
# (image size, colour) per sample; None: a text-only sample.
IMAGES = [((40, 30), (250, 0, 0)), ((90, 60), (0, 200, 30)), None, ((64, 64), (10, 10, 240)),
          ((50, 120), (128, 128, 0)), None, ((30, 30), (0, 90, 90)), ((70, 44), (200, 100, 50))]  # fmt: skip


def make_args(ckpt: str, **overrides) -> SlimeArgs:
    base = dict(hf_checkpoint=ckpt, train_backend="fsdp", rollout_temperature=TEMPERATURE, lr=1e-2, seed=1234,
                advantage_estimator="grpo", attn_implementation="sdpa", log_probs_chunk_size=5, num_rollout=2,
                rollout_batch_size=4, n_samples_per_prompt=2, global_batch_size=8, micro_batch_size=4,
                clip_grad=0.0)  # fmt: skip
    base.update(overrides)
    return SlimeArgs.from_dict(base)


def make_samples(ckpt: str) -> list[Sample]:
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(ckpt)
    g = torch.Generator().manual_seed(0)
    samples = []
    for i, image in enumerate(IMAGES):
        if image is None:
            ids, mm = processor.tokenizer.encode(TEXT_PROMPT, add_special_tokens=False), None
        else:
            out = processor(text=[PROMPT], images=[Image.new("RGB", *image)], return_tensors="pt")
            ids = out["input_ids"][0].tolist()
            mm = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        s = Sample(prompt=PROMPT, tokens=ids, index=i, group_index=i // 2, multimodal_train_inputs=mm)
        n = 3 + i % 3
        s.append_response_tokens(torch.randint(0, 1000, (n,), generator=g).tolist(), log_probs=[-1.0] * n)
        s.reward = float(i % 2)
        samples.append(s)
    return samples


def hf_reference_log_probs(ckpt: str, samples: list[Sample]) -> list[torch.Tensor]:
    """Plain transformers, one sequence at a time, positions from the model's own forward (fp32)."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()
    image_id, out = model.config.image_token_id, []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor(s.tokens)[None]
            mm = dict(s.multimodal_train_inputs or {})
            if mm:
                mm["mm_token_type_ids"] = (ids == image_id).long()
            logits = model(input_ids=ids, **mm).logits[0, -s.response_length - 1 : -1].float() / TEMPERATURE
            target = ids[0, -s.response_length :, None]
            out.append(torch.log_softmax(logits, -1).gather(-1, target)[:, 0])
    return out


def hf_decode_log_probs(ckpt: str, sample: Sample) -> torch.Tensor:
    """Transformers' own prefill + one-token decode steps (what an engine does): response tokens, whatever they
    are, enter as text embeddings at the positions the model's cached rope deltas give them."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompt = torch.tensor(sample.tokens[: sample.prompt_length])[None]
    mm = dict(sample.multimodal_train_inputs, mm_token_type_ids=(prompt == model.config.image_token_id).long())
    out_lp = []
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True, **mm)
        for token in sample.response_tokens:
            logits = out.logits[0, -1].float() / TEMPERATURE
            out_lp.append(torch.log_softmax(logits, -1)[token])
            out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return torch.stack(out_lp)


def max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _grads(model) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def packed_vs_single(backend: FSDPTrainBackend, batch: RolloutBatch) -> dict:
    """Log-probs and gradients of Σ w·logp: all samples in one packed row vs one sample per forward."""
    model, cpu = backend.model, torch.device("cpu")
    w = [torch.linspace(-1, 1, r) for r in batch.response_lengths]
    ids = list(range(batch.num_samples))
    kw = dict(multimodal=batch.multimodal_train_inputs, mrope=backend._mrope)
    model.zero_grad(set_to_none=True)
    mb = pack_micro_batch(batch.tokens, batch.response_lengths, ids, cpu, **kw)
    lp, _, anchor = response_log_probs(model, mb, temperature=TEMPERATURE, chunk_size=4)
    parts = split_by_lengths(lp, mb.response_lengths)
    (sum((x * wi).sum() for x, wi in zip(parts, w, strict=True)) + anchor).backward()
    packed_lp, g_packed = [x.detach() for x in parts], _grads(model)
    model.zero_grad(set_to_none=True)
    single_lp = []
    for i in ids:
        mb = pack_micro_batch(batch.tokens, batch.response_lengths, [i], cpu, **kw)
        lp, _, anchor = response_log_probs(model, mb, temperature=TEMPERATURE, chunk_size=4)
        single_lp.append(lp.detach())
        ((lp * w[i]).sum() + anchor).backward()
    g_single = _grads(model)
    model.zero_grad(set_to_none=True)
    vision = [n for n in g_packed if "visual" in n]
    return {
        "lp_diff": max_diff(packed_lp, single_lp),
        "grad_diff": max(float((g_packed[n] - g_single[n]).abs().max()) for n in g_packed),
        "grad_scale": max(float(g.abs().max()) for g in g_packed.values()),
        "vision_grad_scale": max(float(g_packed[n].abs().max()) for n in vision),
        "num_grads": (len(g_packed), len(g_single)),
        "position_rows": int(mb.position_ids.shape[0]),
    }


def fused_vs_fp32(b: FSDPTrainBackend, batch: RolloutBatch) -> dict:
    """The `fused` head (the CUDA default) against the exact `fp32` head on a packed row with images: largest
    log-prob and entropy differences, largest gradient difference and the largest gradient entry."""
    mb = b._pack(batch, [i for step in batch.micro_batches for ids in step for i in ids])
    runs = {}
    for head in ("fused", "fp32"):
        b.optimizer.zero_grad(set_to_none=True)
        logp, ent, anchor = response_log_probs(b.model, mb, temperature=1.0, chunk_size=5, with_entropy=True,
                                               head=head)  # fmt: skip
        g = torch.Generator().manual_seed(3)
        a, c = torch.randn(logp.shape, generator=g), torch.randn(logp.shape, generator=g)
        ((logp * a).sum() + (ent * c).sum() + anchor).backward()
        grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).clone()
                 for n, p in b.model.named_parameters() if p.grad is not None}  # fmt: skip
        runs[head] = (logp.detach(), ent.detach(), grads)
    b.optimizer.zero_grad(set_to_none=True)
    (lp_f, ent_f, g_f), (lp_r, ent_r, g_r) = runs["fused"], runs["fp32"]
    return {
        "lp_diff": float((lp_f - lp_r).abs().max()),
        "ent_diff": float((ent_f - ent_r).abs().max()),
        "same_grads": sorted(g_f) == sorted(g_r),
        "vision_grads": sum("visual" in n for n in g_r),
        "grad_diff": max(float((g_f[n] - g_r[n]).abs().max()) for n in g_r),
        "grad_scale": max(float(g.abs().max()) for g in g_r.values()),
    }


def scenario_single(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    samples = make_samples(ckpt)
    cfg = make_args(ckpt)
    batch = build_rollout_batches(cfg, samples, dp_size=1)[0]
    b = FSDPTrainBackend()
    b.init(cfg, with_ref=False)
    res: dict = {"hf_diff": max_diff(b.compute_log_probs(batch), hf_reference_log_probs(ckpt, samples))}
    res["packed"] = packed_vs_single(b, batch)
    res["fused"] = fused_vs_fp32(b, batch)
    # A response that samples the image placeholder token: text there, as the engine decoded it.
    odd = copy.deepcopy(samples[0])
    image_id = b.config.image_token_id
    del odd.tokens[odd.prompt_length :]
    odd.response_length, odd.loss_mask, odd.rollout_log_probs = 0, None, None
    odd.append_response_tokens([17, image_id, 23, image_id, 31], log_probs=[-1.0] * 5)
    odd_batch = build_rollout_batches(
        make_args(ckpt, global_batch_size=1, micro_batch_size=1, rollout_batch_size=1, n_samples_per_prompt=1),
        [odd],
        dp_size=1,
    )[0]
    res["response_image_token_diff"] = max_diff(b.compute_log_probs(odd_batch), [hf_decode_log_probs(ckpt, odd)])
    first = {n: t.clone() for bucket in b.named_hf_weights(1 << 30) for n, t in bucket}
    res["pushed_names"] = sorted(first)
    b.train(0, batch)
    trained = {n: t.clone() for bucket in b.named_hf_weights(1 << 30) for n, t in bucket}
    res["changed"] = sorted(n for n in first if not torch.equal(first[n], trained[n]))
    res["trained_lp"] = b.compute_log_probs(batch)
    b.save_hf(work / "hf_trained")
    res["export_diff"] = max_diff(res["trained_lp"], hf_reference_log_probs(str(work / "hf_trained"), samples))
    return res


def scenario_frozen(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    samples = make_samples(ckpt)
    cfg = make_args(ckpt, freeze_vision_tower=True)
    batch = build_rollout_batches(cfg, samples, dp_size=1)[0]
    b = FSDPTrainBackend()
    b.init(cfg, with_ref=False)
    first = {n: t.clone() for bucket in b.named_hf_weights(1 << 30) for n, t in bucket}
    b.train(0, batch)
    second = {n: t.clone() for bucket in b.named_hf_weights(1 << 30) for n, t in bucket}
    params = {n: p for n, p in b.model.named_parameters()}
    return {
        "first_names": sorted(first),
        "second_names": sorted(second),
        "changed": sorted(n for n in second if not torch.equal(first[n], second[n])),
        "vision_requires_grad": sorted({p.requires_grad for n, p in params.items() if "visual" in n}),
        "optimized": sum(len(g["params"]) for g in b.optimizer.param_groups),
        "num_params": len(params),
    }


def scenario_dp(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """2 ranks: rank 0 gets the image samples, rank 1 text-only ones and an empty micro-batch (dummy images)."""
    rank = dist.get_rank()
    samples = make_samples(ckpt)
    cfg = make_args(ckpt, global_batch_size=8)
    full = build_rollout_batches(cfg, samples, dp_size=1)[0]
    mine = [0, 1, 3, 4, 6, 7] if rank == 0 else [2, 5]
    micro = [[[0, 1, 2], [3, 4, 5]]] if rank == 0 else [[[0, 1], []]]
    batch = dataclasses.replace(
        full,
        **{f: [getattr(full, f)[i] for i in mine] for f in ("tokens", "response_lengths", "loss_masks", "rewards",
                                                            "raw_rewards", "loss_denominators", "rollout_log_probs",
                                                            "truncated", "sample_indices", "metadata",
                                                            "multimodal_train_inputs")},
        micro_batches=micro,
    )  # fmt: skip
    b = FSDPTrainBackend()
    b.init(cfg, with_ref=False)
    before = {n: t.clone() for bucket in b.named_hf_weights(1 << 30) for n, t in bucket}
    metrics = b.train(0, batch)
    after = {n: t.clone() for bucket in b.named_hf_weights(1 << 30) for n, t in bucket}
    return {
        "metrics": metrics,
        "after": after,
        "changed": sorted(n for n in before if not torch.equal(before[n], after[n])),
    }


def scenario_dp_reference(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """The same global batch on one rank (what the 2-rank update must equal)."""
    samples = make_samples(ckpt)
    cfg = make_args(ckpt, global_batch_size=8)
    batch = build_rollout_batches(cfg, samples, dp_size=1)[0]
    b = FSDPTrainBackend()
    b.init(cfg, with_ref=False)
    metrics = b.train(0, batch)
    return {"metrics": metrics, "after": {n: t.clone() for bucket in b.named_hf_weights(1 << 30) for n, t in bucket}}


SCENARIOS = {"single": scenario_single, "frozen": scenario_frozen, "dp": scenario_dp, "dp_ref": scenario_dp_reference}


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Runs one scenario on this rank (process group from the environment) and saves its results."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        res = SCENARIOS[scenario](ckpt, out, out.parent)
        torch.save(copy.deepcopy(res), out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
