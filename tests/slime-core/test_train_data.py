import math
import random

import pytest
import torch

from slime_core.algorithms import compute_actor_loss
from slime_core.config import SlimeArgs
from slime_core.sample import Sample, Status
from slime_core.train_data import build_rollout_batches, loss_denominators, postprocess_rewards
from slime_core.train_step import step_denominator

TOL = 1e-5  # absolute tolerance on normalized rewards (the 1e-6 std epsilon shifts values by ~1e-6)


# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the functions' own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _args(**over):
    base = dict(
        n_samples_per_prompt=4,
        advantage_estimator="grpo",
        reward_key=None,
        disable_rewards_normalization=False,
        disable_grpo_std_normalization=False,
        custom_reward_post_process_path=None,
        global_batch_size=4,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        micro_batch_size=1,
        balance_data=False,
    )
    base.update(over)
    return _CONFIG.model_copy(update=base)


def _samples(rewards, **kw):
    return [Sample(tokens=[1, 2, 3], response_length=1, reward=r, index=i, **kw) for i, r in enumerate(rewards)]


# ---- rewards handed over by the rollout manager ---------------------------------------------------


def test_precomputed_rewards_are_trained_on_in_index_order_and_their_length_is_checked():
    # The rollout manager calls the post-process plugin once and hands its output to build_rollout_batches.
    samples = _samples([1.0, 0.0])[::-1]  # indices 1, 0: the rewards follow sorted_by_index(samples)
    (b,) = build_rollout_batches(_args(global_batch_size=2), samples, dp_size=1, rewards=([5.0, 6.0], [7.0, 8.0]))
    assert (b.sample_indices, b.raw_rewards, b.rewards) == ([0, 1], [5.0, 6.0], [7.0, 8.0])
    with pytest.raises(ValueError, match="1 raw rewards and 2 rewards for 2 samples"):
        build_rollout_batches(_args(global_batch_size=2), samples, dp_size=1, rewards=([5.0], [7.0, 8.0]))


# ---- loss denominators -----------------------------------------------------------------------------


def _resp(mask, **kw):
    return Sample(tokens=[9] * (2 + len(mask)), response_length=len(mask), loss_mask=list(mask), **kw)


def test_denominators_are_shared_by_rollout_siblings():
    samples = [
        _resp([1, 1, 0], rollout_id=7),
        _resp([1, 1, 1], rollout_id=7),
        _resp([1, 1], rollout_id=None),
        _resp([0, 0], rollout_id=None),  # alone and fully masked -> clamped to 1
        _resp([1, 1, 1, 1], rollout_id=7, remove_sample=True),  # removed: contributes 0 tokens
        _resp([1], rollout_id=3),
    ]
    assert loss_denominators(samples) == [5.0, 5.0, 2.0, 1.0, 5.0, 1.0]


def test_denominator_without_mask_counts_all_response_tokens():
    assert loss_denominators([Sample(tokens=[1, 2, 3, 4], response_length=3)]) == [3.0]


# ---- build_rollout_batches -------------------------------------------------------------------------


def _rollout(num_prompts=2, n=4, seed=0):
    rng = random.Random(seed)
    samples = []
    for g in range(num_prompts):
        for k in range(n):
            i = g * n + k
            resp = rng.randint(1, 6)
            s = Sample(tokens=[100 + i] * 3, index=i, group_index=g, label="x")
            s.append_response_tokens([i] * resp, log_probs=[-0.5] * resp)
            s.reward = float(k == 0)
            if i == 5:
                s.status = Status.TRUNCATED
            samples.append(s)
    rng.shuffle(samples)
    return samples


