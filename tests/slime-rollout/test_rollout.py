"""A scripted in-process stand-in for `RolloutClient` (test double for the rollout loop logic).

Each prompt is `tokens=[prompt_id]`. The engine emits one token per `step_s` seconds: the script
`answers[prompt_id]` (a list cycled over the requests of that prompt) gives the token emitted,
`lengths[prompt_id]` the response length before a "stop" (default 2). Log-prob of the k-th emitted
token of a request is `-(k + 1) / 10`. `abort_all` makes every in-flight request return at once with
finish_reason abort and the tokens emitted so far, then waits until none is running, like SGLang's
`/abort_request {"abort_all": true}` + polling `/v1/loads`.
"""

import asyncio
import collections


class FakeClient:
    def __init__(self, answers, lengths=None, step_s=0.0, default_length=2):
        self.answers = answers
        self.lengths = lengths or {}
        self.step_s = step_s
        self.default_length = default_length
        self.calls = collections.Counter()
        self.payloads = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.abort_calls = 0
        self.finishes = []  # (prompt_id, finish type) per request
        self._abort_generation = 0

    async def generate(self, payload):
        self.payloads.append(payload)
        ids = payload["input_ids"]
        prompt_id = ids[0]
        k = self.calls[prompt_id]
        self.calls[prompt_id] += 1
        answer = self.answers[prompt_id][k % len(self.answers[prompt_id])]
        target = self.lengths.get(prompt_id, self.default_length)
        already = len(ids) - 1  # continuation of a partial response
        budget = payload["sampling_params"]["max_new_tokens"]
        generation = self._abort_generation
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        out, finish = [], None
        try:
            while finish is None:
                await asyncio.sleep(self.step_s)  # 0: one event-loop turn per token
                if self._abort_generation != generation:
                    finish = {"type": "abort"}
                    break
                out.append(answer)
                if already + len(out) >= target:
                    finish = {"type": "stop", "matched": answer}
                elif len(out) >= budget:
                    finish = {"type": "length", "length": budget}
        finally:
            self.in_flight -= 1
        self.finishes.append((prompt_id, finish["type"]))
        meta = {"output_token_logprobs": [[-(i + 1) / 10, t, None] for i, t in enumerate(out)],
                "finish_reason": finish, "weight_version": "v1", "prompt_tokens": len(ids),
                "completion_tokens": len(out)}  # fmt: skip
        return {"text": "".join(chr(t) for t in out), "output_ids": out, "meta_info": meta}

    async def abort_all(self):
        self.abort_calls += 1
        self._abort_generation += 1
        while self.in_flight:
            await asyncio.sleep(0.001)


class ListDataSource:
    """Groups of n copies of `Sample(tokens=[prompt_id])` for prompt ids 0, 1, 2, ... with a buffer."""

    def __init__(self, n, num_prompts=1000):
        from slime_core.sample import Sample

        self.n, self.num_prompts, self.next_prompt, self.next_index = n, num_prompts, 0, 0
        self.buffer, self._sample = [], Sample

    def get_samples(self, num_groups):
        out = self.buffer[:num_groups]
        self.buffer = self.buffer[num_groups:]
        while len(out) < num_groups and self.next_prompt < self.num_prompts:
            p, first = self.next_prompt, self.next_index
            out.append([self._sample(prompt=f"p{p}", tokens=[p], group_index=p, index=first + j, label="A")
                        for j in range(self.n)])  # fmt: skip
            self.next_index += self.n
            self.next_prompt += 1
        return out

    def add_samples(self, groups):
        self.buffer.extend(groups)


import dataclasses  # noqa: E402
import gc  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from slime_core.config import PluginArgs, SlimeArgs  # noqa: E402
from slime_core.protocols import DynamicFilterOutput  # noqa: E402
from slime_core.sample import Sample, Status  # noqa: E402
from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput  # noqa: E402
from slime_rollout.generation import generate as generate_mod  # noqa: E402
from slime_rollout.generation import rollout as rollout_mod  # noqa: E402
from slime_rollout.generation.rollout import generate_rollout, generate_rollout_async, run_rollout  # noqa: E402
from slime_rollout.runtime.deadlines import DeadlineExceeded  # noqa: E402

A, B = ord("A"), ord("B")


def reward_is_a(args, sample):
    """Test reward: 1.0 if the response ends with 'A'."""
    return 1.0 if sample.response.endswith("A") else 0.0


def _args(**kw):
    """The plugin view the rollout gets: a validated config (+ writable, as plugins expect)."""
    fields = dict(rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=1, custom_rm_path=f"{__name__}.reward_is_a",
                  rollout_max_response_len=8, sglang_server_concurrency=64, rollout_num_gpus=1,
                  rollout_num_gpus_per_engine=1)  # fmt: skip
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


@pytest.fixture
def use_client(monkeypatch):
    def install(client):
        monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
        return client

    return install


