"""A training rollout that cannot fill its batch ends in one error naming the cause (issue 27, plugin pass).

Before, every such stop said "the dynamic-sampling filter drops everything", also when no filter was set and every
group came back ABORTED from a generate function (re-queued with `--partial-rollout`: "dropped: none"), and a data
source that ran dry said only "data source returned no samples" (no rollout, no data source, nothing of the groups
the filter had dropped).
"""

import pytest
from slime_rollout_fakes import FakeClient, ListDataSource
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Status
from slime_rollout.generation.rollout import generate_rollout_async

A, B = ord("A"), ord("B")


async def aborting_generate(args, sample, sampling_params):
    sample.status = Status.ABORTED  # what the error hint of a fan-out plugin suggests to drop a sample
    return sample


def reject_all(args, samples):
    return False


@pytest.mark.parametrize("partial", [False, True])
async def test_groups_that_all_come_back_aborted_name_the_generate_function_not_a_filter(use_client, partial):
    use_client(FakeClient({}))
    path = f"{__name__}.aborting_generate"
    args = _args(custom_generate_function_path=path, partial_rollout=partial, dynamic_sampling_max_empty_rounds=3)
    with pytest.raises(RuntimeError) as e:
        await generate_rollout_async(args, 4, ListDataSource(n=2))
    message = str(e.value)
    # The fill and two refills of 2 groups each came back aborted (6); the third refill is refused.
    dropped = "re-queued (aborted, --partial-rollout): 6" if partial else "aborted: 6"
    assert message.startswith(
        f"rollout 4: 3 over-sampling rounds in a row kept no group (0/2 kept, dropped: {dropped})"
    )
    assert f"groups come back with ABORTED samples (from {path}, or the engines abort its requests)" in message
    assert ("with --partial-rollout it goes back to the buffer" in message) is partial
    assert "dynamic-sampling filter" not in message and message.endswith("or raise --dynamic-sampling-max-empty-rounds")


async def test_a_filter_that_drops_everything_is_named_with_its_path(use_client):
    use_client(FakeClient({i: [A, B] for i in range(100)}))
    path = f"{__name__}.reject_all"
    args = _args(dynamic_sampling_filter_path=path, dynamic_sampling_max_empty_rounds=2)
    with pytest.raises(RuntimeError) as e:
        await generate_rollout_async(args, 0, ListDataSource(n=2))
    message = str(e.value)
    assert "(0/2 kept, dropped: filtered: 4): the dynamic-sampling filter --dynamic-sampling-filter-path " in message
    assert f"{path} drops every group (check the reward function and the filter)" in message
    assert "ABORTED" not in message


async def test_a_data_source_that_runs_dry_is_named_with_what_was_dropped(use_client):
    use_client(FakeClient({i: [A, B] for i in range(100)}))
    args = _args(dynamic_sampling_filter_path=f"{__name__}.reject_all", over_sampling_batch_size=4)
    with pytest.raises(RuntimeError) as e:
        await generate_rollout_async(args, 2, ListDataSource(n=2, num_prompts=7))
    assert str(e.value) == (
        "rollout 2: ListDataSource.get_samples(4) (rollout 2) returned no groups, 0/2 kept (dropped: filtered: 7); "
        "the data source ran dry"
    )


SEEN_GROUPS = []


def record_all_groups(args, all_groups, data_source):
    SEEN_GROUPS.append([[s.index for s in group] for group in all_groups])


def record_data(args, data):
    SEEN_GROUPS.append([[s.index for s in group] for group in data])


async def test_the_end_of_rollout_plugins_see_groups_in_sample_order_not_finishing_order(use_client):
    # Prompt 0 answers in 8 tokens (the surplus, aborted), prompt 1 in 4, prompts 2 and 3 in 1: groups 2 and 3
    # finish before 1. The original sorts `all_samples` by index before --rollout-all-samples-process-path; here it
    # came in finishing order ([[4, 5], [6, 7], [2, 3]]).
    lengths = {0: 8, 1: 4}
    use_client(FakeClient({i: [A, B] for i in range(4)}, lengths=lengths, step_s=0.02, default_length=1))
    SEEN_GROUPS.clear()
    args = _args(
        rollout_batch_size=3,
        over_sampling_batch_size=4,
        rollout_all_samples_process_path=f"{__name__}.record_all_groups",
        rollout_sample_filter_path=f"{__name__}.record_data",
    )
    out, _ = await generate_rollout_async(args, 0, ListDataSource(n=2))
    kept = [[s.index for s in group] for group in out.samples]
    assert kept == [[2, 3], [4, 5], [6, 7]]  # prompt 0 was the surplus, aborted
    assert SEEN_GROUPS == [kept, kept]
