"""The advantage-estimator registry: one spec per name, read by the config, train_data, the loss and the step.

Tolerance: normalized rewards against hand-computed values, abs 1e-6.
"""

import subprocess
import sys

import pytest
import torch

from slime_core import estimators
from slime_core.algorithms import compute_advantages_and_returns, policy_loss_name
from slime_core.algorithms.registry import get_advantage_estimator, register_advantage
from slime_core.batch import RolloutBatch
from slime_core.config import ConfigError, SlimeArgs, build_parser
from slime_core.estimators import EstimatorSpec, estimator_names, get_estimator, register_estimator
from slime_core.sample import Sample
from slime_core.train_data import postprocess_rewards
from slime_core.train_step import can_reuse_old_log_probs

BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "num_rollout": 1}
BUILTINS = ("grpo", "gspo", "cispo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo")


@pytest.fixture()
def registry(monkeypatch):
    """The global registry, restored after the test (specs registered here do not leak)."""
    monkeypatch.setattr(estimators.ESTIMATORS, "_specs", dict(estimators.ESTIMATORS._specs))
    return estimators.ESTIMATORS


def _advantages(cfg, *, rewards, loss_masks, kl, values):
    out = [torch.full(m.shape, 10.0 * r) for r, m in zip(rewards, loss_masks, strict=True)]
    return out, out


def test_builtin_specs_are_the_config_choices():
    # Built-ins first, in registration order; then estimators of installed packages.
    assert estimator_names()[: len(BUILTINS)] == BUILTINS
    action = next(a for a in build_parser()._actions if a.dest == "advantage_estimator")
    assert all(name in action.help for name in BUILTINS) and "slime.advantage_estimators" in action.help
    facts = {
        s.name: (s.rewards, s.policy_loss, s.needs_critic, s.reuses_old_log_probs)
        for s in estimators.ESTIMATORS
        if s.name in BUILTINS
    }
    assert facts == {
        "grpo": ("group_mean_std", "ppo", False, True),
        "gspo": ("group_mean_std", "gspo", False, False),
        "cispo": ("group_mean_std", "cispo", False, True),
        "rloo": ("leave_one_out", "ppo", False, False),
        "reinforce_plus_plus": ("none", "ppo", False, False),
        "reinforce_plus_plus_baseline": ("group_mean", "ppo", False, True),
        "ppo": ("none", "ppo", True, False),
    }
    assert get_advantage_estimator("ppo").__name__ == "ppo_gae_advantages"  # resolved from its import path


def test_unknown_name_is_a_one_line_error_listing_the_known_ones():
    with pytest.raises(ConfigError, match="--advantage-estimator: unknown advantage estimator 'grpo2'; known: .*'ppo'"):
        SlimeArgs.from_dict({**BASE, "advantage_estimator": "grpo2"})
    group = r'\(a package adds one under \[project.entry-points."slime.advantage_estimators"\]\)'
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'grpo2'; known: \['cispo', .*'rloo'.*\] " + group):
        get_estimator("grpo2")


def test_spec_checks_run_at_validation():
    with pytest.raises(ConfigError, match="--advantage-estimator reinforce_plus_plus requires --normalize-advantages"):
        SlimeArgs.from_dict({**BASE, "advantage_estimator": "reinforce_plus_plus"})
    cfg = SlimeArgs.from_dict(BASE)
    assert not cfg.use_critic and not cfg.with_ref
    assert SlimeArgs.from_dict({**BASE, "advantage_estimator": "ppo"}).use_critic  # from the spec


def test_a_registered_spec_drives_rewards_advantages_loss_and_reuse(registry):
    register_estimator(
        EstimatorSpec(
            name="centred_x10",
            advantages=_advantages,
            rewards="group_mean",
            policy_loss="cispo",
            needs_ref=True,
            reuses_old_log_probs=True,
        )
    )
    cfg = SlimeArgs.from_dict(BASE).model_copy(update={"advantage_estimator": "centred_x10"})
    samples = [Sample(tokens=[1, 2], response_length=1, reward=r, index=i) for i, r in enumerate([1.0, 0.0, 3.0, 3.0])]
    raw, rewards = postprocess_rewards(cfg, samples)
    assert raw == [1.0, 0.0, 3.0, 3.0]
    assert rewards == pytest.approx([0.5, -0.5, 0.0, 0.0], abs=1e-6)  # group mean only, no std division
    adv, _ = compute_advantages_and_returns(cfg, rewards=[0.5, -0.5], loss_masks=[torch.ones(2), torch.ones(1)])
    assert [a.tolist() for a in adv] == [[5.0, 5.0], [-5.0]]
    assert policy_loss_name("centred_x10") == "cispo"
    assert cfg.with_ref  # needs_ref
    one_step = RolloutBatch(
        tokens=[torch.arange(3)],
        response_lengths=[1],
        loss_masks=[torch.ones(1)],
        rewards=[0.0],
        raw_rewards=[0.0],
        loss_denominators=[1.0],
        micro_batches=[[[0]]],
    )
    assert can_reuse_old_log_probs(cfg, one_step)