async def test_rollout_groups_rewards_logprobs_and_metrics(use_client):
    # prompt 0 answers A,B; prompt 1 answers A,A; prompt 2 (never needed).
    client = use_client(FakeClient({0: [A, B], 1: [A], 2: [B]}, lengths={0: 3, 1: 2}))
    args = _args()
    ds = ListDataSource(n=2)
    out, leftovers = await generate_rollout_async(args, 0, ds)
    assert leftovers == []
    assert [[s.index for s in g] for g in out.samples] == [[0, 1], [2, 3]]
    flat = [s for g in out.samples for s in g]
    assert [s.response for s in flat] == ["AAA", "BBB", "AA", "AA"]
    assert [s.reward for s in flat] == [1.0, 0.0, 1.0, 1.0]
    for s in flat:
        assert s.status is Status.COMPLETED
        assert s.tokens[0] == s.group_index and s.response_tokens == [ord(c) for c in s.response]
        assert s.rollout_log_probs == [-(i + 1) / 10 for i in range(s.response_length)]
        assert s.loss_mask == [1] * s.response_length and s.weight_versions == ["v1"]
        assert s.session_id is not None
    # The engine got the prompt ids, return_logprob, and the sampling params from args.
    p = client.payloads[0]
    assert p["return_logprob"] is True and p["input_ids"] in ([0], [1])
    assert p["sampling_params"]["max_new_tokens"] == 8 and p["sampling_params"]["no_stop_trim"] is True
    m = out.metrics
    assert m["rollout/raw_reward"] == pytest.approx(0.75, abs=1e-12)
    assert m["rollout/response_len/mean"] == pytest.approx(2.5, abs=1e-12)
    assert m["rollout/response_len/max"] == 3 and m["rollout/response_len/min"] == 2
    assert m["rollout/truncated_ratio"] == 0.0
    # mean over the 10 tokens: 2 * (0.1+0.2+0.3) + 2 * (0.1+0.2) = 1.8 -> -0.18
    assert m["rollout/log_probs"] == pytest.approx(-0.18, abs=1e-12)
    assert m["rollout/zero_std/count_1.0"] == 1.0
    assert client.in_flight == 0
    # Goodput: all 3 + 3 + 2 + 2 model tokens were accepted, nothing thrown away.
    assert m["goodput/tokens_generated"] == m["goodput/tokens_accepted"] == 10.0
    assert m["goodput/tokens_filtered"] == m["goodput/tokens_aborted"] == m["goodput/tokens_surplus"] == 0.0
    assert m["perf/reward_time"] >= 0.0


async def test_truncation_from_length_budget(use_client):
    use_client(FakeClient({0: [A], 1: [A]}, lengths={0: 100, 1: 100}))
    out, _ = await generate_rollout_async(_args(rollout_max_response_len=4), 0, ListDataSource(n=2))
    for s in (s for g in out.samples for s in g):
        assert s.status is Status.TRUNCATED and s.response_length == 4
    assert out.metrics["rollout/truncated_ratio"] == 1.0
    assert out.metrics["goodput/tokens_truncated"] == out.metrics["goodput/tokens_accepted"] == 16.0


async def test_dynamic_sampling_oversamples_filters_and_aborts(use_client):
    # Even prompts: both samples answer A (zero reward std -> dropped); odd prompts: A then B (kept).
    # Prompts >= 6 are slow (50 tokens) so they are still running when the batch is full.
    answers = {i: ([A] if i % 2 == 0 else [A, B]) for i in range(40)}
    lengths = {i: (2 if i < 6 else 50) for i in range(40)}
    client = use_client(FakeClient(answers, lengths=lengths, step_s=0.002))
    args = _args(
        rollout_batch_size=3,
        over_sampling_batch_size=4,
        dynamic_sampling_filter_path="slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        rollout_max_response_len=64,
    )
    ds = ListDataSource(n=2)
    out, leftovers = await generate_rollout_async(args, 0, ds)
    assert [g[0].group_index for g in out.samples] == [1, 3, 5]
    for group in out.samples:
        assert sorted(s.reward for s in group) == [0.0, 1.0]
    # Prompts 0, 2, 4 were dropped with the original metric name.
    assert out.metrics["rollout/dynamic_filter/drop_zero_std_1.0"] == 3.0
    # Two top-ups of 4 groups: after 0..2 finished only 1 was accepted and 1 in flight (< 3).
    assert ds.next_prompt == 8
    # The surplus (slow prompts 6, 7) was aborted on the engine and nothing is left running.
    assert client.abort_calls == 1 and client.in_flight == 0
    surplus = sorted(f for f in client.finishes if f[0] >= 6)
    assert surplus == [(6, "abort"), (6, "abort"), (7, "abort"), (7, "abort")]
    assert leftovers == []  # no --partial-rollout: the surplus is discarded
    m = out.metrics
    # Goodput: 3 accepted and 3 filtered groups of 2 samples × 2 tokens; the aborted ones hold what they emitted.
    assert m["goodput/tokens_accepted"] == 12.0 and m["goodput/tokens_filtered"] == 12.0
    aborted = [f for f in client.finishes if f[1] == "abort"]
    assert len(aborted) == 4 and m["goodput/tokens_aborted"] > 0
    assert m["goodput/tokens_generated"] == 24.0 + m["goodput/tokens_aborted"] + m["goodput/tokens_surplus"]


