"""Rollout metrics: the original's per-sample statistics, and those switched on by flags (`--log-passrate`,
`--log-reward-category`)."""

import itertools
import random
import statistics
import zlib

import pytest

from slime_core.config import SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.runtime.metrics import (
    compute_rollout_metrics,
    flatten_groups,
    has_repetition,
    multi_turn_metrics,
    pass_at_k,
    response_metrics,
    rollout_log_probs_mean,
)


def _brute_pass_at_k(rewards, k):
    """Share of the k-subsets of one group that contain a reward of exactly 1 (independent reference)."""
    subsets = list(itertools.combinations(rewards, k))
    return sum(any(r == 1 for r in sub) for sub in subsets) / len(subsets)


def test_pass_at_k_by_hand_and_by_enumeration():
    groups = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.5, 0.0]]  # 0.5 is not a pass
    out = pass_at_k(groups)
    # Group 1 (n=4, c=2): 1 - C(2,k)/C(4,k) = 1/2, 5/6, 1; group 2: 0.
    assert out == pytest.approx({"pass@1": 0.25, "pass@2": 5 / 12, "pass@4": 0.5}, abs=1e-12)
    for k in (1, 2, 4):
        assert out[f"pass@{k}"] == pytest.approx(statistics.fmean(_brute_pass_at_k(g, k) for g in groups), abs=1e-12)


def test_pass_at_k_edge_cases():
    assert pass_at_k([]) == {}
    assert set(pass_at_k([[0.0] * 6])) == {"pass@1", "pass@2", "pass@4"}  # powers of 2 up to n
    with pytest.raises(ValueError, match="equal"):
        pass_at_k([[1.0, 0.0], [1.0]])


def test_groups_of_one_have_no_pass_at_k_as_in_the_original():
    # The original's compute_pass_rate returns {} for a group size of 1 (`--n-samples-per-eval-prompt 1`, the
    # default, or `--n-samples-per-prompt 1`); here `eval/<name>-pass@1` and `passrate/pass@1` were written, a curve
    # the original never draws (the share of rewards equal to 1, unlike `eval/<name>` for graded rewards).
    assert pass_at_k([[1.0], [0.5], [0.0]]) == {}
    groups = [[_sample(0, 1.0)], [_sample(1, 0.5)]]
    on = compute_rollout_metrics(_args(log_passrate=True), groups, rollout_time=1.0)
    assert on["rollout/raw_reward"] == 0.75 and not any(k.startswith("passrate/") for k in on)


def _sample(index, reward):
    s = Sample(index=index, tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], reward=reward)
    s.status = Status.COMPLETED
    return s


def _args(**kw):
    return SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "reward_key": None, "rollout_num_gpus": 1, **kw}
    )


def test_rollout_passrate_only_with_the_flag():
    groups = [[_sample(0, 1.0), _sample(1, 0.0)], [_sample(2, 0.0), _sample(3, 0.0)]]
    on = compute_rollout_metrics(_args(log_passrate=True), groups, rollout_time=1.0)
    assert on["passrate/pass@1"] == pytest.approx(0.25, abs=1e-12)
    assert on["passrate/pass@2"] == pytest.approx(0.5, abs=1e-12)
    assert not any(k.startswith("passrate/") for k in compute_rollout_metrics(_args(), groups, rollout_time=1.0))


def test_reward_category_shares():
    rewards = [{"score": 1.0, "err": "ok"}, {"score": 0.0, "err": "format"}, {"score": 0.0, "err": "format"}, 0.0]
    groups = [[_sample(i, r)] for i, r in enumerate(rewards)]
    out = compute_rollout_metrics(_args(reward_key="score", log_reward_category="err"), groups, rollout_time=1.0)
    cats = {k: v for k, v in out.items() if k.startswith("rollout/error_cat/")}
    assert cats == {"rollout/error_cat/ok": 0.25, "rollout/error_cat/format": 0.5, "rollout/error_cat/unknown": 0.25}
    assert not any("error_cat" in k for k in compute_rollout_metrics(_args(reward_key="score"), groups, rollout_time=1))