@pytest.mark.parametrize("dynamic", [True, False])
def test_build_rollout_batches_end_to_end(dynamic):
    samples = _rollout()
    args = _args(global_batch_size=4, use_dynamic_batch_size=dynamic, max_tokens_per_gpu=12, balance_data=True)
    batches = build_rollout_batches(args, samples, dp_size=2)
    assert len(batches) == 2
    by_index = {s.index: s for s in samples}
    ordered = [by_index[i] for i in range(8)]
    _, want_rewards = postprocess_rewards(args, ordered)
    seen = []
    for b in batches:
        assert b.sample_indices == sorted(b.sample_indices)
        assert b.num_steps == 2  # 8 rollouts / gbs 4
        assert b.step_sample_counts == [4, 4]
        for t, lm, lp, i in zip(b.tokens, b.loss_masks, b.rollout_log_probs, b.sample_indices, strict=True):
            s = by_index[i]
            assert t.dtype == torch.int64 and t.tolist() == s.tokens
            assert lm.dtype == torch.float32 and lm.tolist() == [1.0] * s.response_length
            assert lp.dtype == torch.float32 and lp.tolist() == [-0.5] * s.response_length
        assert b.rewards == pytest.approx([want_rewards[i] for i in b.sample_indices], abs=1e-12)
        assert b.raw_rewards == [float(i % 4 == 0) for i in b.sample_indices]
        assert b.truncated == [int(i == 5) for i in b.sample_indices]
        assert b.loss_denominators == [float(by_index[i].response_length) for i in b.sample_indices]
        flat = sorted(p for step in b.micro_batches for mb in step for p in mb)
        assert flat == list(range(b.num_samples))  # local positions, each once
        seen += b.sample_indices
    assert sorted(seen) == list(range(8))
    # Same micro-batch count per step on both ranks.
    assert [len(s) for s in batches[0].micro_batches] == [len(s) for s in batches[1].micro_batches]
    # Global step token counts: steps take rollouts (= samples here) in index order, 4 per step.
    lens = [by_index[i].response_length for i in range(8)]
    assert batches[0].step_token_counts == [float(sum(lens[:4])), float(sum(lens[4:]))]
    if dynamic:
        for b in batches:
            for step in b.micro_batches:
                for mb in step:
                    assert sum(b.total_lengths[p] for p in mb) <= 12 or len(mb) == 1


def test_build_is_deterministic_and_independent_of_arrival_order():
    args = _args(global_batch_size=8, use_dynamic_batch_size=True, max_tokens_per_gpu=10, balance_data=True)
    a = build_rollout_batches(args, _rollout(seed=1), dp_size=2)
    samples = _rollout(seed=1)
    random.Random(99).shuffle(samples)
    b = build_rollout_batches(args, samples, dp_size=2)
    for x, y in zip(a, b, strict=True):
        assert x.sample_indices == y.sample_indices
        assert x.micro_batches == y.micro_batches
        assert x.rewards == y.rewards


def test_balance_by_flops_packs_micro_batches_by_estimated_cost():
    # Budget 16000 tokens. Token-balanced bins: [12000, 2000], [8000, 4000], [12000]; the costliest
    # (s + s^2/24576 summed) is 14000 + (12000^2 + 2000^2)/24576 = 20022.1. By cost: [12000], [12000],
    # [8000, 4000, 2000] (17418.0, 14000 tokens), the costliest a lone 12000: 12000 + 12000^2/24576 = 17859.4.
    lengths = [8000, 4000, 12000, 2000, 12000]
    samples = [Sample(tokens=[1] * n, response_length=1, reward=float(i % 2), index=i) for i, n in enumerate(lengths)]

    def costliest(**flags):
        args = _args(n_samples_per_prompt=5, global_batch_size=5, use_dynamic_batch_size=True,
                     max_tokens_per_gpu=16000, **flags)  # fmt: skip
        (b,) = build_rollout_batches(args, samples, dp_size=1)
        (step,) = b.micro_batches
        assert all(sum(b.total_lengths[p] for p in mb) <= 16000 for mb in step)
        return max(sum(n + n * n / 24576 for n in (b.total_lengths[p] for p in mb)) for mb in step)

    assert costliest() == pytest.approx(14000 + (12000**2 + 2000**2) / 24576, rel=1e-12)
    assert costliest(balance_by_flops=True) == pytest.approx(12000 + 12000**2 / 24576, rel=1e-12)