async def test_dynamic_sampling_that_keeps_nothing_stops_after_bounded_empty_rounds(use_client, caplog):
    # Every prompt answers A twice: zero reward std, every group dropped. Before, this sampled forever.
    use_client(FakeClient({i: [A] for i in range(100)}))
    args = _args(
        rollout_batch_size=2,
        over_sampling_batch_size=2,
        dynamic_sampling_filter_path="slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        dynamic_sampling_max_empty_rounds=3,
        rollout_max_response_len=8,
    )
    ds = ListDataSource(n=2)
    with caplog.at_level("INFO", logger="slime_rollout.generation.rollout"):
        with pytest.raises(RuntimeError, match=r"rollout 0: 3 over-sampling rounds in a row kept no group \(0/2 "
                           r"kept, dropped: zero_std_1\.0: \d+\).*--dynamic-sampling-max-empty-rounds"):  # fmt: skip
            await generate_rollout_async(args, 0, ds)
    # Three rounds of 2 prompts each kept nothing (the fill and 2 refills); each refill decision logged counts.
    assert ds.next_prompt == 6
    rounds = [r.getMessage() for r in caplog.records if "over-sampling round" in r.getMessage()]
    assert len(rounds) == 3 and rounds[0].startswith("rollout 0: over-sampling round 2: 0/2 groups kept, ")


async def test_filter_fallback_keeps_rejected_groups_only_when_nothing_could_replace_them(use_client):
    # Prompts 0..2 answer A twice (zero std), 3.. answer A then B (kept). Over-sampling 4, target 3.
    # 30 ms per token, 120 ms between prompts: the finish order holds on a loaded machine (rewards run in
    # threads; 40 ms between prompts was seen to flip once in the isolated package run).
    answers, lengths = {i: ([A] if i < 3 else [A, B]) for i in range(40)}, {i: 2 + 4 * i for i in range(40)}
    use_client(FakeClient(answers, lengths=lengths, step_s=0.03))
    fallback = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback"
    args = _args(rollout_batch_size=3, over_sampling_batch_size=4, dynamic_sampling_filter_path=fallback,
                 rollout_max_response_len=64)  # fmt: skip
    ds = ListDataSource(n=2)
    out, _ = await generate_rollout_async(args, 0, ds)
    # Prompts finish in order (length 2 + 4 id). 0: itself + 3 generating = 4 candidates > 3 -> dropped; 1 and 2:
    # 3 candidates <= 3 -> kept although their std is zero (no other group could take their place); 3: on merit.
    # The original's remaining_batch_size rule; no second over-sampling round.
    assert [g[0].group_index for g in out.samples] == [1, 2, 3]
    assert out.metrics["rollout/dynamic_filter/drop_zero_std_1.0"] == 1.0
    assert ds.next_prompt == 4


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


async def test_mask_offpolicy_in_partial_rollout(use_client):
    use_client(FakeClient({0: [A]}, lengths={0: 5}))
    s = Sample(tokens=[0], label="A")
    s.append_response_tokens([A, A], log_probs=[-0.5, -0.5], text="AA")
    s.status = Status.ABORTED
    args = _args(partial_rollout=True, mask_offpolicy_in_partial_rollout=True)
    s = await generate_mod.generate(args, s, {"max_new_tokens": 8})
    assert s.response_length == 5 and s.loss_mask == [0, 0, 1, 1, 1]
    assert s.rollout_log_probs == [0.0, 0.0, -0.1, -0.2, -0.3]


async def test_max_new_tokens_exhausted_is_truncated_without_call(use_client):
    client = use_client(FakeClient({0: [A]}))
    s = Sample(tokens=[0])
    s.append_response_tokens([A, A], log_probs=[-0.1, -0.1])
    s = await generate_mod.generate(_args(), s, {"max_new_tokens": 2})
    assert s.status is Status.TRUNCATED and client.payloads == []


async def fanout_generate(args, sample, sampling_params, evaluation=False):
    """Custom generate returning two samples (fan-out); records `evaluation`."""
    out = []
    for k in range(2):
        s = dataclasses.replace(sample, tokens=list(sample.tokens), metadata=dict(sample.metadata), rollout_id=7)
        s.append_response_tokens([A if k == 0 else B], log_probs=[-0.3], text="A" if k == 0 else "B")
        s.status = Status.COMPLETED
        s.metadata["evaluation"] = evaluation
        out.append(s)
    return out


