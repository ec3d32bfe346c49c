"""The original slime's plugin hooks, called as the original calls them (issue 27, hostile pass 72).

Each test runs a recording plugin through the narrowest real caller and compares the calls with what the original's
code does (`slime/rollout/sglang_rollout.py`, `slime/observability/rollout_metrics.py`).
"""

from slime_rollout_fakes import FakeClient, ListDataSource
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Sample, Status
from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm
from slime_rollout.generation.rollout import generate_rollout_async

A, B = ord("A"), ord("B")
HOOK_CALLS: list[tuple] = []


def counting_hook(args, sample, rollout_id=None):
    HOOK_CALLS.append((sample.index, rollout_id))
    sample.metadata["hooked"] = sample.metadata.get("hooked", 0) + 1
    return sample


async def test_a_sample_hook_is_not_run_again_on_a_finished_sample_from_the_partial_rollout_buffer(use_client):
    # The original's generate_and_rm returns a COMPLETED/TRUNCATED sample (one the partial-rollout buffer handed back,
    # its hooks and reward already applied in the rollout that generated it) before the hooks: they ran again here, so
    # a hook that appends to or counts on the sample did it twice for those samples only.
    use_client(FakeClient({0: [A]}))
    HOOK_CALLS.clear()
    args = _args(rollout_sample_hook_path=[f"{__name__}.counting_hook"], partial_rollout=True)
    done = Sample(index=7, group_index=3, tokens=[0, A, A], response="AA", response_length=2, reward=1.0,
                  status=Status.COMPLETED, metadata={"hooked": 1})  # fmt: skip
    out = await generate_and_rm(args, done, RolloutState.create(args, rollout_id=4))
    assert out is done and done.metadata == {"hooked": 1} and HOOK_CALLS == []
    fresh = Sample(index=8, group_index=3, tokens=[0])
    out = await generate_and_rm(args, fresh, RolloutState.create(args, rollout_id=4))
    assert out.metadata == {"hooked": 1} and HOOK_CALLS == [(8, 4)] and out.response_length == 2


async def fresh_sample_for_index_1(args, sample, sampling_params):
    tokens = [*sample.tokens, A]
    if sample.index == 1:  # a new Sample, as the original's tau-bench example builds one (without group_index)
        return Sample(prompt=sample.prompt, tokens=tokens, response="A", response_length=1, status=Status.COMPLETED)
    sample.tokens, sample.response, sample.response_length, sample.status = tokens, "A", 1, Status.COMPLETED
    return sample


async def test_a_fresh_sample_from_a_generate_function_keeps_its_prompt_group(use_client):
    # Reproducer: the original groups rewards by position, so a generate function may return a new Sample without
    # group_index; here the rollout failed with "samples [None] have no group_index while others have one", naming
    # neither the function nor the prompt.
    use_client(FakeClient({}))
    args = _args(custom_generate_function_path=f"{__name__}.fresh_sample_for_index_1")
    out, _ = await generate_rollout_async(args, 0, ListDataSource(n=2))
    assert [[(s.index, s.group_index, s.response) for s in g] for g in out.samples] == [
        [(0, 0, "A"), (1, 0, "A")],
        [(2, 1, "A"), (3, 1, "A")],
    ]