def test_remove_sample_raw_reward_override_and_metadata():
    samples = _rollout(num_prompts=1, n=4)
    by_index = {s.index: s for s in samples}
    by_index[2].remove_sample = True
    by_index[3].metadata["raw_reward"] = 0.75
    by_index[1].train_metadata = {"source": "gsm8k"}
    (b,) = build_rollout_batches(_args(global_batch_size=4), samples, dp_size=1)
    assert b.loss_masks[2].tolist() == [0.0] * by_index[2].response_length
    assert b.loss_denominators[2] == 1.0
    assert b.raw_rewards == [1.0, 0.0, 0.0, 0.75]
    assert b.metadata == [{}, {"source": "gsm8k"}, {}, {}]
    # Static micro_batch_size=1 on one rank: 4 micro-batches in one step, in position order.
    assert b.micro_batches == [[[0], [1], [2], [3]]]
    assert b.step_token_counts == [float(sum(by_index[i].response_length for i in (0, 1, 3)))]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_rollout_log_prob_that_is_not_finite_is_one_error_naming_the_sample(bad):
    # A custom --rollout-function-path or a replayed dump (--load-debug-rollout-data) builds samples past the generate
    # functions' checks: a NaN (even on a masked token: 0 * nan is nan) reached the TIS weights and
    # train/train_rollout_logprob_abs_diff of the whole step with no word.
    samples = _rollout(num_prompts=1, n=4)
    (sample,) = [s for s in samples if s.index == 2]
    sample.tokens, sample.response_length = [102] * 3 + [7, 8, 9], 3
    sample.loss_mask, sample.rollout_log_probs = [1, 0, 1], [-0.5, bad, -0.5]
    want = rf"^sample 2: rollout_log_probs\[1\] is {bad}, not a finite log-prob \(1 of 3"
    with pytest.raises(ValueError, match=want):
        build_rollout_batches(_args(global_batch_size=4), samples, dp_size=1)


def test_rollout_siblings_share_denominator_and_step():
    # Two rollouts that each fanned out into two samples; gbs counts rollouts.
    samples = []
    for i, (rid, resp) in enumerate([(0, 2), (0, 3), (1, 1), (1, 4)]):
        # No rollout log-probs: the response is set directly (append_response_tokens requires log-probs).
        s = Sample(tokens=[1, 1] + [5] * resp, response_length=resp, index=i, rollout_id=rid, reward=float(i))
        samples.append(s)
    args = _args(n_samples_per_prompt=2, global_batch_size=1)
    (b,) = build_rollout_batches(args, samples, dp_size=1)
    assert b.loss_denominators == [5.0, 5.0, 5.0, 5.0]
    assert b.rollout_log_probs is None
    assert b.step_sample_counts == [2, 2]
    assert b.micro_batches == [[[0], [1]], [[2], [3]]]


def test_fanned_out_rollout_counts_once_in_the_step_loss_as_the_originals_global_batch_size():
    # The original divides a step's per-rollout-mean loss by `step_global_batch_size`, the step's ROLLOUT count
    # (slime/utils/dp_schedule.py: build_dp_schedule appends `global_batch_size`, which counts rollouts;
    # megatron_utils/loss.py: loss_function, `loss * num_microbatches / step_global_batch_size * dp`), with every
    # sibling's tokens divided by its rollout's summed mask (`rollout_mask_sums`). Rollout 0 fanned out into two
    # samples of 2 and 3 trainable tokens; with ratio 1 and A = 1 each token's PPO loss is -1, so
    # by hand: (-1·2 - 1·3) / (2 + 3) = -1.0 for the rollout, divided by 1 rollout = -1.0.
    # Before the fix the step was divided by its 2 samples: -0.5 (half the original's gradient).
    samples = [
        Sample(tokens=[1, 1] + [5] * resp, response_length=resp, index=i, rollout_id=rid, reward=1.0)
        for i, (rid, resp) in enumerate([(0, 2), (0, 3), (1, 1), (1, 4)])
    ]
    args = _args(n_samples_per_prompt=2, global_batch_size=1)
    (b,) = build_rollout_batches(args, samples, dp_size=1)
    assert b.step_sample_counts == [2, 2]
    assert b.step_rollout_counts == [1, 1]
    cfg = _real_cfg(global_batch_size=1)
    assert step_denominator(cfg, b, 0) == 1.0
    ids = b.micro_batches[0][0] + b.micro_batches[0][1]
    lp = [torch.full((b.response_lengths[i],), -0.5, requires_grad=True) for i in ids]
    loss, _ = compute_actor_loss(
        cfg,
        log_probs=lp,
        old_log_probs=[t.detach() for t in lp],
        advantages=[torch.ones(b.response_lengths[i]) for i in ids],
        loss_masks=[b.loss_masks[i] for i in ids],
        loss_denominators=[b.loss_denominators[i] for i in ids],
    )
    assert (loss / step_denominator(cfg, b, 0)).item() == pytest.approx(-1.0, abs=1e-6)
    # One sample per rollout (no rollout_id): rollouts and samples agree, as before.
    for s in samples:
        s.rollout_id = None
    (b,) = build_rollout_batches(_args(n_samples_per_prompt=2, global_batch_size=2), samples, dp_size=1)
    assert b.step_rollout_counts == b.step_sample_counts == [2, 2]