def tag_hook(args, sample, evaluation, rollout_id):
    sample.metadata["hooked"] = rollout_id
    return None


async def group_reward(args, samples):
    return [float(len(samples))] * len(samples)


async def test_custom_generate_hooks_and_group_rm(use_client):
    use_client(FakeClient({}))
    args = _args(
        custom_generate_function_path=f"{__name__}.fanout_generate",
        rollout_sample_hook_path=[f"{__name__}.tag_hook"],
        rollout_batch_size=1,
    )
    out, _ = await generate_rollout_async(args, 5, ListDataSource(n=2))
    (group,) = out.samples
    assert [len(item) for item in group] == [2, 2]
    flat = [s for item in group for s in item]
    assert [s.reward for s in flat] == [1.0, 0.0, 1.0, 0.0]
    assert all(s.metadata["hooked"] == 5 and s.metadata["evaluation"] is False for s in flat)

    args = _args(group_rm=True, custom_rm_path=f"{__name__}.group_reward")
    use_client(FakeClient({0: [A], 1: [A]}))
    out, _ = await generate_rollout_async(args, 0, ListDataSource(n=2))
    assert [s.reward for g in out.samples for s in g] == [2.0] * 4


async def failing_generate(args, sample, sampling_params):
    if sample.group_index == 1:
        raise RuntimeError("boom")
    await asyncio.sleep(0.05)
    return sample


async def test_generate_error_drains_and_propagates(use_client):
    client = use_client(FakeClient({}))
    args = _args(custom_generate_function_path=f"{__name__}.failing_generate", rollout_batch_size=3)
    with pytest.raises(RuntimeError, match="boom"):
        await generate_rollout_async(args, 0, ListDataSource(n=2))
    assert client.abort_calls == 1
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not [t for t in others if "generate_and_rm" in repr(t.get_coro())]


async def none_generate(args, sample, sampling_params):
    return None  # forgot the return


async def list_with_none_generate(args, sample, sampling_params):
    return [sample, None]


def str_hook(args, sample, evaluation, rollout_id):
    return "done"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"custom_generate_function_path": f"{__name__}.none_generate"},
         rf"generate function {__name__}\.none_generate on sample \d+ returned NoneType None, not a Sample or a list "
         "of Samples"),
        ({"custom_generate_function_path": f"{__name__}.list_with_none_generate"},
         r"list_with_none_generate on sample \d+ returned list \[Sample\(.*not a Sample or a list of Samples"),
        ({"custom_generate_function_path": f"{__name__}.fanout_generate",
          "rollout_sample_hook_path": [f"{__name__}.str_hook"]},
         rf"--rollout-sample-hook-path {__name__}\.str_hook on sample \d+ returned str 'done', not a Sample or None"),
    ],
)  # fmt: skip
async def test_a_generate_function_or_hook_returning_a_non_sample_is_named(use_client, fields, message):
    # Issue 27, item 12: these failed as "'NoneType' object has no attribute 'reward'", naming no plugin.
    use_client(FakeClient({}))
    with pytest.raises(TypeError, match=message):
        await generate_rollout_async(_args(rollout_batch_size=1, **fields), 0, ListDataSource(n=2))


def legacy_rollout(args, rollout_id, data_source, evaluation=False):
    """A custom --rollout-function-path returning bare groups (legacy)."""
    return data_source.get_samples(1)


def test_run_rollout_custom_function_and_debug_dump_round_trip(tmp_path):
    args = _args(
        rollout_function_path=f"{__name__}.legacy_rollout",
        save_debug_rollout_data=str(tmp_path / "dump_{rollout_id}.pt"),
        load_debug_rollout_data=None,
    )
    ds = ListDataSource(n=2)
    out = run_rollout(args, 3, ds)
    assert isinstance(out, RolloutFnTrainOutput) and len(out.samples) == 1
    s = out.samples[0][0]
    raw = torch.load(tmp_path / "dump_3.pt", weights_only=True)
    assert raw["rollout_id"] == 3 and raw["samples"][0]["tokens"] == s.tokens
    assert not list(tmp_path.glob(".*"))  # no temp file left behind

    # Replay: a generated sample with log-probs survives unchanged.
    s.append_response_tokens([A, B], log_probs=[-0.25, -1.5], text="AB", meta_info={"finish_reason": {"type": "stop"}})
    s.reward = {"score": 1.0}
    from slime_rollout.runtime.debug_dump import save_debug_rollout_data

    save_debug_rollout_data(args, 4, [s, out.samples[0][1]])
    replay_args = _args(load_debug_rollout_data=str(tmp_path / "dump_{rollout_id}.pt"))
    replay = run_rollout(replay_args, 4, ds)
    assert [[x.to_dict() for x in g] for g in replay.samples] == [[s.to_dict(), out.samples[0][1].to_dict()]]
    with pytest.raises(FileNotFoundError, match="rollout 9"):
        run_rollout(replay_args, 9, ds)


