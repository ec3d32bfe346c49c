"""Token buckets of a rollout (`slime_rollout.runtime.goodput`), on hand-built samples."""

from slime_core.sample import Sample, Status
from slime_rollout.runtime.goodput import batch_token_fates, model_tokens, rollout_token_fates


def _sample(n_model, n_tool=0, status=Status.COMPLETED):
    """A response of `n_model` trainable tokens followed by `n_tool` masked tool tokens."""
    s = Sample(tokens=[0])
    s.append_response_tokens([1] * n_model, log_probs=[-0.1] * n_model)
    if n_tool:
        s.append_response_tokens([2] * n_tool, trainable=False)
    s.status = status
    return s


def test_model_tokens_skip_tool_tokens_and_walk_fan_out():
    # A fan-out group: one entry is a list of two samples (custom generate returning a list).
    group = [_sample(3, n_tool=5), [_sample(2), _sample(1)]]
    assert model_tokens([group]) == 6


def test_rollout_token_fates_partition():
    accepted = [[_sample(4), _sample(2, status=Status.TRUNCATED)]]
    discarded = {"filtered": [[_sample(3), _sample(3)]], "aborted": [[_sample(1)]], "surplus": []}
    fates = rollout_token_fates(accepted, discarded, requeued=[[_sample(7)]])
    assert fates == {
        "goodput/tokens_filtered": 6.0,
        "goodput/tokens_aborted": 1.0,
        "goodput/tokens_surplus": 0.0,
        "goodput/tokens_accepted": 6.0,
        "goodput/tokens_truncated": 2.0,
        "goodput/tokens_requeued": 7.0,
        "goodput/tokens_generated": 13.0,  # 6 accepted + 6 filtered + 1 aborted; requeued counted later
    }


def test_batch_token_fates_counts_what_no_batch_took():
    samples = [_sample(4), _sample(2), _sample(3)]
    # Two DP batches holding 4 + 2 tokens: the 3-token sample filled no optimizer step.
    assert batch_token_fates(samples, [4.0, 2.0]) == {"goodput/tokens_unscheduled": 3.0}
    assert batch_token_fates(samples, [9.0]) == {"goodput/tokens_unscheduled": 0.0}