def test_flatten_groups_takes_groups_fan_out_lists_and_flat_lists_alike():
    a, b, c, d = (Sample(index=i) for i in range(4))
    assert flatten_groups([[a, [b, c]], [d]]) == [a, b, c, d]  # a fan-out generate's list inside a group
    assert flatten_groups([a, b]) == [a, b]  # a custom rollout function's flat list
    assert flatten_groups(a) == [a]
    assert flatten_groups([]) == []


def test_flatten_groups_names_the_entry_that_is_not_a_sample():
    with pytest.raises(TypeError) as e:
        flatten_groups([[Sample(), (Sample(),)]], "--rollout-function-path my.fn (rollout 3)", "samples")
    assert (
        str(e.value)
        == "--rollout-function-path my.fn (rollout 3) returned tuple at samples[0][1], not a Sample or a list of them"
    )
    with pytest.raises(TypeError, match=r"^the rollout returned NoneType at groups\[1\], not a Sample"):
        flatten_groups([[Sample()], None])


def test_has_repetition_is_the_originals_compression_test():
    loop = "The answer is 4. " * 700  # 11,900 characters that compress far beyond 10:1
    rng = random.Random(0)
    noise = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ,.") for _ in range(12_000))
    assert len(zlib.compress(loop[-10_000:].encode(), 9)) * 10 < 10_000  # the reference ratio, computed here
    assert has_repetition(loop) and not has_repetition(noise)
    assert not has_repetition(loop[:10_000])  # the original looks only past 10,000 characters


def test_response_metrics_has_the_originals_keys():
    # The original logs these for rollouts ("rollout/") and for every eval set ("eval/<name>/").
    samples = [_sample(0, 1.0), _sample(1, 0.0), _sample(2, 0.0)]
    samples[1].response_length, samples[1].loss_mask = 4, [1, 1, 0, 1]
    samples[2].status = Status.TRUNCATED
    samples[2].response = "x. " * 4000
    out = response_metrics(samples, "eval/gsm8k/")
    assert out == {
        "eval/gsm8k/response_len/mean": pytest.approx(7 / 3, abs=1e-12),  # trainable tokens 2, 3, 2
        "eval/gsm8k/response_len/median": 2.0,
        "eval/gsm8k/response_len/max": 3.0,
        "eval/gsm8k/response_len/min": 2.0,
        "eval/gsm8k/repetition_frac": pytest.approx(1 / 3, abs=1e-12),
        "eval/gsm8k/truncated_ratio": pytest.approx(1 / 3, abs=1e-12),
    }
    with pytest.raises(ValueError, match="no samples"):
        response_metrics([], "rollout/")


def test_log_multi_turn_has_the_originals_keys():
    # Two episodes: 6 response tokens of which 3 from the model (2 rounds), and 8 of which 5 (3 rounds, at the limit).
    a = Sample(index=0, tokens=list(range(9)), response_length=6, loss_mask=[1, 1, 0, 0, 1, 0], reward=1.0)
    b = Sample(index=1, tokens=list(range(11)), response_length=8, loss_mask=[1, 1, 1, 0, 0, 0, 1, 1], reward=0.0)
    a.metadata["num_turns"], b.metadata["num_turns"] = 2, 3
    for s in (a, b):
        s.status = Status.COMPLETED
    args = _args(log_multi_turn=True, rollout_max_response_len=8)
    got = {k: v for k, v in compute_rollout_metrics(args, [[a, b]], rollout_time=1.0).items() if "multi_turn" in k}
    assert got == {
        "multi_turn/raw_response_length/response_length_mean": 7.0,
        "multi_turn/raw_response_length/response_length_max": 8.0,
        "multi_turn/raw_response_length/response_length_min": 6.0,
        "multi_turn/raw_response_length/response_length_clip_ratio": 0.5,
        "multi_turn/wo_obs_response_length/response_length_mean": 4.0,
        "multi_turn/wo_obs_response_length/response_length_max": 5.0,
        "multi_turn/wo_obs_response_length/response_length_min": 3.0,
        "multi_turn/multi_turn_metric/round_number_mean": 2.5,
        "multi_turn/multi_turn_metric/round_number_max": 3.0,
        "multi_turn/multi_turn_metric/round_number_min": 2.0,
    }
    a.metadata["round_number"], b.metadata["round_number"] = 4, 4  # the original's key wins
    assert multi_turn_metrics([a, b], None)["multi_turn/multi_turn_metric/round_number_mean"] == 4.0
    assert "multi_turn/raw_response_length/response_length_clip_ratio" not in multi_turn_metrics([a, b], None)
    assert not any("multi_turn" in k for k in compute_rollout_metrics(_args(), [[a, b]], rollout_time=1.0))