def _real_cfg(**over):
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}).model_copy(update=over)


def test_build_errors():
    args = _args(global_batch_size=16)
    with pytest.raises(ValueError, match="--global-batch-size is 16"):
        build_rollout_batches(args, _rollout(), dp_size=2)
    with pytest.raises(ValueError, match="no samples"):
        build_rollout_batches(args, [], dp_size=1)
    mixed = _rollout(num_prompts=1)
    mixed[0].rollout_log_probs = None
    with pytest.raises(ValueError, match="rollout_log_probs"):
        build_rollout_batches(_args(), mixed, dp_size=1)
    no_index = _rollout(num_prompts=1)
    no_index[0].index = None
    with pytest.raises(ValueError, match="index"):
        build_rollout_batches(_args(), no_index, dp_size=1)


def test_with_the_real_config():
    config = pytest.importorskip("slime_core.config.args")
    args = config.SlimeArgs.from_dict(
        {"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_rollout": 1, "global_batch_size": 4}
    )
    batches = build_rollout_batches(args, _rollout(), dp_size=2)
    assert sorted(i for b in batches for i in b.sample_indices) == list(range(8))
    assert batches[0].step_sample_counts == [4, 4]
    # grpo default: group [1, 0, 0, 0] -> [1.5, -0.5, -0.5, -0.5] (see test_grpo_group_normalization_by_hand).
    rewards = dict(zip(batches[0].sample_indices, batches[0].rewards, strict=True))
    rewards.update(zip(batches[1].sample_indices, batches[1].rewards, strict=True))
    assert [rewards[i] for i in range(4)] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=TOL)


def test_engine_routes_are_ignored_without_the_replay_flag():
    samples = _rollout()
    samples[3].rollout_routed_experts = [[[0, 1]]] * (len(samples[3].tokens) - 1)
    batches = build_rollout_batches(_args(global_batch_size=4), samples, dp_size=2)
    assert all(b.rollout_routed_experts is None for b in batches)  # one warning says so (routing replay is off)


def test_vision_tensors_follow_their_samples_to_each_rank():
    samples = _rollout()
    by_index = {s.index: s for s in samples}
    for i, s in by_index.items():
        if i % 2 == 0:  # half the samples carry images; the others are text-only
            s.multimodal_train_inputs = {
                "pixel_values": torch.full((4, 6), float(i)),
                "image_grid_thw": torch.tensor([[1, 2, 2]]),
            }
    batches = build_rollout_batches(_args(global_batch_size=4), samples, dp_size=2)
    for b in batches:
        assert len(b.multimodal_train_inputs) == b.num_samples
        for i, mm in zip(b.sample_indices, b.multimodal_train_inputs, strict=True):
            if i % 2:
                assert mm is None
            else:
                assert mm is by_index[i].multimodal_train_inputs  # the same tensors, no copy
                assert mm["pixel_values"][0, 0].item() == float(i)


def test_text_only_rollouts_carry_no_vision_field():
    batches = build_rollout_batches(_args(global_batch_size=4), _rollout(), dp_size=2)
    assert all(b.multimodal_train_inputs is None for b in batches)