def test_eval_rollout_metrics(use_client, tmp_path):
    import json

    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps({"input": f"q{i}", "label": "A"}) + "\n" for i in range(3)))

    class PromptIdClient(FakeClient):
        async def generate(self, payload):
            # Eval prompts are fresh (no partial response): every one is scripted as prompt id 0.
            assert len(payload["input_ids"]) == 2  # "q{i}" is two Qwen3 tokens
            payload = dict(payload, input_ids=[0])
            return await super().generate(payload)

    client = use_client(PromptIdClient({0: [A, A, B]}, lengths={0: 4}))
    args = _args(
        eval_prompt_data=["toy", str(path)],
        n_samples_per_eval_prompt=2,
        eval_max_response_len=3,
        eval_temperature=0.5,
        input_key="input",
        label_key="label",
        hf_checkpoint=None,
        apply_chat_template=False,
    )
    # Prompts are tokenized with the real tokenizer: point hf_checkpoint at the fixture.
    from pathlib import Path

    args.hf_checkpoint = str(Path(__file__).parents[1] / "fixtures" / "qwen3-tokenizer")
    out = generate_rollout(args, 0, None, evaluation=True)
    assert isinstance(out, RolloutFnEvalOutput)
    d = out.data["toy"]
    assert len(d["samples"]) == 6 and d["truncated"] == [True] * 6  # 4 tokens wanted, budget 3
    # Answers cycle A, A, B per request: 4 of 6 end in A.
    assert sorted(d["rewards"]) == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert out.metrics["eval/toy"] == pytest.approx(4 / 6, abs=1e-12)
    assert out.metrics["eval/toy-truncated_ratio"] == 1.0
    assert all(p["sampling_params"]["temperature"] == 0.5 for p in client.payloads)
    assert rollout_mod.num_engines(args) == 1
    assert not any("pass@" in k for k in out.metrics)

    args.log_passrate = True
    out = generate_rollout(args, 1, None, evaluation=True)
    rewards = out.data["toy"]["rewards"]
    # pass@1 is the share of correct samples; pass@2 of a group of 2 is "either sample is correct".
    assert out.metrics["eval/toy-pass@1"] == pytest.approx(rewards.count(1.0) / 6, abs=1e-12)
    pairs = [rewards[i : i + 2] for i in (0, 2, 4)]
    assert out.metrics["eval/toy-pass@2"] == pytest.approx(sum(1.0 in p for p in pairs) / 3, abs=1e-12)


async def test_max_context_len_caps_new_tokens(use_client):
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    s = Sample(tokens=[0, 5, 5, 5])  # 4 prompt tokens
    s = await generate_mod.generate(_args(rollout_max_context_len=10), s, {"max_new_tokens": 8})
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == 6
    assert s.response_length == 6 and s.status is Status.TRUNCATED


@pytest.mark.parametrize(
    ("evaluation", "eval_ctx", "expected"),
    [(True, 7, 3), (False, 7, 6), (True, None, 6)],  # eval: --eval-max-context-len, else the rollout's 10
)
async def test_eval_max_context_len_caps_eval_samples(use_client, evaluation, eval_ctx, expected):
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    args = _args(rollout_max_context_len=10, eval_max_context_len=eval_ctx)
    s = await generate_mod.generate(args, Sample(tokens=[0, 5, 5, 5]), {"max_new_tokens": 8}, evaluation=evaluation)
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == expected
    assert s.response_length == expected


async def test_eval_rollout_passes_evaluation_to_the_default_generate(use_client):
    client = use_client(FakeClient({0: [A]}, lengths={0: 100}))
    state = rollout_mod.RolloutState.create(_args(), rollout_id=0, evaluation=True)
    args = _args(rollout_max_context_len=10, eval_max_context_len=6)
    await rollout_mod.generate_and_rm(args, Sample(tokens=[0, 5, 5, 5]), state, {"max_new_tokens": 8})
    assert client.payloads[0]["sampling_params"]["max_new_tokens"] == 2


