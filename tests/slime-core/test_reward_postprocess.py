"""`slime_core.train_data.postprocess_rewards`: group normalization per estimator, by hand, and the
`--custom-reward-post-process-path` plugin (errors name the flag, the plugin and the rollout)."""

import math
import sys
import textwrap

import pytest

from slime_core.config import SlimeArgs
from slime_core.sample import Sample
from slime_core.train_data import postprocess_rewards

TOL = 1e-5  # absolute tolerance on normalized rewards (the 1e-6 std epsilon shifts values by ~1e-6)

# A real, validated run config; the reward fields are set with model_copy (no re-validation).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _args(**over):
    """The reward fields `postprocess_rewards` reads: GRPO over groups of 4, normalized, no plugin."""
    base = dict(
        n_samples_per_prompt=4,
        advantage_estimator="grpo",
        reward_key=None,
        disable_rewards_normalization=False,
        disable_grpo_std_normalization=False,
        custom_reward_post_process_path=None,
    )
    base.update(over)
    return _CONFIG.model_copy(update=base)


def _samples(rewards, **kw):
    return [Sample(tokens=[1, 2, 3], response_length=1, reward=r, index=i, **kw) for i, r in enumerate(rewards)]


def test_grpo_group_normalization_by_hand():
    # Group 1: mean .25, centred [.75,-.25,-.25,-.25], unbiased std sqrt(.75/3) = .5 -> [1.5,-.5,-.5,-.5].
    # Group 2: equal rewards -> exact zeros. Group 3: [0,1,0,1]: mean .5, std sqrt(1/3) -> +-0.5*sqrt(3).
    raw = [1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1]
    got_raw, got = postprocess_rewards(_args(), _samples(raw))
    assert got_raw == [float(r) for r in raw]
    h = 0.5 * math.sqrt(3)
    want = [1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0, -h, h, -h, h]
    assert got == pytest.approx(want, abs=TOL)
    assert got[4:8] == [0.0] * 4


@pytest.mark.parametrize("estimator", ["gspo", "cispo"])
def test_gspo_and_cispo_normalize_like_grpo(estimator):
    _, got = postprocess_rewards(_args(advantage_estimator=estimator, n_samples_per_prompt=2), _samples([0, 1]))
    assert got == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], abs=TOL)


def test_equal_non_representable_rewards_give_exact_zeros():
    # mean(0.1 x 3) != 0.1 in float64; without the constant-group guard the std division would give ~1e-11.
    _, got = postprocess_rewards(_args(n_samples_per_prompt=3), _samples([0.1, 0.1, 0.1]))
    assert got == [0.0, 0.0, 0.0]


def test_std_normalization_off_only_centres():
    _, got = postprocess_rewards(_args(disable_grpo_std_normalization=True), _samples([1, 0, 0, 0]))
    assert got == pytest.approx([0.75, -0.25, -0.25, -0.25], abs=1e-12)


def test_reinforce_plus_plus_baseline_centres_without_std():
    _, got = postprocess_rewards(_args(advantage_estimator="reinforce_plus_plus_baseline"), _samples([2, 0, 0, 2]))
    assert got == pytest.approx([1, -1, -1, 1], abs=1e-12)


def test_rloo_leave_one_out_by_hand():
    # group 1: [1,0,0] → 1-0=1, 0-0.5=-0.5, -0.5; group 2: [2,4,6] → 2-5=-3, 4-4=0, 6-3=3
    raw, got = postprocess_rewards(
        _args(advantage_estimator="rloo", n_samples_per_prompt=3), _samples([1, 0, 0, 2, 4, 6])
    )
    assert raw == [1, 0, 0, 2, 4, 6]
    assert got == pytest.approx([1.0, -0.5, -0.5, -3.0, 0.0, 3.0], abs=1e-12)
    with pytest.raises(ValueError, match="not a multiple"):
        postprocess_rewards(_args(advantage_estimator="rloo", n_samples_per_prompt=2), _samples([1, 0, 0]))
    with pytest.raises(ValueError, match="rloo needs"):
        postprocess_rewards(_args(advantage_estimator="rloo", n_samples_per_prompt=1), _samples([1]))


@pytest.mark.parametrize("estimator", ["ppo", "reinforce_plus_plus"])
def test_other_estimators_keep_raw_rewards(estimator):
    raw, got = postprocess_rewards(_args(advantage_estimator=estimator), _samples([1, 0, 0, 0]))
    assert raw == got == [1.0, 0.0, 0.0, 0.0]


def test_disable_rewards_normalization():
    _, got = postprocess_rewards(_args(disable_rewards_normalization=True), _samples([1, 0, 0, 0]))
    assert got == [1.0, 0.0, 0.0, 0.0]


def test_single_sample_groups_give_zeros_not_nan():
    _, got = postprocess_rewards(_args(n_samples_per_prompt=1), _samples([1.0, 0.0, 0.5]))
    assert got == [0.0, 0.0, 0.0]


def _grouped(rewards_and_groups):
    return [
        Sample(tokens=[1, 2, 3], response_length=1, reward=float(r), index=i, group_index=g)
        for i, (r, g) in enumerate(rewards_and_groups)
    ]


