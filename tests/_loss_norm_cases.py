"""Rollouts that split unevenly over data-parallel ranks, and the original's loss over each of their optimizer steps.

Shared by the FSDP and Megatron loss-normalization tests (`tests/slime-train-fsdp/test_loss_normalization.py`,
`tests/slime-train-megatron/test_loss_normalization_cpu.py`), loaded by path (tests/ is no package). A case is a
rollout of `Sample`s and the flags that schedule it (`CASES`); `build_rollout_batches` splits it over the ranks as a
run does. `reference_steps` is the independent reference: per optimizer step, the gradient of the loss the original's
`loss_function` reduces over the whole step, computed with plain transformers on one process:

* per sample (the default): `(1/B) Σ_i Σ_t ℓ_it·m_it / max(D_i, 1)`, `B` = the step's rollouts
  (`--global-batch-size`; the original's `step_global_batch_size`), `D_i` = the summed loss mask of sample i's rollout
  (`rollout_mask_sums`);
* `--calculate-per-token-loss`: `Σ_i Σ_t ℓ_it·m_it / max(Σ_i Σ_t m_it, 1)`. The original divides by
  `Σ_i max(Σ_t m_it, 1)` (`num_tokens`), counting a sample without a trainable token as one token: a deliberate
  difference (MIGRATION.md, "--calculate-per-token-loss denominator").

`ℓ_it = -A_i·ratio_it` (GRPO on-policy: ratio 1, with the gradient of log π), `A_i` the group-normalized reward. The
steps' `train/loss` (= `train/pg_loss`: no entropy or KL term) and `train/entropy_loss` are the same reductions of
`-A_i` and of the entropy; `train/global_batch_size` is `B`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from slime_core.sample import Sample, Status
from slime_core.train_data import postprocess_rewards, rollout_keys, sorted_by_index

TEMPERATURE = 0.8

#: (prompt, response) lengths of the dynamic-batching case (2 steps of 3 samples, 16-token budget): step 0 holds three
#: samples of 10-12 tokens, a micro-batch each, so at DP 2 one rank runs 2 and the other 1 and an empty slot; in step 1
#: the 4 and 5 token samples share one and the 17-token one (over the budget) is alone.
_DYNAMIC_LENGTHS = [(5, 7), (4, 6), (6, 5), (2, 2), (2, 3), (7, 10)]

#: case -> the flags of its schedule (rollout size, `--global-batch-size`, micro-batches).
CASES = {
    "even": dict(rollout_batch_size=6, global_batch_size=6, micro_batch_size=1),  # 6 per step: DP 2 and 3 divide it
    "uneven": dict(rollout_batch_size=5, global_batch_size=5, micro_batch_size=1),  # 5 per step: an empty slot
    "dynamic": dict(rollout_batch_size=3, global_batch_size=3, use_dynamic_batch_size=True, max_tokens_per_gpu=16),
    "masked": dict(rollout_batch_size=4, global_batch_size=4, micro_batch_size=2),
    "rollouts": dict(rollout_batch_size=6, global_batch_size=3, micro_batch_size=1),  # 3 rollouts = 6 samples a step
    "tiny": dict(rollout_batch_size=1, global_batch_size=2, micro_batch_size=1),  # DP 3: a rank with no sample
}


def _sample(i: int, prompt: int, response: int, g: torch.Generator, vocab: int) -> Sample:
    mask = [1] * response
    if i % 3 == 1 and response > 1:
        mask[0] = 0  # a tool-output token
    return Sample(tokens=torch.randint(0, vocab, (prompt + response,), generator=g).tolist(), response_length=response,
                  loss_mask=mask, reward=float((i * 7) % 5) / 4, status=Status.COMPLETED, group_index=i // 2,
                  index=i)  # fmt: skip


def case_samples(name: str, vocab: int = 64) -> list[Sample]:
    """The rollout of case `name` (pairs of samples share a `group_index`: GRPO groups of 2), token ids < `vocab`."""
    g = torch.Generator().manual_seed(11)
    if name == "dynamic":
        return [_sample(i, p, r, g, vocab) for i, (p, r) in enumerate(_DYNAMIC_LENGTHS)]
    count = {"even": 12, "uneven": 10, "masked": 8, "rollouts": 12, "tiny": 2}[name]
    samples = [_sample(i, 2 + i % 4, 1 + (i * 5) % 6, g, vocab) for i in range(count)]
    if name == "masked":
        # Samples 2 and 3 (step 0's second micro-batch: all of rank 1's samples at DP 2) train no token: all of 2's
        # loss mask is 0, 3 is dropped by `remove_sample` (its mask zeroed).
        samples[2].loss_mask = [0] * samples[2].response_length
        samples[3].remove_sample = True
    if name == "rollouts":
        for s in samples:  # 6 rollouts of 2 samples each (one rollout fanned out into 2 trained samples)
            s.rollout_id = s.index // 2
    return samples


def run_config(name: str, per_token: bool) -> dict:
    """The flags of case `name` as `SlimeArgs.from_dict` takes them: GRPO with group-normalized rewards."""
    return dict(advantage_estimator="grpo", rollout_temperature=TEMPERATURE, n_samples_per_prompt=2, num_rollout=1,
                reward_key=None, disable_rewards_normalization=False, calculate_per_token_loss=per_token, kl_coef=0.0,
                use_kl_loss=False, entropy_coef=0.0, **CASES[name])  # fmt: skip


def _mask(sample: Sample) -> torch.Tensor:
    mask = [1] * sample.response_length if sample.loss_mask is None else sample.loss_mask
    return torch.tensor([0] * sample.response_length if sample.remove_sample else mask, dtype=torch.float32)


def reference_steps(model: torch.nn.Module, config_of: Callable, vocab: int = 64) -> dict:
    """`(case, per_token) -> [(gradient by parameter name, the step's `train/*` loss metrics) per step]`.

    Args:
        model: an fp32 HF causal LM (eager attention), the weights the backends start from.
        config_of: `(case, per_token) -> SlimeArgs` of the run (rewards post-processing, `--global-batch-size`).
        vocab: the token ids' bound, as `case_samples` takes it.
    """
    params = dict(model.named_parameters())
    out = {}
    for name in CASES:
        samples = sorted_by_index(case_samples(name, vocab))
        logp, entropy = [], []
        for s in samples:
            tokens, r = torch.tensor(s.tokens), s.response_length
            full = torch.log_softmax(model(tokens[None]).logits[0, -r - 1 : -1] / TEMPERATURE, -1)
            logp.append(full.gather(1, tokens[-r:, None])[:, 0])
            entropy.append(-(full.exp() * full).sum(-1).detach())
        masks = [_mask(s) for s in samples]
        keys = rollout_keys(samples)
        rollout_tokens: dict = {}
        for k, m in zip(keys, masks, strict=True):
            rollout_tokens[k] = rollout_tokens.get(k, 0.0) + float(m.sum())
        order = list(dict.fromkeys(keys))  # rollouts in first-occurrence order, as the original's schedule takes them
        for per_token in (False, True):
            args = config_of(name, per_token)
            _, advantages = postprocess_rewards(args, samples)
            gbs = args.global_batch_size
            steps = []
            for step in range(len(order) // gbs):
                mine = set(order[step * gbs : (step + 1) * gbs])
                ids = [i for i, k in enumerate(keys) if k in mine]
                if per_token:
                    step_tokens = max(sum(float(masks[i].sum()) for i in ids), 1.0)
                    weight = {i: 1.0 / step_tokens for i in ids}
                else:
                    weight = {i: 1.0 / max(rollout_tokens[keys[i]], 1.0) / gbs for i in ids}
                loss = sum(-advantages[i] * (logp[i] * masks[i]).sum() * weight[i] for i in ids)
                grads = torch.autograd.grad(loss, list(params.values()), retain_graph=True, allow_unused=True)
                pg_loss = sum(-advantages[i] * float(masks[i].sum()) * weight[i] for i in ids)
                metrics = {
                    "train/loss": pg_loss,  # no entropy or KL term
                    "train/pg_loss": pg_loss,
                    "train/entropy_loss": sum(float((entropy[i] * masks[i]).sum()) * weight[i] for i in ids),
                    "train/global_batch_size": float(gbs),  # the step's rollouts, as the original logs it
                }
                steps.append(({n: g for n, g in zip(params, grads, strict=True) if g is not None}, metrics))
            out[name, per_token] = steps
    return out


def real_micro_batches(micro_batches: list[list[list[int]]], step: int) -> int:
    """How many of a rank's micro-batches in step `step` hold samples."""
    return sum(1 for mb in micro_batches[step] if mb)


def assert_matches_reference(
    reference: dict,
    results: list[dict],
    aligned: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], dict[str, torch.Tensor]],
    tol: float,
) -> None:
    """Every rank's per-step gradients and loss metrics, and its rollout means, equal `reference_steps`'.

    Args:
        reference: `{case key: [(grads by name, metrics) per optimizer step]}` from the one-process reference.
        results: per rank, `{case key: {"grads": [...], "steps": [...], "metrics": {...}}}` from the backend.
        aligned: the backend's gradients of one step, renamed or sliced to the reference's names and shapes.
        tol: gradients within `tol` of the step's largest reference entry; metrics within `tol` relative.
    """
    import pytest

    for key, want_steps in reference.items():
        for rank, result in enumerate(results):
            got = result[key]
            assert len(got["grads"]) == len(got["steps"]) == len(want_steps), key
            for step, (want, metrics) in enumerate(want_steps):
                scale = max(float(g.abs().max()) for g in want.values())
                assert scale > 1e-4, (key, step)  # not vacuous
                grads = aligned(got["grads"][step], want)
                assert grads.keys() == want.keys(), key
                worst = max(float((grads[n] - g).abs().max()) for n, g in want.items())
                assert worst <= tol * scale, (key, rank, step, worst, scale)
                for name, value in metrics.items():
                    assert got["steps"][step][name] == pytest.approx(value, rel=tol, abs=1e-7), (key, rank, step, name)
            for name in want_steps[0][1]:  # the rollout's values: the mean over its steps
                want_mean = sum(metrics[name] for _, metrics in want_steps) / len(want_steps)
                assert got["metrics"][name] == pytest.approx(want_mean, rel=tol, abs=1e-7), (key, rank, name)


def train_every_case(backend, args_of, samples_of, grads: list, rank: int, world: int) -> dict:
    """Each case, per sample and per token, trained on this rank's share by the shared train step.

    Args:
        backend: a trainer backend whose `optimizer_step` appends the step's gradients to `grads` and steps nothing.
        args_of: `(case name, per_token) -> SlimeArgs`.
        samples_of: `case name -> list[Sample]`.
        grads: the list the backend's `optimizer_step` fills (emptied per case).
        rank, world: this data-parallel rank and the DP size.

    Returns:
        `{(name, per_token): {"grads", "steps", "metrics", "micro_batches", "sample_indices"}}`.
    """
    from slime_core.train_data import build_rollout_batches
    from slime_core.train_step import train_on_rollout

    res: dict = {}
    for name in CASES:
        for per_token in (False, True):
            args = args_of(name, per_token)
            batch = build_rollout_batches(args, samples_of(name), dp_size=world)[rank]
            grads.clear()
            metrics, steps = train_on_rollout(args, backend, 0, batch)
            res[name, per_token] = {"grads": list(grads), "steps": steps, "metrics": metrics,
                                    "micro_batches": batch.micro_batches,
                                    "sample_indices": batch.sample_indices}  # fmt: skip
    return res