def test_rollout_with_real_config(use_client, fixtures_dir, qwen3_tokenizer_dir):
    from slime_core.config import parse_args
    from slime_rollout.generation.rollout import create_data_source

    class AnyPromptClient(FakeClient):
        async def generate(self, payload):
            assert payload["input_ids"][0] != 0  # real Qwen3 ids of the question
            return await super().generate(dict(payload, input_ids=[0]))

    use_client(AnyPromptClient({0: [A, B]}, lengths={0: 3}))
    args = parse_args(
        [
            *("--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1"),
            *("--prompt-data", str(fixtures_dir / "gsm8k" / "test-50.jsonl"), "--input-key", "question"),
            *("--label-key", "answer", "--rollout-max-response-len", "8", "--hf-checkpoint", str(qwen3_tokenizer_dir)),
            *("--custom-rm-path", f"{__name__}.reward_is_a", "--rollout-engine-urls", "http://unused:1"),
        ]
    )
    ds = create_data_source(args)
    out = run_rollout(args, 0, ds)
    flat = [s for g in out.samples for s in g]
    assert [s.response for s in flat] == ["AAA", "BBB", "AAA", "BBB"]
    assert flat[0].label.endswith("#### 18")
    assert out.metrics["rollout/raw_reward"] == 0.5
    # GRPO: (r - mean) / (std + 1e-6) per group averages to 0.
    assert out.metrics["rollout/rewards"] == pytest.approx(0.0, abs=1e-9)


async def test_every_sample_has_its_own_seed_from_rollout_seed_rollout_id_prompt_and_index(use_client):
    import hashlib

    def expected(rollout_id, group_index, index):
        # Independent reference: BLAKE2b-64 of "train:<rollout_seed>:<rollout_id>:<prompt>:<index>", mod 2**31.
        key = f"train:100:{rollout_id}:{group_index}:{index}".encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % 2**31

    client = use_client(FakeClient({0: [A], 1: [A], 2: [A], 3: [A]}))
    args = _args(rollout_seed=100)
    source = ListDataSource(n=2)
    await generate_rollout_async(args, 0, source)
    await generate_rollout_async(args, 1, source)
    got = sorted((p["input_ids"][0], p["sampling_params"]["sampling_seed"]) for p in client.payloads)
    # ListDataSource: prompt p has group_index p and samples 2p, 2p + 1; prompts 0-1 in rollout 0, 2-3 in rollout 1.
    want = sorted((p, expected(p // 2, p, 2 * p + j)) for p in range(4) for j in range(2))
    assert got == want
    assert len({seed for _, seed in got}) == 8


def test_eval_config_yaml_resolution_and_rollout(use_client, tmp_path, qwen3_tokenizer_dir):
    import json

    from slime_rollout.generation.eval import eval_datasets

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"q": f"q{i}", "a": "AA"}) + "\n" for i in range(2)))
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        "eval:\n"
        "  defaults: {temperature: 0.3, max_response_len: 5, input_key: q}\n"
        "  datasets:\n"
        f"    - {{name: one, path: {data}, label_key: a, n_samples_per_eval_prompt: 3}}\n"
        f"    - {{name: two, path: {data}, label_key: a, rm_type: math, temperature: 0.9, top_k: 4}}\n"
    )
    args = _args(
        eval_config=str(cfg),
        eval_prompt_data=["three", str(data)],
        n_samples_per_eval_prompt=1,
        eval_temperature=None,
        input_key="q",
        label_key="a",
        hf_checkpoint=str(qwen3_tokenizer_dir),
    )
    one, two, three = eval_datasets(args)
    assert [d["name"] for d in (one, two, three)] == ["one", "two", "three"]
    assert one["sampling_params"]["temperature"] == 0.3 and one["sampling_params"]["max_new_tokens"] == 5
    assert two["sampling_params"]["temperature"] == 0.9 and two["sampling_params"]["top_k"] == 4
    assert three["sampling_params"]["temperature"] == 0.3  # YAML defaults apply to flag datasets too
    assert one["n_samples_per_eval_prompt"] == 3 and three["n_samples_per_eval_prompt"] == 1
    assert two["rm_type"] == "math" and one["rm_type"] is None

    class OneScript(FakeClient):
        async def generate(self, payload):
            return await super().generate(dict(payload, input_ids=[0]))

    use_client(OneScript({0: [A]}, lengths={0: 2}))
    args.custom_rm_path = None
    args.rm_type = "f1"
    out = generate_rollout(args, 0, None, evaluation=True)
    assert len(out.data["one"]["samples"]) == 6 and len(out.data["two"]["samples"]) == 2
    assert out.metrics["eval/one"] == 1.0  # --rm-type f1: f1("AA", "AA") = 1
    assert out.metrics["eval/two"] == 0.0  # the dataset rm_type (math) wins: no box in "AA"
    assert out.data["two"]["samples"][0].metadata["rm_type"] == "math"
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval:\n  datasets:\n    - {name: x, path: y, tempreature: 1}\n")
    with pytest.raises(ValueError, match=r"datasets\[0\]: unknown key\(s\) \['tempreature'\]"):
        eval_datasets(_args(eval_config=str(bad)))