def test_top_p_sets_reach_the_batch_and_build_kept_tokens():
    samples = []
    for i, resp in enumerate([2, 1, 3, 1]):
        s = Sample(tokens=[1, 1], index=i, group_index=i // 2, reward=float(i % 2))
        ids = [[5 + t, 100 + t] for t in range(resp)]  # position t kept {5 + t, 100 + t}
        offsets = [2 * t for t in range(resp + 1)]
        s.append_response_tokens([5 + t for t in range(resp)], log_probs=[-0.5] * resp, top_p=(sum(ids, []), offsets))
        samples.append(s)
    (b,) = build_rollout_batches(_args(n_samples_per_prompt=2), samples, dp_size=1)
    assert [o.tolist() for o in b.rollout_top_p_token_offsets] == [[0, 2, 4], [0, 2], [0, 2, 4, 6], [0, 2]]
    kept = b.kept_tokens([2, 1])  # sample 2's three positions, then sample 1's one
    assert kept.num_rows == 4
    assert kept.rows.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert kept.ids.tolist() == [5, 100, 6, 101, 7, 102, 5, 100]
    samples[3].rollout_top_p_token_ids = samples[3].rollout_top_p_token_offsets = None
    with pytest.raises(ValueError, match=r"samples \[3\] carry no top-p replay sets while others do"):
        build_rollout_batches(_args(n_samples_per_prompt=2), samples, dp_size=1)


def test_top_p_without_sets_warns_once(caplog):
    import slime_core.train_data as td

    td._warned_no_top_p_sets = False
    with caplog.at_level("WARNING", logger="slime_core.train_data"):
        (b,) = build_rollout_batches(_args(rollout_top_p=0.9), _samples([1, 0, 0, 1]), dp_size=1)
        build_rollout_batches(_args(rollout_top_p=0.9), _samples([1, 0, 0, 1]), dp_size=1)
    assert b.rollout_top_p_token_ids is None and b.kept_tokens([0]) is None
    assert caplog.text.count("--rollout-top-p 0.9 but the engine returned no kept token ids") == 1


def test_teacher_log_probs_follow_their_samples():
    samples = _rollout()
    for s in samples:  # a list (built-in scoring) for some, a tensor (the original's post-process) for others
        lps = [-0.1 * s.index] * s.response_length
        s.teacher_log_probs = torch.tensor(lps) if s.index % 2 else lps
    batches = build_rollout_batches(_args(global_batch_size=4), samples, dp_size=2)
    for b in batches:
        for i, t, n in zip(b.sample_indices, b.teacher_log_probs, b.response_lengths, strict=True):
            torch.testing.assert_close(t, torch.full((n,), -0.1 * i))
    assert batches[0].values is None  # the critic's values are attached by the trainer, not here
    without = build_rollout_batches(_args(global_batch_size=4), _rollout(), dp_size=1)[0]
    assert without.teacher_log_probs is None
    opd = _args(global_batch_size=4, use_opd=True, opd_type="sglang")
    with pytest.raises(ValueError, match=r"have no teacher_log_probs \(0 of 8 do\): with --use-opd --opd-type sglang"):
        build_rollout_batches(opd, _rollout(), dp_size=1)
    bad = _rollout()
    bad[0].teacher_log_probs = [0.0] * (bad[0].response_length + 1)
    for s in bad[1:]:
        s.teacher_log_probs = [0.0] * s.response_length
    with pytest.raises(ValueError, match="len\\(teacher_log_probs\\)="):
        build_rollout_batches(_args(global_batch_size=4), bad, dp_size=1)


@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_a_non_finite_teacher_log_prob_from_a_plugin_names_its_sample(bad):
    # A reward post-process (the original's own copy, reading a teacher that overflows in fp16) set NaN / -inf:
    # accepted, it made every advantage of its sample non-finite (a - 0.5 * (student - teacher)) and the loss NaN.
    samples = _rollout()
    for s in samples:
        s.teacher_log_probs = torch.full((s.response_length,), -0.5)
    third = next(s for s in samples if s.index == 3)
    last = third.response_length - 1
    third.teacher_log_probs[last] = bad
    opd = _args(global_batch_size=4, use_opd=True, opd_type="sglang")
    with pytest.raises(ValueError, match=rf"sample 3: teacher_log_probs\[{last}\] is {bad}, not a finite log-prob"):
        build_rollout_batches(opd, samples, dp_size=1)


def test_a_sample_of_only_tool_tokens_gets_zero_rollout_log_probs():
    # append_response_tokens leaves rollout_log_probs None for a response of only non-trainable (tool) tokens,
    # where the original writes zeros (slime/utils/types.py); next to samples that carry them, the batch gets
    # zeros for it instead of refusing the rollout (it trains on nothing either way).
    samples = _rollout(num_prompts=1)
    tool_only = Sample(tokens=[7, 7, 7], index=4, group_index=0, label="x", reward=0.0)
    tool_only.append_response_tokens([8, 9], trainable=False)
    assert tool_only.rollout_log_probs is None and tool_only.loss_mask == [0, 0]
    (b,) = build_rollout_batches(_args(n_samples_per_prompt=5, global_batch_size=5), [*samples, tool_only], dp_size=1)
    pos = b.sample_indices.index(4)
    assert b.rollout_log_probs[pos].tolist() == [0.0, 0.0] and b.loss_masks[pos].tolist() == [0.0, 0.0]
    first = next(x for x in samples if x.index == 0)
    assert b.rollout_log_probs[b.sample_indices.index(0)].tolist() == [-0.5] * first.response_length


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), float("inf")])
def test_a_non_finite_rollout_log_prob_is_refused_naming_the_sample_and_position(bad):
    # Issue 27 (pass 53): the engine's log-probs are checked where its reply is parsed, but a generate function that
    # sets rollout_log_probs itself was not: a NaN trained on as the TIS weight / --use-rollout-logprobs ratio / the
    # reward KL and made the whole step NaN, naming nothing (the original trains on it too).
    samples = _rollout(num_prompts=1)
    victim = next(s for s in samples if s.index == 2)
    victim.rollout_log_probs = list(victim.rollout_log_probs)
    n = victim.response_length
    victim.rollout_log_probs[n - 1] = bad  # its last response token
    want = rf"^sample 2: rollout_log_probs\[{n - 1}\] is {bad}, not a finite log-prob \(1 of {n} are not\)"
    with pytest.raises(ValueError, match=want):
        build_rollout_batches(_args(), samples, dp_size=1)


