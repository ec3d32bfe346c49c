"""Token buckets of a rollout (`slime_rollout.runtime.goodput`), on hand-built samples."""

from slime_core.sample import Sample, Status
from slime_rollout.generation.generate import mask_offpolicy_prefix
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
        "goodput/tokens_offpolicy_masked": 0.0,
        "goodput/tokens_generated": 13.0,  # 6 accepted + 6 filtered + 1 aborted; requeued counted later
    }


def test_batch_token_fates_counts_what_no_batch_took():
    samples = [_sample(4), _sample(2), _sample(3)]
    # Two DP batches holding 4 + 2 tokens: the 3-token sample filled no optimizer step.
    assert batch_token_fates(samples, [4.0, 2.0]) == {"goodput/tokens_unscheduled": 3.0}
    assert batch_token_fates(samples, [9.0]) == {"goodput/tokens_unscheduled": 0.0}


def test_a_continued_response_masked_off_policy_is_counted_once_as_generated():
    # --partial-rollout --mask-offpolicy-in-partial-rollout: rollout 0 generates 5 tokens and re-queues the sample;
    # rollout 1 masks them (earlier policy) and generates 3 more; rollout 2 masks all 8 and adds 1, then a filter
    # drops the group. Over the run the engines generated 5 + 3 + 1 = 9 tokens.
    s = _sample(5, status=Status.ABORTED)
    r0 = rollout_token_fates([], {}, requeued=[[s]])
    mask_offpolicy_prefix(s)
    s.append_response_tokens([1] * 3, log_probs=[-0.1] * 3)
    s.status = Status.ABORTED
    r1 = rollout_token_fates([], {}, requeued=[[s]])
    mask_offpolicy_prefix(s)
    s.append_response_tokens([1], log_probs=[-0.1])
    s.status = Status.COMPLETED
    r2 = rollout_token_fates([], {"filtered": [[s]]})
    assert s.loss_mask == [0] * 8 + [1]
    assert [r["goodput/tokens_generated"] for r in (r0, r1, r2)] == [0.0, 0.0, 9.0]  # was [0, 0, 1]
    assert r2["goodput/tokens_filtered"] == 1.0
    assert r2["goodput/tokens_offpolicy_masked"] == 8.0
    # Accepted the same way: the masked part is its own bucket, beside the trainable tokens.
    t = _sample(4)
    mask_offpolicy_prefix(t)
    t.append_response_tokens([1] * 2, log_probs=[-0.1] * 2)
    fates = rollout_token_fates([[t]], {})
    assert (fates["goodput/tokens_accepted"], fates["goodput/tokens_offpolicy_masked"]) == (2.0, 4.0)
    assert fates["goodput/tokens_generated"] == 6.0