def test_register_advantage_decorator_and_duplicates(registry):
    @register_advantage("plain")
    def plain(cfg, *, rewards, loss_masks, kl, values):
        return _advantages(cfg, rewards=rewards, loss_masks=loss_masks, kl=kl, values=values)

    spec = get_estimator("plain")
    assert get_advantage_estimator("plain") is plain
    assert (spec.rewards, spec.policy_loss, spec.needs_critic, spec.reuses_old_log_probs) == (
        "none",
        "ppo",
        False,
        False,
    )
    with pytest.raises(ValueError, match="'plain' is already registered"):
        register_advantage("plain")(plain)
    with pytest.raises(ValueError, match="rewards must be one of"):
        EstimatorSpec(name="bad", advantages=plain, rewards="group_median")


def test_the_config_imports_without_torch():
    """The registry is torch-free: parsing a config (e.g. for --help) does not import torch."""
    code = "import sys, slime_core.config; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.mark.parametrize(
    ("estimator", "flags", "warning"),
    [
        # The original's launch scripts pass the defaults with GRPO: silent.
        ("grpo", {"gamma": 1.0, "lambd": 1.0}, None),
        (
            "grpo",
            {"gamma": 0.9, "lambd": 0.95},
            "--gamma 0.9, --lambd 0.95: no effect with --advantage-estimator grpo, which does not read them "
            "(--gamma is read by reinforce_plus_plus, ppo; --lambd is read by ppo)",
        ),
        (
            "reinforce_plus_plus_baseline",
            {"gamma": 0.9, "normalize_advantages": True},
            "--gamma 0.9: no effect with --advantage-estimator reinforce_plus_plus_baseline, which does not read it "
            "(--gamma is read by reinforce_plus_plus, ppo)",
        ),
        (
            "reinforce_plus_plus",  # discounts with --gamma, has no GAE
            {"gamma": 0.9, "lambd": 0.5, "normalize_advantages": True},
            "--lambd 0.5: no effect with --advantage-estimator reinforce_plus_plus, which does not read it "
            "(--lambd is read by ppo)",
        ),
        ("ppo", {"gamma": 0.9, "lambd": 0.5}, None),
        # The reward-shaping KL: GRPO-family advantages broadcast the reward (the original's get_grpo_returns too),
        # so --kl-coef loaded a reference model and changed nothing, unannounced (issue 27, pass 51).
        (
            "grpo",
            {"kl_coef": 0.05, "hf_checkpoint": "m"},
            "--kl-coef 0.05: no effect with --advantage-estimator grpo, which does not read it (--kl-coef is read by "
            "rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, ppo); the reward KL is still computed and "
            "logged as rollout/kl",
        ),
        ("rloo", {"kl_coef": 0.05, "hf_checkpoint": "m"}, None),
        ("reinforce_plus_plus_baseline", {"kl_coef": 0.05, "hf_checkpoint": "m", "normalize_advantages": True}, None),
        ("ppo", {"kl_coef": 0.05, "hf_checkpoint": "m"}, None),
        # A custom advantage function gets `args` and may read them.
        ("grpo", {"gamma": 0.9, "custom_advantage_function_path": "my.adv"}, None),
    ],
)
def test_gamma_and_lambd_an_estimator_does_not_read_warn_once_in_one_line(
    monkeypatch, caplog, estimator, flags, warning
):
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())
    with caplog.at_level("WARNING"):
        for _ in range(2):  # re-validated in every worker: once per process
            SlimeArgs.from_dict({**BASE, "advantage_estimator": estimator, **flags})
    lines = [r.getMessage() for r in caplog.records if "no effect with --advantage-estimator" in r.getMessage()]
    assert lines == ([warning] if warning else [])


def test_a_spec_reads_only_known_estimator_flags():
    with pytest.raises(ValueError, match=r"estimator 'x': reads \['gama'\], not among \('gamma', 'lambd', 'kl_coef'\)"):
        EstimatorSpec(name="x", advantages=_advantages, rewards="none", reads=("gama",))