async def test_group_prompt_is_templated_and_tokenized_once(use_client, qwen3_tokenizer_dir, monkeypatch):
    from slime_rollout.data.source import get_tokenizer

    tokenizer = get_tokenizer(str(qwen3_tokenizer_dir))
    calls = collections.Counter()
    real = tokenizer.apply_chat_template

    def counting(*a, **k):
        calls["template"] += 1
        return real(*a, **k)

    monkeypatch.setattr(tokenizer, "apply_chat_template", counting)
    seen = []

    class Recorder(FakeClient):
        async def generate(self, payload):
            seen.append(payload["input_ids"])
            return await super().generate(dict(payload, input_ids=[0]))

    use_client(Recorder({0: [A]}, lengths={0: 2}))
    args = _args(hf_checkpoint=str(qwen3_tokenizer_dir))
    messages = [{"role": "user", "content": "What is 2+3? Put the answer in \\boxed{}."}]
    group = [Sample(prompt=[dict(m) for m in messages], index=i, group_index=0) for i in range(4)]
    state = rollout_mod.RolloutState.create(args, rollout_id=0)
    await rollout_mod.generate_and_rm_group(args, group, state)
    expected = tokenizer.encode(real(messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    assert seen == [expected] * 4 and calls["template"] == 1
    assert all(s.tokens[: len(expected)] == expected and s.tokens is not group[0].tokens for s in group[1:])


# Issue 27 #12, fifth hostile pass: the dynamic-sampling filter, --rollout-sample-filter-path and
# --rollout-all-samples-process-path were called on the event loop with no deadline, so one that never returned
# froze the rollout with no word; a filter verdict's __bool__ is the plugin's code too. The slow plugins sleep 5 s,
# far past the 0.6 s deadline, so the old code fails these tests instead of hanging them.


class SlowTruth:
    def __bool__(self):
        time.sleep(5)
        return True


def slow_filter(args, samples):
    time.sleep(5)
    return True


def slow_verdict_filter(args, samples):
    return DynamicFilterOutput(keep=SlowTruth())


def truthy_verdict_filter(args, samples):
    return DynamicFilterOutput(keep=1, reason=None)


def slow_sample_filter(args, data):
    time.sleep(5)


def slow_all_samples_process(args, all_groups, data_source):
    time.sleep(5)


def _bounded(**kw):
    return _args(plugin_timeout_secs=0.6, slow_call_warning_secs=0.2, **kw)


@pytest.mark.parametrize(
    ("flag", "fn"),
    [
        ("dynamic_sampling_filter_path", "slow_filter"),
        ("dynamic_sampling_filter_path", "slow_verdict_filter"),
        ("rollout_sample_filter_path", "slow_sample_filter"),
        ("rollout_all_samples_process_path", "slow_all_samples_process"),
    ],
)
async def test_a_rollout_plugin_that_never_returns_fails_at_its_deadline_naming_it(use_client, flag, fn):
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    path = f"{__name__}.{fn}"
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded) as e:  # was: the loop blocked 5 s, then the rollout went on
        await generate_rollout_async(_bounded(**{flag: path}), 0, ListDataSource(n=2))
    assert time.monotonic() - start < 4.0
    message = str(e.value)
    assert message.startswith(f"--{flag.replace('_', '-')} {path} ") and "(--plugin-timeout-secs)" in message


async def test_a_filter_verdict_is_read_into_a_plain_bool(use_client):
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    path = f"{__name__}.truthy_verdict_filter"
    out, _ = await generate_rollout_async(_bounded(dynamic_sampling_filter_path=path), 0, ListDataSource(n=2))
    assert len(out.samples) == 2


class SlowFloat(float):
    def __float__(self):
        time.sleep(5)
        return 1.0


async def generate_with_slow_reward(args, sample, sampling_params):
    sample.response, sample.status, sample.reward = "x", Status.COMPLETED, SlowFloat(1.0)
    return sample


async def test_a_reward_set_by_a_generate_function_is_read_under_the_reward_deadline(use_client):
    from slime_rollout.rewards.checks import RewardFunctionError

    use_client(FakeClient({}))
    path = f"{__name__}.generate_with_slow_reward"
    args = _args(custom_generate_function_path=path, rollout_batch_size=1, rm_timeout_secs=0.6)
    start = time.monotonic()
    with pytest.raises(RewardFunctionError) as e:  # was: the metrics' float() froze the loop for 5 s
        await generate_rollout_async(args, 0, ListDataSource(n=2))
    assert time.monotonic() - start < 4.0
    assert str(e.value).startswith(f"reading the reward that generate function {path} (or a sample hook) set on")
    assert "did not finish within 0.6 s (--rm-timeout-secs)" in str(e.value)


class SlowDataSource(ListDataSource):
    def get_samples(self, num_groups):
        time.sleep(5)
        return super().get_samples(num_groups)


async def test_a_data_source_that_never_returns_fails_at_the_plugin_deadline(use_client):
    # Fifth hostile pass on issue 27 (item 12): get_samples (a --data-source-path class, a --buffer-filter-path)
    # ran on the event loop with no deadline.
    use_client(FakeClient({0: [A, B], 1: [A, B]}))
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"^SlowDataSource\.get_samples\(2\) \(rollout 0\) did not finish within "
                       r"0\.6 s \(--plugin-timeout-secs\)"):  # fmt: skip
        await generate_rollout_async(_bounded(), 0, SlowDataSource(n=2))
    assert time.monotonic() - start < 4.0


