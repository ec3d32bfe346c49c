"""Partial rollout (`--partial-rollout`) and `--mask-offpolicy-in-partial-rollout` in the rollout loop
(`slime_rollout.generation.rollout`), against a scripted engine client (`_rollout_fakes.py`)."""

import asyncio

from slime_rollout_fakes import FakeClient, ListDataSource
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Sample, Status
from slime_rollout.base_types import RolloutFnTrainOutput
from slime_rollout.generation import generate as generate_mod
from slime_rollout.generation.rollout import generate_rollout, generate_rollout_async

A, B = ord("A"), ord("B")


async def test_partial_rollout_groups_come_back_and_continue(use_client):
    # Prompt 0 is quick; prompts 1..3 need 30 tokens and are aborted midway in rollout 0.
    client = use_client(FakeClient({i: [A] for i in range(10)}, lengths={0: 2, 1: 30, 2: 30, 3: 30}, step_s=0.003))
    args = _args(rollout_batch_size=1, over_sampling_batch_size=4, n_samples_per_prompt=1, partial_rollout=True,
                 rollout_max_response_len=40)  # fmt: skip
    ds = ListDataSource(n=1)
    out0 = await asyncio.to_thread(generate_rollout, args, 0, ds)
    assert isinstance(out0, RolloutFnTrainOutput)
    assert [g[0].group_index for g in out0.samples] == [0]
    assert client.in_flight == 0
    assert [g[0].group_index for g in ds.buffer] == [1, 2, 3]
    # Goodput: the partial groups carry over (counted when they finish), only prompt 0's 2 tokens are generated.
    assert out0.metrics["goodput/tokens_requeued"] == sum(g[0].response_length for g in ds.buffer)
    assert out0.metrics["goodput/tokens_generated"] == 2.0 and out0.metrics["goodput/tokens_aborted"] == 0.0
    partial = {g[0].group_index: (g[0].response_length, list(g[0].tokens)) for g in ds.buffer}
    for g in ds.buffer:
        s = g[0]
        assert s.status is Status.ABORTED and s.reward is None
        assert 0 < s.response_length < 30 and s.metadata["start_rollout_id"] == 0
        assert len(s.rollout_log_probs) == s.response_length

    client.step_s = 0.0
    args.rollout_batch_size = args.over_sampling_batch_size = 3
    out1 = await asyncio.to_thread(generate_rollout, args, 1, ds)
    assert [g[0].group_index for g in out1.samples] == [1, 2, 3]  # the buffer is served first
    for g in out1.samples:
        s = g[0]
        done_len, prefix = partial[s.group_index]
        assert s.tokens[: len(prefix)] == prefix  # continued, not regenerated
        assert s.response_length == 30 and s.status is Status.COMPLETED and s.reward == 1.0
        assert s.metadata["start_rollout_id"] == 0
        assert s.loss_mask == [1] * 30
    # The continuation asked only for the remaining budget.
    cont = [p for p in client.payloads if len(p["input_ids"]) > 1]
    assert sorted(p["sampling_params"]["max_new_tokens"] for p in cont) == sorted(40 - n for n, _ in partial.values())


class _EngineAbortsFirstRequestOfPrompt1(FakeClient):
    """The engine itself aborts prompt 1's first request after one token (as around a weight update)."""

    async def generate(self, payload):
        if payload["input_ids"] == [1]:
            self.calls[1] += 1
            meta = {"output_token_logprobs": [[-0.4, A, None]], "finish_reason": {"type": "abort"},
                    "weight_version": "v0", "prompt_tokens": 1, "completion_tokens": 1}  # fmt: skip
            return {"text": "A", "output_ids": [A], "meta_info": meta}
        return await super().generate(payload)


