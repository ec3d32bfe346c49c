"""The first-step gate says when `--true-on-policy-mode` does not reach a zero trainer/rollout log-prob gap."""

from slime_app.guards import first_step_logprob_gate
from slime_core.config import SlimeArgs

KEY = "train/train_rollout_logprob_abs_diff"


def _cfg(**fields):
    return SlimeArgs.from_dict({"rollout_batch_size": 8, "num_rollout": 1, "train_backend": "fsdp", **fields})


def test_nonzero_gap_in_the_mode_is_a_warning(caplog):
    first_step_logprob_gate(_cfg(true_on_policy_mode=True), {KEY: 1e-4})
    assert "--true-on-policy-mode: first-step mean |trainer - rollout log-prob| = 0.0001, not 0" in caplog.text


def test_zero_gap_in_the_mode_and_any_small_gap_without_it_are_quiet(caplog):
    first_step_logprob_gate(_cfg(true_on_policy_mode=True), {KEY: 0.0})
    first_step_logprob_gate(_cfg(), {KEY: 1e-4})
    assert "--true-on-policy-mode" not in caplog.text