class FlatSource(ListDataSource):
    def get_samples(self, num_groups):
        return [s for group in super().get_samples(num_groups) for s in group]  # samples, not groups


class HangingSource(ListDataSource):
    def get_samples(self, num_groups):
        time.sleep(5)
        return super().get_samples(num_groups)


async def test_a_data_source_returning_samples_or_wrong_groups_is_named_before_generating(use_client):
    # Issue 27, item 12: a flat list failed as "'Sample' object is not iterable" inside a generate task; a group
    # of another size was generated first and refused after.
    client = use_client(FakeClient({}))
    with pytest.raises(TypeError, match=r"^FlatSource\.get_samples\(1\) \(rollout 0\): group 0 is Sample .*not a list"):
        await generate_rollout_async(_args(rollout_batch_size=1), 0, FlatSource(n=2))
    with pytest.raises(ValueError, match=r"ListDataSource\.get_samples\(1\) \(rollout 0\): group 0 has 3 samples, "
                       r"expected 2 \(--n-samples-per-prompt\)"):  # fmt: skip
        await generate_rollout_async(_args(rollout_batch_size=1), 0, ListDataSource(n=3))
    assert client.payloads == []


async def test_the_fully_async_producer_bounds_a_hanging_data_source(use_client):
    from slime_rollout.generation.fully_async_producer import FullyAsyncProducer

    # It called get_samples on the event loop: a data source that hung froze the producer with no word.
    use_client(FakeClient({}))
    producer = FullyAsyncProducer(_bounded(rollout_batch_size=1), HangingSource(n=2), restored=[], version=0)
    start = time.monotonic()
    producer.start()
    with pytest.raises(RuntimeError, match=r"HangingSource\.get_samples\(1\) \(fully-async producer\) did not finish "
                       r"within 0\.6 s \(--plugin-timeout-secs\)") as e:  # fmt: skip
        await producer.take(0, 1, None)
    assert isinstance(e.value.__cause__, DeadlineExceeded)
    assert time.monotonic() - start < 4.0
    await producer.stop()


# ---- an engine that dies mid-rollout (fault injection) ---------------------------------------------------------------

from slime_rollout.engines.transport import EngineError  # noqa: E402


class DyingEngineClient(FakeClient):
    """Prompt 1's requests fail as a killed engine's do; the others hang until cancelled; the abort cannot reach it."""

    def __init__(self):
        super().__init__({0: [A], 1: [A]})
        self.cancelled = 0

    async def generate(self, payload):
        if payload["input_ids"][0] == 1:
            await asyncio.sleep(0)
            raise EngineError("http://e:1", "/generate", "unreachable after 9 attempts: ClientConnectorError",
                              unreachable=True)  # fmt: skip
        try:
            await asyncio.Event().wait()  # on the engine that died: no answer ever comes
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def abort_all(self):
        self.abort_calls += 1
        raise EngineError("http://e:1", "/abort_request", "unreachable after 9 attempts", unreachable=True)


async def test_an_engine_dying_mid_rollout_raises_its_own_error_and_leaves_nothing_running(use_client, caplog):
    client = use_client(DyingEngineClient())
    with pytest.raises(EngineError, match=r"^engine http://e:1/generate failed: unreachable"):  # was: the abort's
        await generate_rollout_async(_args(), 0, ListDataSource(n=2))
    # The failed abort cancelled the requests still waiting on the dead engine (was: they ran on, never drained).
    assert client.abort_calls == 1 and client.cancelled == 2
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    warnings = [r.getMessage() for r in caplog.records if "clean-up" in r.getMessage()]
    assert warnings == ["rollout 0: the clean-up after EngineError failed too: engine http://e:1/abort_request "
                        "failed: unreachable after 9 attempts"]  # fmt: skip


def generate_that_raises(args, sample, sampling_params):
    raise KeyError("tool_result")  # a bug in the user's generate function


async def test_a_plugin_error_keeps_its_type_and_names_the_plugin_and_sample(use_client, caplog):
    use_client(FakeClient({0: [A], 1: [A]}))
    args = _args(custom_generate_function_path=f"{__name__}.generate_that_raises")
    with pytest.raises(KeyError) as e:  # was: a bare KeyError('tool_result'), no word of which plugin or sample
        await generate_rollout_async(args, 0, ListDataSource(n=2))
    (note,) = e.value.__notes__
    assert re.fullmatch(rf"\(raised by generate function {__name__}\.generate_that_raises on sample \d\)", note)
    # The other groups failed alike; their errors were read, not left for asyncio to log at garbage collection.
    del e  # its traceback holds the rollout's frame, and with it the failed tasks
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