async def test_a_group_the_engine_aborted_mid_rollout_is_requeued_as_the_end_of_rollout_abort_requeues(use_client):
    # Prompt 1's two samples are aborted by the engine during rollout 0 (not by the end-of-rollout abort): with
    # --partial-rollout the group goes back to the buffer, and its partial samples lacked the
    # metadata["start_rollout_id"] the original's abort gives every partial sample it returns to the buffer.
    use_client(_EngineAbortsFirstRequestOfPrompt1({i: [A, B] for i in range(10)}, lengths={1: 3}))
    args = _args(partial_rollout=True, mask_offpolicy_in_partial_rollout=True)
    ds = ListDataSource(n=2)
    out0 = await asyncio.to_thread(generate_rollout, args, 0, ds)
    assert [[s.index for s in g] for g in out0.samples] == [[0, 1], [4, 5]]
    assert [[s.index for s in g] for g in ds.buffer] == [[2, 3]]
    for s in ds.buffer[0]:
        assert s.status is Status.ABORTED and s.response == "A" and s.weight_versions == ["v0"]
        assert s.metadata["start_rollout_id"] == 0
    # Rollout 1 continues the group from its partial responses; the v0 token is masked, the new ones trained on.
    out1 = await asyncio.to_thread(generate_rollout, args, 1, ds)
    group = out1.samples[0]
    assert [s.index for s in group] == [2, 3]
    for s in group:
        assert s.status is Status.COMPLETED and s.response_length == 3 and s.metadata["start_rollout_id"] == 0
        assert s.loss_mask == [0, 1, 1] and s.rollout_log_probs == [0.0, -0.1, -0.2]
        assert s.weight_versions == ["v0", "v1"]


async def test_mask_offpolicy_in_partial_rollout(use_client):
    from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm

    use_client(FakeClient({0: [A]}, lengths={0: 5}))
    s = Sample(tokens=[0], label="A")
    s.append_response_tokens([A, A], log_probs=[-0.5, -0.5], text="AA")
    s.status = Status.ABORTED
    args = _args(partial_rollout=True, mask_offpolicy_in_partial_rollout=True)
    s = await generate_and_rm(args, s, RolloutState.create(args, rollout_id=1))
    assert s.response_length == 5 and s.loss_mask == [0, 0, 1, 1, 1]
    assert s.rollout_log_probs == [0.0, 0.0, -0.1, -0.2, -0.3]


async def two_call_generate(args, sample, sampling_params):
    """A custom generate function continuing its own response with the default one: 2 tokens, a tool token, more."""
    sample = await generate_mod.generate(args, sample, dict(sampling_params, max_new_tokens=2))
    sample.append_response_tokens([B], trainable=False, text="B")
    return await generate_mod.generate(args, sample, sampling_params)


async def test_mask_offpolicy_leaves_the_turns_a_custom_generate_made_in_this_rollout_trainable(use_client):
    # The original masks a partial sample's response once, in generate_and_rm, before the generate function; the
    # default `generate` masked again on each call, so a custom generate function calling it twice (a second turn in
    # the same rollout, same policy) lost its first turn's tokens from the loss (loss mask [0, 0, 0, 1, 1]).
    use_client(FakeClient({0: [A], 1: [A]}, lengths={0: 5, 1: 5}))
    args = _args(partial_rollout=True, mask_offpolicy_in_partial_rollout=True,
                 custom_generate_function_path=f"{__name__}.two_call_generate")  # fmt: skip
    out, _ = await generate_rollout_async(args, 0, ListDataSource(n=2))
    for s in (s for group in out.samples for s in group):
        assert s.response == "AABAA" and s.loss_mask == [1, 1, 0, 1, 1]
        assert s.rollout_log_probs == [-0.1, -0.2, 0.0, -0.1, -0.2]


async def continuing_generate(args, sample, sampling_params):
    """A custom generate function written as the original's `generate`: continues the partial response as is."""
    sample.append_response_tokens(args, tokens=[B], log_probs=[-0.7], meta_info={"finish_reason": {"type": "stop"}})
    return sample


async def test_mask_offpolicy_covers_a_custom_generate_function(use_client):
    # Only the default generate masked the older policy's tokens; the original masks them in generate_and_rm, for
    # any generate function. A custom one continuing a partial sample trained on the off-policy prefix.
    from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm

    use_client(FakeClient({}))
    args = _args(
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=True,
        custom_generate_function_path=f"{__name__}.continuing_generate",
    )
    s = Sample(tokens=[0], label="B")
    s.append_response_tokens([A, A], log_probs=[-0.5, -0.5], text="AA")
    s.status = Status.ABORTED
    state = RolloutState.create(args, rollout_id=1)
    s = await generate_and_rm(args, s, state)
    assert s.loss_mask == [0, 0, 1] and s.rollout_log_probs == [0.0, 0.0, -0.7]
    assert s.status is Status.COMPLETED and s.reward == 1.0  # scored: reward_is_a of the response "AA"