def test_a_rollout_of_another_size_than_configured_warns_once_with_its_step_count(caplog):
    # 4 x 2 samples configured (--global-batch-size 4: 2 steps); a rollout function returned 12: 3 steps.
    import slime_core.train_data as td

    td._warned_step_count = False
    args = SlimeArgs.from_dict({"rollout_batch_size": 4, "n_samples_per_prompt": 2, "global_batch_size": 4,
                                "num_rollout": 1})  # fmt: skip
    assert args.num_steps_per_rollout == 2
    samples = _samples([1, 0] * 6)
    for s in samples:
        s.group_index = s.index // 2
    with caplog.at_level("WARNING", logger="slime_core.train_data"):
        (b,) = build_rollout_batches(args, samples, dp_size=1)
        build_rollout_batches(args, samples, dp_size=1)
        build_rollout_batches(args, samples[:8], dp_size=1)  # the configured size: nothing to say
    assert b.num_steps == 3
    assert caplog.text.count("this rollout has 12 rollouts (--global-batch-size 4 each step): 3 optimizer steps, not "
                             "--num-steps-per-rollout 2") == 1  # fmt: skip


@pytest.mark.parametrize(
    ("loss_type", "hint"),
    [("policy_loss", "lower --rollout-max-response-len"),
     ("sft_loss", "drop the longer conversations with --rollout-max-prompt-len")],
)  # fmt: skip
def test_the_over_budget_warning_names_the_flag_that_bounds_the_samples(caplog, loss_type, hint):
    # Reproducer: an SFT run (no generation) was told to "lower --rollout-max-response-len", a flag it does not use.
    import slime_core.scheduling as scheduling

    scheduling._warned_over_budget = False
    samples = [Sample(tokens=list(range(1, n + 1)), response_length=2, reward=0.0, index=i)
               for i, n in enumerate([3, 12, 4, 5])]  # fmt: skip
    args = _args(loss_type=loss_type, use_dynamic_batch_size=True, max_tokens_per_gpu=8, n_samples_per_prompt=1)
    with caplog.at_level("WARNING", logger="slime_core.scheduling"):
        build_rollout_batches(args, samples, dp_size=1)
    (said,) = [r.getMessage() for r in caplog.records if "--max-tokens-per-gpu" in r.getMessage()]
    assert "1 samples are longer than --max-tokens-per-gpu x context-parallel size = 8 tokens (the longest has 12)" in (
        said
    )
    assert said.endswith(f"(raise --max-tokens-per-gpu or {hint} to stay within it)")
