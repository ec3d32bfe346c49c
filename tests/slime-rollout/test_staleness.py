"""Weight-version staleness of samples and groups (`slime_rollout.generation.staleness`), hand-computed values."""

import pytest

from slime_core.sample import Sample
from slime_rollout.generation.staleness import group_version, parse_version, sample_version, staleness_metrics


def _sample(*versions):
    return Sample(weight_versions=list(versions))


def test_versions_are_integers_and_engine_placeholders_are_none():
    assert [parse_version(v) for v in ("7", " 12 ", "default", "3-incomplete", None, "")] == [7, 12, None, None, None,
                                                                                            None]  # fmt: skip


def test_a_sample_counts_by_its_oldest_call_unless_its_prefix_is_masked():
    continued = _sample("3", "5")  # a partial rollout: generated under 3, continued under 5 after a push
    assert sample_version(continued) == 3
    assert sample_version(continued, trainable_only=True) == 5
    assert sample_version(_sample("default", "4")) == 4
    assert sample_version(_sample()) is None and sample_version(_sample("default")) is None


def test_a_group_counts_by_its_oldest_sample_and_fan_out_entries_are_flattened():
    group = [_sample("6"), [_sample("5"), _sample("7")], _sample("4", "6")]
    assert group_version(group) == 4
    assert group_version(group, mask_offpolicy=True) == 5  # the continued sample counts as 6 now
    assert group_version([_sample(), _sample("default")]) is None


def test_staleness_metrics():
    # Samples 0, 0, 1, 3 versions behind: mean 1, p50 between 0 and 1 (linear), p90 = 1 + 0.7 * (3 - 1).
    m = staleness_metrics([0, 0, 1, 3])
    assert m == {
        "rollout/staleness_mean": 1.0,
        "rollout/staleness_min": 0.0,
        "rollout/staleness_max": 3.0,
        "rollout/staleness_p50": 0.5,
        "rollout/staleness_p90": pytest.approx(2.4, abs=1e-12),
    }
    assert staleness_metrics([]) == {}