def test_uneven_groups_normalize_within_each_group_never_across_the_batch():
    # Issue 17: after filtering or a multi-turn fan-out the groups are uneven (here 3, 1 and 2 samples, group 7's
    # members not adjacent); the old code saw 6 samples with n=4, not a multiple, and normalized all six together.
    # Group 7: [0, 1, 2] mean 1, unbiased std 1 → [-1, 0, 1]; group 8: one sample → 0; group 9: [1, 3] mean 2,
    # std sqrt(2) → ∓1/sqrt(2).
    samples = _grouped([(0, 7), (1, 7), (1, 9), (5, 8), (2, 7), (3, 9)])
    _, got = postprocess_rewards(_args(n_samples_per_prompt=4), samples)
    r2 = 1 / math.sqrt(2)
    assert got == pytest.approx([-1, 0, -r2, 0, 1, r2], abs=TOL)
    # REINFORCE++-baseline centres per group; RLOO uses each group's own size (7: 3/2·(r - 1); 9: 2·(r - 2)).
    _, centred = postprocess_rewards(_args(advantage_estimator="reinforce_plus_plus_baseline"), samples)
    assert centred == pytest.approx([-1, 0, -1, 0, 1, 1], abs=1e-12)
    rloo_samples = [s for s in samples if s.group_index != 8]
    _, loo = postprocess_rewards(_args(advantage_estimator="rloo", n_samples_per_prompt=4), rloo_samples)
    assert loo == pytest.approx([-1.5, 0.0, -2.0, 1.5, 2.0], abs=1e-12)
    with pytest.raises(ValueError, match="rloo needs >= 2 samples per prompt group; group 8"):
        postprocess_rewards(_args(advantage_estimator="rloo"), samples)


def test_groups_cannot_be_guessed_without_group_index():
    # 3 samples with n=2 and no group_index: which prompt each belongs to is unknown → error, not one big group.
    with pytest.raises(ValueError, match="not a multiple of --n-samples-per-prompt=2"):
        postprocess_rewards(_args(n_samples_per_prompt=2), _samples([0, 1, 2]))
    mixed = _samples([0, 1]) + _grouped([(1, 3)])
    with pytest.raises(ValueError, match="no group_index while others have one"):
        postprocess_rewards(_args(n_samples_per_prompt=1), mixed)


def test_dict_rewards_use_reward_key():
    samples = _samples([{"acc": 1.0, "fmt": 0.0}, {"acc": 0.0, "fmt": 1.0}])
    raw, got = postprocess_rewards(_args(n_samples_per_prompt=2, reward_key="acc"), samples)
    assert raw == [1.0, 0.0]
    assert got == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], abs=TOL)
    with pytest.raises(ValueError, match="--reward-key"):
        postprocess_rewards(_args(n_samples_per_prompt=2, reward_key="nope"), samples)


def test_missing_and_non_finite_rewards_raise():
    with pytest.raises(ValueError, match="no reward"):
        postprocess_rewards(_args(n_samples_per_prompt=1), _samples([None]))
    with pytest.raises(ValueError, match="not finite"):
        postprocess_rewards(_args(n_samples_per_prompt=1), _samples([float("nan")]))


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_reward_pp.py").write_text(
        textwrap.dedent(
            """
            def post(args, samples):
                raw = [s.reward for s in samples]
                return raw, [10 * r for r in raw]

            def bad(args, samples):
                return [1.0]

            def nan(args, samples):
                return [1.0] * len(samples), [0.5, float("nan")]

            def text(args, samples):
                return ["1.0", "x"], [0.5, 0.5]

            def short(args, samples):
                return [1.0, 1.0], [0.5]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_reward_pp"
    sys.modules.pop("my_reward_pp", None)


def test_custom_reward_post_process_replaces_the_default(plugin_module):
    raw, got = postprocess_rewards(
        _args(custom_reward_post_process_path=f"{plugin_module}.post"), _samples([1.0, 0.0, 0.5, 0.25])
    )
    assert raw == [1.0, 0.0, 0.5, 0.25]
    assert got == [10.0, 0.0, 5.0, 2.5]


def test_custom_reward_post_process_errors_name_the_flag(plugin_module):
    with pytest.raises(ValueError, match="--custom-reward-post-process-path.*must return"):
        postprocess_rewards(_args(custom_reward_post_process_path=f"{plugin_module}.bad"), _samples([1.0]))
    with pytest.raises(ImportError, match="--custom-reward-post-process-path.*not found"):
        postprocess_rewards(_args(custom_reward_post_process_path="no_such_mod_xyz.fn"), _samples([1.0]))
    with pytest.raises(ImportError, match="--custom-reward-post-process-path.*no attribute"):
        postprocess_rewards(_args(custom_reward_post_process_path=f"{plugin_module}.missing"), _samples([1.0]))


def test_custom_reward_post_process_values_must_be_finite_numbers(plugin_module):
    # A NaN went on into the advantages and the loss (the built-in path refuses it); "x" failed in float()
    # naming neither the function nor the sample.
    samples = _samples([1.0, 0.0])
    where = f"--custom-reward-post-process-path {plugin_module}"
    with pytest.raises(ValueError, match=rf"{where}.nan: rewards of sample 1 is nan, not finite"):
        postprocess_rewards(_args(custom_reward_post_process_path=f"{plugin_module}.nan"), samples)
    with pytest.raises(ValueError, match=rf"{where}.text: raw_rewards of sample 1 is 'x', not a number"):
        postprocess_rewards(_args(custom_reward_post_process_path=f"{plugin_module}.text"), samples)
    with pytest.raises(ValueError, match=rf"{where}.short: returned 1 rewards for 2 samples"):
        postprocess_rewards(_args(custom_reward_post_process_path=f"{plugin_module}.short"), samples)
