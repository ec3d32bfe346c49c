"""What every FSDP backend scenario shares: the run config, the test batches and the references they are checked
against (plain transformers, fp32). `_workers.py` loads it once as module `slime_fsdp_test_worker_common`, which the
`_scenario_*.py` modules import; other worker files load it by path (`_lora_worker.py`, `_true_on_policy_worker.py`,
the compile warm-up tests)."""

from __future__ import annotations

import dataclasses

import torch
from transformers import AutoModelForCausalLM

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_train_fsdp import FSDPTrainBackend

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


def with_top_p_sets(batch: RolloutBatch, vocab: int = 64, seed: int = 0) -> RolloutBatch:
    """The batch with random top-p replay sets: per position 0-5 random ids (the target in some, not in others)."""
    g = torch.Generator().manual_seed(seed)
    ids, offsets = [], []
    for r in batch.response_lengths:
        sizes = torch.randint(0, 6, (r,), generator=g)
        ids.append(torch.cat([torch.randperm(vocab, generator=g)[: int(k)] for k in sizes] + [torch.zeros(0).long()]))
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]))
    return dataclasses.replace(batch, rollout_top_p_token_ids=ids, rollout_top_p_token_offsets=offsets)


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


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


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