def test_rollout_log_probs_is_the_originals_per_rollout_mean():
    # The original's rollout/rollout_log_probs (observability/train_metric_utils.py: log_rollout_data): each sample
    # adds Σ lp·m / (its rollout's mask total), the train mask zeroed by remove_sample (ray/rollout.py
    # _convert_samples_to_train_data), the sum divided by the rollout count. By hand:
    #   rollout 7 = samples a, b (masks [1, 1] and [1, 0, 1], total 4): (-0.2 - 0.4) + (-1.0 - 2.0) = -3.6 / 4 = -0.9
    #   c alone (mask [1, 1]): (-0.5 - 1.5) / 2 = -1.0;  d alone, remove_sample: 0 (its own total clamps to 1)
    #   (-0.9 - 1.0 + 0) / 3 rollouts = -0.6333...
    # Before: the mean of 4 per-sample means, remove_sample's counted: (-0.3 - 1.5 - 1.0 - 2.0) / 4 = -1.2.
    def sample(i, lps, mask, rollout_id=None, remove=False):
        s = Sample(tokens=[0] + [1] * len(lps), response_length=len(lps), index=i, rollout_id=rollout_id)
        s.rollout_log_probs, s.loss_mask, s.remove_sample = lps, mask, remove
        return s

    samples = [
        sample(0, [-0.2, -0.4], [1, 1], rollout_id=7),
        sample(1, [-1.0, -9.0, -2.0], [1, 0, 1], rollout_id=7),
        sample(2, [-0.5, -1.5], [1, 1]),
        sample(3, [-2.0], [1], remove=True),
    ]
    assert rollout_log_probs_mean(samples) == pytest.approx((-0.9 - 1.0 + 0.0) / 3, abs=1e-12)
    # One sample per rollout and nothing removed: the mean of the per-sample means over trainable tokens.
    alone = samples[2:3] + [sample(4, [-1.0, -3.0], [0, 1])]
    assert rollout_log_probs_mean(alone) == pytest.approx((-1.0 - 3.0) / 2, abs=1e-12)
    unscored = sample(5, [-1.0], [1])
    unscored.rollout_log_probs = None
    assert rollout_log_probs_mean([unscored]) is None  # no sample carries engine log-probs: no metric


