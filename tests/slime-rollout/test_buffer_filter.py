"""`--buffer-filter-path` (original signature `fn(args, rollout_id, buffer, num_samples)`): its contract is checked
where it is called (issue 27, plugin pass).

A filter that returned `buffer[:n]` without removing the groups handed the same Sample objects out at every draw (two
generate tasks writing into one object, the group trained twice); one returning None failed as "object of type
'NoneType' has no len()", naming no plugin.
"""

import json

import pytest
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Sample
from slime_rollout.data.source import RolloutDataSourceWithBuffer
from slime_rollout.plugins import load_function


def peeking_filter(args, rollout_id, buffer, num_samples):
    return buffer[:num_samples]  # the groups stay in the buffer


def none_filter(args, rollout_id, buffer, num_samples):
    return None


def greedy_filter(args, rollout_id, buffer, num_samples):
    taken = list(buffer)
    del buffer[:]
    return taken


def twice_filter(args, rollout_id, buffer, num_samples):
    group = buffer.pop(0)
    return [group, group]


def flat_filter(args, rollout_id, buffer, num_samples):
    return buffer.pop(0)  # one group, not a list of groups


SEEN = []


def last_first_filter(args, rollout_id, buffer, num_samples):
    SEEN.append((rollout_id, len(buffer), num_samples))
    return [buffer.pop()]


def _source(tmp_path, filter_name=None, groups=3):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "label": "1"}) + "\n" for p in "abcdef"))
    path = f"{__name__}.{filter_name}" if filter_name else None
    source = RolloutDataSourceWithBuffer(_args(prompt_data=str(data), input_key="prompt", buffer_filter_path=path))
    source.add_samples(source.get_samples(groups))  # three partial groups (samples 0-5) in the buffer
    return source


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("peeking_filter", ValueError, r"returned the group of samples \[0, 1\] but left it in the buffer"),
        ("none_filter", TypeError, r"returned NoneType None, not a list of groups"),
        ("greedy_filter", ValueError, r"returned 3 groups when 2 were asked for"),
        ("twice_filter", ValueError, r"returned the group of samples \[0, 1\] twice"),
        ("flat_filter", TypeError, r"group 0 is Sample .*not a list of Samples"),
    ],
)
def test_a_buffer_filter_breaking_its_contract_is_one_error_naming_it(tmp_path, name, error, message):
    source = _source(tmp_path, name)
    with pytest.raises(error, match=rf"^--buffer-filter-path {__name__}\.{name} {message}|^--buffer-filter-path "
                                    rf"{__name__}\.{name}: {message}"):  # fmt: skip
        source.get_samples(2)


def test_a_filter_keeping_its_contract_is_served_first_then_fresh_prompts(tmp_path):
    SEEN.clear()
    source = _source(tmp_path, "last_first_filter")
    first = source.get_samples(2)
    # The newest buffered group (samples 4, 5), then a fresh prompt (the 4th row, samples 6, 7).
    assert [[s.index for s in g] for g in first] == [[4, 5], [6, 7]]
    assert SEEN == [(None, 3, 2)]  # called as the original calls it: rollout_id None, the buffer, the count
    assert [[s.index for s in g] for g in source.buffer] == [[0, 1], [2, 3]]
    second = source.get_samples(1)
    assert [[s.index for s in g] for g in second] == [[2, 3]]
    assert all(a is not b for g in first for a in g for h in second for b in h)


def test_the_default_takes_the_oldest_groups_and_the_original_pop_first_is_the_same(tmp_path):
    source = _source(tmp_path)
    assert [[s.index for s in g] for g in source.get_samples(2)] == [[0, 1], [2, 3]]
    assert [[s.index for s in g] for g in source.buffer] == [[4, 5]]
    pop_first = load_function("slime.rollout.data_source.pop_first", flag="--buffer-filter-path")
    buffer = [[Sample(index=0)], [Sample(index=1)], [Sample(index=2)]]
    assert [g[0].index for g in pop_first(None, None, buffer, 2)] == [0, 1]
    assert [g[0].index for g in buffer] == [2]


def raising_filter(args, rollout_id, buffer, num_samples):
    return {g[0].index: g for g in buffer}[99]  # a bug in the user's filter


def test_a_buffer_filter_that_raises_keeps_its_error_and_names_the_flag_and_the_buffer(tmp_path):
    # Reproducer: its KeyError reached the rollout noted "(raised by RolloutDataSourceWithBuffer.get_samples(2) ...)",
    # naming the data source but not the --buffer-filter-path function that raised.
    source = _source(tmp_path, "raising_filter")
    with pytest.raises(KeyError) as raised:
        source.get_samples(2)
    assert raised.value.__notes__ == [
        f"(raised by --buffer-filter-path {__name__}.raising_filter on the buffer's groups of samples [0, 1], [2, 3], "
        "[4, 5], asked for 2)"
    ]
