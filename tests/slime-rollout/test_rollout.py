"""The rollout loop (`slime_rollout.generation.rollout`) against a scripted engine client (`_rollout_fakes.py`)."""

import asyncio
import collections
import dataclasses

import pytest
import torch
from slime_rollout_fakes import FakeClient, ListDataSource
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Sample, Status
from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime_rollout.generation import generate as generate_mod
from slime_rollout.generation import rollout as rollout_mod
from slime_rollout.generation.rollout import generate_rollout, generate_rollout_async, run_rollout

A, B = ord("A"), ord("B")


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
    # The engine's log-probs under the original's key, mean of the per-sample means: (-0.2 - 0.2 - 0.15 - 0.15) / 4;
    # `rollout/log_probs` is the trainer's, as in the original.
    assert m["rollout/rollout_log_probs"] == pytest.approx(-0.175, abs=1e-12) and "rollout/log_probs" not in m
    assert m["rollout/repetition_frac"] == 0.0 and m["rollout/response_len/median"] == 2.5
    assert m["perf/longest_effective_sample_tokens_per_sec"] > 0
    assert m["rollout/zero_std/count_1.0"] == 1.0
    assert client.in_flight == 0
    # Goodput: all 3 + 3 + 2 + 2 model tokens were accepted, nothing thrown away.
    assert m["goodput/tokens_generated"] == m["goodput/tokens_accepted"] == 10.0
    assert m["goodput/tokens_filtered"] == m["goodput/tokens_aborted"] == m["goodput/tokens_surplus"] == 0.0
    assert m["perf/reward_time"] >= 0.0
    assert m["rollout/num_reward_undecided"] == 0.0  # every grading had a verdict


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
    with caplog.at_level("INFO", logger="slime_rollout.generation"):
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
    # The original's per-sample statistics of the set (3 tokens each: cut at the budget), with the prompt groups
    # whose two rewards are equal counted by reward (zero_std).
    groups = {}
    for s, r in zip(d["samples"], d["rewards"], strict=True):
        groups.setdefault(s.group_index, []).append(r)
    equal = [g[0] for g in groups.values() if g[0] == g[1]]
    assert {k: v for k, v in out.metrics.items() if k.startswith("eval/toy/")} == {
        **{f"eval/toy/response_len/{stat}": 3.0 for stat in ("mean", "median", "max", "min")},
        "eval/toy/repetition_frac": 0.0,
        "eval/toy/truncated_ratio": 1.0,
        **{f"eval/toy/zero_std/count_{r}": float(equal.count(r)) for r in set(equal)},
    }
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
            *("--custom-rm-path", "slime_rollout_fakes.reward_is_a", "--rollout-engine-urls", "http://unused:1"),
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


def test_message_prompts_are_rendered_with_their_tools_in_the_files_key_order(qwen3_tokenizer_dir):
    # The default generate function renders a prompt of messages (no --apply-chat-template) through a cache keyed by
    # the prompt's and tools' JSON, written with sort_keys=True and read back from it: every tool schema reached the
    # template with its keys sorted ('{"function": ..., "type": "function"}', properties alphabetical), not as the
    # data file and the length filter (rows_to_samples) have them.
    from slime_rollout.data.source import encode_prompt, get_tokenizer

    tools = [{"type": "function", "function": {"name": "lookup", "description": "Find a word.", "parameters": {
        "type": "object", "properties": {"word": {"type": "string"}, "lang": {"type": "string"}},
        "required": ["word"]}}}]  # fmt: skip
    prompt = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Define 'zebra'."}]
    args = _args(hf_checkpoint=str(qwen3_tokenizer_dir))
    sample = Sample(prompt=prompt, metadata={"tools": tools})
    tok = get_tokenizer(str(qwen3_tokenizer_dir))
    expected = encode_prompt(tok, prompt, tools)
    assert generate_mod._prompt_ids(args, sample) == expected
    assert '{"type": "function", "function": {"name": "lookup"' in tok.decode(expected)