def test_non_generation_time_has_the_originals_keys():
    # The original logs perf/non_generation_time/{mean,median,max,min} and, for the longest samples, their time
    # outside generation and their tokens per second without it; only the mean and max were logged here.
    lengths = [(6, [1, 1, 0, 0, 1, 0], 3.0), (8, [1] * 8, 1.0), (8, [1, 1, 1, 0, 0, 0, 1, 1], 2.0), (2, [1, 1], 0.0)]
    samples = []
    for i, (n, mask, seconds) in enumerate(lengths):
        s = Sample(index=i, tokens=list(range(3 + n)), response_length=n, loss_mask=mask, reward=0.0)
        s.status, s.non_generation_time = Status.COMPLETED, seconds
        samples.append(s)
    got = {k: v for k, v in compute_rollout_metrics(_args(), [samples], rollout_time=10.0).items() if "non_gen" in k}
    assert got == pytest.approx({
        "perf/non_generation_time/mean": 1.5, "perf/non_generation_time/median": 1.5,
        "perf/non_generation_time/max": 3.0, "perf/non_generation_time/min": 0.0,
        # Longest by response tokens: samples 1 and 2 (8 tokens), 1.5 s on average: 8 / (10 - 1.5).
        "perf/longest_sample_non_generation_time": 1.5,
        "perf/longest_sample_tokens_per_sec_without_non_generation": 8 / 8.5,
        # Longest by trainable tokens: sample 1 alone (8), 1 s: 8 / 9.
        "perf/longest_effective_sample_non_generation_time": 1.0,
        "perf/longest_effective_sample_tokens_per_sec_without_non_generation": 8 / 9,
    }, abs=1e-12)  # fmt: skip
    for s in samples:
        s.non_generation_time = 0.0
    assert not any("non_gen" in k for k in compute_rollout_metrics(_args(), [samples], rollout_time=10.0))


def test_top_p_kept_vocab_per_token_counts_trainable_positions():
    # The original logs rollout/top_p_kept_vocab_per_token under top-p replay; it was not logged here.
    a = Sample(index=0, tokens=[1, 2, 3, 4, 5], response_length=3, loss_mask=[1, 0, 1], reward=0.0)
    a.rollout_top_p_token_ids, a.rollout_top_p_token_offsets = [7, 8, 9, 3, 4, 5, 6], [0, 3, 3, 7]  # kept 3, 0, 4
    b = Sample(index=1, tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], reward=0.0)
    b.rollout_top_p_token_ids, b.rollout_top_p_token_offsets = [4, 5], [0, 1, 2]  # kept 1, 1
    removed = Sample(index=2, tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], reward=0.0, remove_sample=True)
    removed.rollout_top_p_token_ids, removed.rollout_top_p_token_offsets = list(range(20)), [0, 10, 20]
    for s in (a, b, removed):
        s.status = Status.COMPLETED
    got = compute_rollout_metrics(_args(), [[a, b, removed]], rollout_time=1.0)
    assert got["rollout/top_p_kept_vocab_per_token"] == pytest.approx((3 + 4 + 1 + 1) / 4, abs=1e-12)
    plain = compute_rollout_metrics(_args(), [[_sample(0, 1.0)]], rollout_time=1.0)  # no top-p replay
    assert "rollout/top_p_kept_vocab_per_token" not in plain


@pytest.mark.parametrize("value", [None, "n/a", float("nan"), {"score": 1.0}])
def test_a_bad_metadata_raw_reward_names_the_sample(value):
    # Issue 27 pass 60: a plugin's `metadata["raw_reward"]` (the original's override of the logged raw reward) went
    # through a bare float(): None and "n/a" failed as "float() argument must be ..." naming no sample, and NaN was
    # logged as rollout/raw_reward nan and trained on as the raw reward.
    s = _sample(7, 1.0)
    s.metadata["raw_reward"] = value
    with pytest.raises(ValueError, match=r"sample 7: metadata\['raw_reward'\] is .*not a finite number"):
        compute_rollout_metrics(_args(), [[s]], rollout_time=1.0)
    s.metadata["raw_reward"] = 0.25
    assert compute_rollout_metrics(_args(), [[s]], rollout_time=1.0)["rollout/raw_reward"] == 0.25


def test_zero_std_counts_are_the_originals():
    # The original's _compute_zero_std_metrics: groups whose rewards (get_reward_value) are all equal, keyed by
    # str(round(r, 1)); a group of one counts (its GRPO advantage is 0); none under --advantage-estimator ppo.
    # Here groups of one were skipped, a metadata raw_reward (what rollout/raw_reward shows) was compared instead of
    # the reward the advantages use, and PPO runs wrote the counts.
    shown = _sample(4, 0.0)
    shown.metadata["raw_reward"] = 0.25  # logged as raw reward; the advantage uses reward 0.0
    groups = [
        [_sample(0, 1.0), _sample(1, 1.0)],  # equal: count_1.0
        [_sample(2, 0.0), _sample(3, 1.0)],  # spread: not counted
        [shown, _sample(5, 0.0)],  # equal rewards: count_0.0
        [_sample(6, 0.0)],  # a group of one: count_0.0
        [_sample(7, 0.04)],  # rounded to one decimal: count_0.0
    ]
    out = compute_rollout_metrics(_args(), groups, rollout_time=1.0)
    zero_std = {k: v for k, v in out.items() if k.startswith("rollout/zero_std/")}
    assert zero_std == {"rollout/zero_std/count_1.0": 1.0, "rollout/zero_std/count_0.0": 3.0}
    ppo = compute_rollout_metrics(_args(advantage_estimator="ppo"), groups, rollout_time=1.0)
    assert not any(k.startswith("rollout/zero_std/") for k in ppo)


def test_eval_dataset_gets_the_originals_per_sample_statistics():
    # The original's log_eval_rollout_data writes compute_metrics_from_samples under eval/<name>/: besides the lengths,
    # zero_std/count_<r> over the prompt groups (group_index) and, with --log-reward-category, error_cat/<c>. Here only
    # the lengths, repetition_frac and truncated_ratio were written.
    from slime_rollout.generation.eval import dataset_metrics

    rewards = [{"score": 1.0, "err": "ok"}, {"score": 1.0, "err": "ok"}, {"score": 0.0, "err": "format"}, 0.0]
    samples = [_sample(i, r) for i, r in enumerate(rewards)]
    for s, group in zip(samples, (0, 0, 1, 1), strict=True):
        s.group_index = group
    samples[3].reward = {"score": 0.0}
    args = _args(reward_key="score", log_reward_category="err")
    result = {"rewards": [s.get_reward_value("score") for s in samples], "samples": samples}
    out = dataset_metrics(args, "toy", result, 2)
    assert out["eval/toy"] == 0.5
    assert {k: v for k, v in out.items() if "/zero_std/" in k or "/error_cat/" in k} == {
        "eval/toy/zero_std/count_1.0": 1.0,  # group 0: 1, 1
        "eval/toy/zero_std/count_0.0": 1.0,  # group 1: 0, 0
        "eval/toy/error_cat/ok": 0.5,
        "eval/toy/error_cat/format": 0.25,
        "eval/toy/error_cat/unknown": 0.25,
    }
    ppo = dataset_metrics(_args(reward_key="score", advantage_estimator="ppo"), "toy", result, 2)
    assert not any("/zero_std/" in k or "/error_cat/" in k for k in ppo)


def test_round_number_is_the_originals_trainer_side_mean():
    # The original's _convert_samples_to_train_data keeps metadata["round_number"] as a batch key and its
    # log_rollout_data writes the mean of every such key: rollout/round_number (not written here before).
    samples = [_sample(i, 1.0) for i in range(3)]
    for s, rounds in zip(samples, (1, 2, 4), strict=True):
        s.metadata["round_number"] = rounds
    out = compute_rollout_metrics(_args(), [samples], rollout_time=1.0)
    assert out["rollout/round_number"] == pytest.approx(7 / 3, abs=1e-12)
    assert "rollout/round_number" not in compute_rollout_metrics(_args(), [[_sample(0, 1.0)]], rollout_time=1.0)
    bad = _sample(5, 1.0)
    bad.metadata["round_number"] = "two"
    with pytest.raises(ValueError, match=r"^sample 5: metadata\['round_number'\] is 'two', not a number"):
        compute_rollout_metrics(_args(), [[bad]], rollout_time=1.0)
