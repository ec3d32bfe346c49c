"""Multi-turn generate: token-exact masks and log-probs, observation wrapping, budget, abort, consistency.

A scripted engine stands in for SGLang: it returns, for each call, the real Qwen3 tokenization of a
scripted model turn (cut at `max_new_tokens`) with log-probs -0.01, -0.02, ... The expected token
streams are built independently in the tests from the tokenizer and hand-written observation text.
"""

import json

import pytest
from slime_multi_turn_fakes import (
    FINAL_TURN,
    QWEN_OBS_42,
    TOOL_TURN,
    ScriptedEngine,
    calc_sample,
    enc,
    install,
    make_args,
    params,
    prompt_ids,
)

from slime_core.config import PluginArgs
from slime_core.sample import Sample, Status
from slime_envs.calculator import CalculatorEnv
from slime_rollout.data.source import get_tokenizer
from slime_rollout.generation import multi_turn


async def test_tool_episode_is_token_exact(tok, qwen3_tokenizer_dir, monkeypatch):
    engine = ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN])
    install(monkeypatch, engine)
    sample = calc_sample()
    p = prompt_ids(tok, sample)
    t1, obs, t2 = enc(tok, TOOL_TURN), enc(tok, QWEN_OBS_42), enc(tok, FINAL_TURN)

    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), sample, params())

    assert out.tokens == p + t1 + obs + t2
    assert out.response_length == len(t1) + len(obs) + len(t2)
    assert out.loss_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    lp = lambda n: [-(k + 1) / 100 for k in range(n)]  # noqa: E731
    assert out.rollout_log_probs == pytest.approx(lp(len(t1)) + [0.0] * len(obs) + lp(len(t2)), abs=0)
    # The second call continues exactly from prompt + turn 1 + observation, with the shared budget.
    assert engine.payloads[1]["input_ids"] == p + t1 + obs
    assert engine.payloads[1]["sampling_params"]["max_new_tokens"] == 512 - len(t1) - len(obs)
    assert engine.payloads[0]["sampling_params"]["no_stop_trim"] is True
    assert out.status is Status.COMPLETED
    assert out.metadata["num_turns"] == 2
    assert out.weight_versions == ["3", "3"]
    assert out.response == TOOL_TURN + QWEN_OBS_42 + FINAL_TURN
    assert out.reward is None  # calculator env gives no reward; left to --rm-type / --custom-rm-path

    messages = sample.prompt + [
        {"role": "assistant", "content": TOOL_TURN.removesuffix("<|im_end|>")},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": FINAL_TURN.removesuffix("<|im_end|>")},
    ]
    report = multi_turn.check_chat_template_consistency(tok, out, messages, tools=CalculatorEnv.tool_specs)
    assert report.consistent, report.message
    assert report.num_template_tokens == len(out.tokens) + 1  # the template's trailing "\n"


async def test_consistency_detects_template_rewrite_and_retokenization(tok, qwen3_tokenizer_dir, monkeypatch):
    final_no_think = "The answer is 42.<|im_end|>"
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, final_no_think]))
    sample = calc_sample()
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), sample, params())
    messages = sample.prompt + [
        {"role": "assistant", "content": TOOL_TURN.removesuffix("<|im_end|>")},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "The answer is 42."},
    ]
    report = multi_turn.check_chat_template_consistency(tok, out, messages, tools=CalculatorEnv.tool_specs)
    # Qwen3's template inserts an empty <think></think> block into the last assistant turn.
    turn2_start = len(prompt_ids(tok, sample)) + len(enc(tok, TOOL_TURN)) + len(enc(tok, QWEN_OBS_42))
    assert not report.consistent
    assert report.first_mismatch == turn2_start
    assert "<think>" in report.message

    # The engine sampled "answer" as single characters: same text, different ids than re-tokenization.
    chars = [enc(tok, c)[0] for c in "The answer is 42."] + enc(tok, "<|im_end|>")
    assert enc(tok, "The answer is 42.") != chars[:-1]
    final = "<think>\nok\n</think>\n\n"
    override = enc(tok, final) + chars
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, ""], token_overrides={1: override}))
    sample = calc_sample()
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), sample, params())
    messages[-1] = {"role": "assistant", "content": final + "The answer is 42."}
    report = multi_turn.check_chat_template_consistency(tok, out, messages, tools=CalculatorEnv.tool_specs)
    assert not report.consistent
    assert report.first_mismatch == turn2_start + len(enc(tok, final))  # "T" (sampled) vs "The" (template)


async def test_stop_string_turn_gets_end_of_turn_in_observation(tok, qwen3_tokenizer_dir, monkeypatch):
    cut_turn = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    install(monkeypatch, ScriptedEngine(tok, [cut_turn, FINAL_TURN]))
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    obs = enc(tok, "<|im_end|>" + QWEN_OBS_42)
    start = out.prompt_length + len(enc(tok, cut_turn))
    assert out.tokens[start : start + len(obs)] == obs
    assert out.loss_mask[len(enc(tok, cut_turn)) : len(enc(tok, cut_turn)) + len(obs)] == [0] * len(obs)


async def test_malformed_call_becomes_observation(tok, qwen3_tokenizer_dir, monkeypatch):
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": }\n</tool_call><|im_end|>'
    engine = ScriptedEngine(tok, [bad, FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    assert out.status is Status.COMPLETED
    assert len(engine.payloads) == 2
    observation = tok.decode(out.response_tokens[len(enc(tok, bad)) :][: -len(enc(tok, FINAL_TURN))])
    assert "Error: invalid JSON in <tool_call>" in observation
    assert observation.startswith("\n<|im_start|>user\n<tool_response>\n")


async def test_budget_shared_across_turns_truncates(tok, qwen3_tokenizer_dir, monkeypatch):
    t1, obs = enc(tok, TOOL_TURN), enc(tok, QWEN_OBS_42)
    budget = len(t1) + len(obs) + 5
    engine = ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params(budget))
    assert engine.payloads[1]["sampling_params"]["max_new_tokens"] == 5
    assert out.response_length == budget
    assert out.status is Status.TRUNCATED
    assert out.loss_mask[-5:] == [1] * 5


async def test_observation_cut_at_budget(tok, qwen3_tokenizer_dir, monkeypatch):
    t1 = enc(tok, TOOL_TURN)
    engine = ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params(len(t1) + 3))
    assert len(engine.payloads) == 1
    assert out.response_length == len(t1) + 3
    assert out.loss_mask == [1] * len(t1) + [0] * 3
    assert out.response_tokens[len(t1) :] == enc(tok, QWEN_OBS_42)[:3]
    assert out.status is Status.TRUNCATED


async def test_abort_marks_sample_aborted(tok, qwen3_tokenizer_dir, monkeypatch):
    engine = ScriptedEngine(tok, ["<think>\npartial"], finish_types=["abort"])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    assert out.status is Status.ABORTED
    assert out.response_tokens == enc(tok, "<think>\npartial")
    assert out.metadata["env_info"] == []  # the env never saw the partial turn
    assert len(engine.payloads) == 1


async def test_max_turns_ends_on_model_tokens(tok, qwen3_tokenizer_dir, monkeypatch):
    engine = ScriptedEngine(tok, [TOOL_TURN, TOOL_TURN, TOOL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir, max_turns=2), calc_sample(), params())
    assert len(engine.payloads) == 2
    t1, obs = enc(tok, TOOL_TURN), enc(tok, QWEN_OBS_42)
    assert out.loss_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t1)
    assert out.metadata["num_turns"] == 2


async def test_search_tags_episode(tok, qwen3_tokenizer_dir, monkeypatch, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [
        {"contents": '"Paris"\nParis is the capital and largest city of France.'},
        {"contents": '"Berlin"\nBerlin is the capital of Germany.'},
        {"contents": '"Rome"\nRome is the capital of Italy.'},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    turn1 = "<think>I need to look this up.</think>\n<search> capital of France </search>"
    turn2 = "<answer> Paris </answer>"
    engine = ScriptedEngine(tok, [turn1, turn2])
    install(monkeypatch, engine)
    meta = {"env": "search", "env_kwargs": {"corpus_path": str(corpus), "topk": 1}}
    sample = Sample(prompt="Question: What is the capital of France?\n", label="Paris", metadata=meta, index=3)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), sample, params())

    obs = "\n\n<information>Doc 1(Title: Paris) Paris is the capital and largest city of France.</information>\n\n"
    p, t1, o, t2 = enc(tok, sample.prompt), enc(tok, turn1), enc(tok, obs), enc(tok, turn2)
    assert out.tokens == p + t1 + o + t2
    assert out.loss_mask == [1] * len(t1) + [0] * len(o) + [1] * len(t2)
    assert engine.payloads[0]["sampling_params"]["stop"] == ["</search>", "</answer>"]
    assert out.metadata["env_reward"] == 1.0
    assert out.reward == 1.0
    assert out.status is Status.COMPLETED

    # With a reward function configured the env reward is only recorded.
    install(monkeypatch, ScriptedEngine(tok, [turn1, turn2]))
    sample = Sample(prompt="Q?\n", label="Paris", metadata=dict(meta), index=4)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir, rm_type="f1"), sample, params())
    assert out.reward is None and out.metadata["env_reward"] == 1.0
    assert await multi_turn.env_reward(None, out) == 1.0


async def test_search_tags_prompt_offers_no_tool_call_function(tok, qwen3_tokenizer_dir, monkeypatch, tmp_path):
    # The tags format reads <search>...</search>, but the env kept the qwen format's `search` function spec: a
    # chat-message prompt was rendered with Qwen3's "# Tools ... <tool_call>" section, teaching the model a call
    # format that this env answers with "invalid action".
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"contents": '"Paris"\nParis is the capital of France.'}) + "\n")
    engine = ScriptedEngine(tok, ["<answer> Paris </answer>"])
    install(monkeypatch, engine)
    messages = [{"role": "user", "content": "What is the capital of France? Use <search>."}]
    meta = {"env": "search", "env_kwargs": {"corpus_path": str(corpus)}}
    out = await multi_turn.generate(
        make_args(qwen3_tokenizer_dir), Sample(prompt=messages, label="Paris", metadata=meta, index=0), params()
    )
    expected = enc(tok, tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    assert engine.payloads[0]["input_ids"] == expected
    assert out.metadata[CONVERSATION_KEY]["tools"] is None and out.reward == 1.0


async def test_env_from_args_and_errors(tok, qwen3_tokenizer_dir, monkeypatch):
    install(monkeypatch, ScriptedEngine(tok, [FINAL_TURN]))
    sample = Sample(prompt=[{"role": "user", "content": "hi"}], index=0)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir, env_path="calculator"), sample, params())
    assert out.status is Status.COMPLETED and out.metadata["num_turns"] == 1

    with pytest.raises(ValueError, match="--env-path"):
        await multi_turn.generate(make_args(qwen3_tokenizer_dir), Sample(prompt="x", index=1), params())
    with pytest.raises(KeyError, match="unknown env 'nope'"):
        await multi_turn.generate(make_args(qwen3_tokenizer_dir, env_path="nope"), Sample(prompt="x"), params())
    bad = Sample(prompt="x", metadata={"env": "calculator", "env_kwargs": "{not json"}, index=2)
    with pytest.raises(ValueError, match="env_kwargs"):
        await multi_turn.generate(make_args(qwen3_tokenizer_dir), bad, params())


def test_render_tool_observation_groups_tool_messages(tok):
    text = multi_turn.render_tool_observation(tok, ["1", "2"], model_turn="...</tool_call>")
    assert text == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n"
        "<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


# ---- end to end: the example configs against the CPU reference engine --------------------------------

LOGPROB_ATOL = 2e-3  # fp32 CPU, batched engine forward vs one unbatched HF forward


def _example_args(name, engine, model_dir, tmp_path):
    from slime_core.config import parse_args

    args = parse_args(
        [
            "--config",
            f"examples/{name}/cpu.yaml",
            "--hf-checkpoint",
            str(model_dir),
            "--rollout-engine-urls",
            *engine.urls,
            "--save",
            str(tmp_path / "save"),
        ]
    )
    # A random model almost never closes a tag, so every turn would run to the budget. Stopping on a
    # third of the vocabulary ends turns early and exercises observations and continuations.
    return PluginArgs.from_config(args.model_copy(update={"rollout_stop_token_ids": list(range(0, 151643, 3))}))


def _check_sample(sample, hf, tok):
    import torch

    assert sample.status in (Status.COMPLETED, Status.TRUNCATED)
    sample.validate()
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
    assert sample.loss_mask[0] == 1
    # Only an observation cut by the exhausted budget may end the response.
    assert sample.loss_mask[-1] == 1 or sample.status is Status.TRUNCATED
    assert all(lp == 0.0 for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if m == 0)
    ids = torch.tensor([sample.tokens])
    with torch.no_grad():
        log_probs = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
    p = sample.prompt_length
    expected = log_probs[p - 1 : len(sample.tokens) - 1].gather(-1, ids[0, p:, None])[:, 0]
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    torch.testing.assert_close(torch.tensor(sample.rollout_log_probs)[mask], expected[mask], atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("example", ["search-r1", "retool"])
def test_example_config_runs_one_rollout(example, reference_engine, tiny_qwen3_dir, tmp_path, monkeypatch):
    import pathlib

    import torch
    from transformers import AutoModelForCausalLM

    from slime_rollout.engines.client import reset_client_cache
    from slime_rollout.generation.rollout import create_data_source, generate_rollout

    monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[2])  # example paths are relative to the repo
    reset_client_cache()
    args = _example_args(example, reference_engine, tiny_qwen3_dir, tmp_path)
    output = generate_rollout(args, 0, create_data_source(args))
    samples = [s for group in output.samples for s in group]
    assert len(samples) == args.rollout_batch_size * args.n_samples_per_prompt

    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    tok = get_tokenizer(str(tiny_qwen3_dir))
    for sample in samples:
        _check_sample(sample, hf, tok)
        assert isinstance(sample.reward, float)
        assert 1 <= sample.metadata["num_turns"] <= args.max_turns
    if example == "search-r1":
        multi = [s for s in samples if s.metadata["num_turns"] > 1]
        assert multi, "no sample took a second turn"
        for s in multi:
            masked = [t for t, m in zip(s.response_tokens, s.loss_mask, strict=True) if m == 0]
            assert "Invalid action" in tok.decode(masked)
            assert s.reward in (0.0, 0.2, 1.0)


class RecordingEnv:
    """Records what reset() received; ends the episode on the first turn."""

    seen = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def reset(self, *, prompt, label, metadata):
        RecordingEnv.seen.append({"prompt": prompt, "label": label, "metadata": dict(metadata), "kwargs": self.kwargs})

    async def step(self, model_turn):
        from slime_core.protocols import EnvStep

        return EnvStep(observation="", done=True, reward=0.5)


async def test_dataset_metadata_and_env_kwargs_reach_env(tok, qwen3_tokenizer_dir, monkeypatch):
    install(monkeypatch, ScriptedEngine(tok, [FINAL_TURN]))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    meta = {"tools": tools, "source": "unit", "env_kwargs": {"b": 2, "c": 3}}
    sample = Sample(prompt=[{"role": "user", "content": "hi"}], label="L", metadata=meta, index=0)
    args = make_args(
        qwen3_tokenizer_dir, env_path=f"{__name__}:RecordingEnv", custom_config={"env_kwargs": {"a": 1, "b": 1}}
    )
    out = await multi_turn.generate(args, sample, params())
    seen = RecordingEnv.seen[-1]
    assert seen["label"] == "L" and seen["metadata"]["tools"] == tools and seen["metadata"]["source"] == "unit"
    assert seen["kwargs"] == {"a": 1, "b": 2, "c": 3}  # the sample's env_kwargs win over the config's
    # The tools from --tool-key are rendered into the prompt by the chat template.
    expected = tok.apply_chat_template(sample.prompt, tools=tools, tokenize=False, add_generation_prompt=True)
    assert out.tokens[: out.prompt_length] == enc(tok, expected)
    assert out.reward == 0.5 and out.metadata["env_reward"] == 0.5


async def test_partial_episode_restarts_from_prompt(tok, qwen3_tokenizer_dir, monkeypatch):
    install(monkeypatch, ScriptedEngine(tok, ["<think>\npartial"], finish_types=["abort"]))
    sample = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    assert sample.status is Status.ABORTED
    prompt = list(sample.tokens[: sample.prompt_length])
    engine = ScriptedEngine(tok, [FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), sample, params())
    assert engine.payloads[0]["input_ids"] == prompt
    assert out.tokens == prompt + enc(tok, FINAL_TURN)
    assert out.loss_mask == [1] * len(enc(tok, FINAL_TURN)) and out.weight_versions == ["3"]
    assert out.status is Status.COMPLETED and out.response == FINAL_TURN


class BrokenEnv:
    def reset(self, *, prompt, label, metadata):
        pass

    async def step(self, model_turn):
        raise RuntimeError("env bug")


async def test_env_exception_fails_only_the_sample(tok, qwen3_tokenizer_dir, monkeypatch):
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN]))
    args = make_args(qwen3_tokenizer_dir, env_path=f"{__name__}:BrokenEnv")
    out = await multi_turn.generate(args, Sample(prompt="x", index=0), params())
    assert out.status is Status.FAILED and out.remove_sample
    assert out.metadata["env_error"] == "RuntimeError: env bug"
    assert out.loss_mask == [1] * len(enc(tok, TOOL_TURN))


# ---- chat-template conformance in the loop (slime_rollout.generation.template_check) ---------------------------------

from slime_core.protocols import EnvStep  # noqa: E402
from slime_rollout.generation.template_check import CONVERSATION_KEY, check_sample, check_samples  # noqa: E402


async def test_episode_records_its_conversation_and_conforms(tok, qwen3_tokenizer_dir, monkeypatch):
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN]))
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    record = out.metadata[CONVERSATION_KEY]
    assert record["tools"] == CalculatorEnv.tool_specs
    assert [(s["role"], s["content"], s.get("tool_responses")) for s in record["segments"]] == [
        ("assistant", TOOL_TURN, None),
        ("observation", QWEN_OBS_42, ["42"]),
        ("assistant", FINAL_TURN, None),
    ]
    report = check_sample(tok, out)
    assert report.consistent and report.message.startswith("chat template:"), report.message


async def test_recorded_conversation_finds_the_template_rewrite(tok, qwen3_tokenizer_dir, monkeypatch):
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, "The answer is 42.<|im_end|>"]))
    sample = calc_sample()
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), sample, params())
    report = check_sample(tok, out)
    # Qwen3's template inserts an empty <think></think> into the last assistant turn: found at its first token.
    turn2_start = len(prompt_ids(tok, sample)) + len(enc(tok, TOOL_TURN)) + len(enc(tok, QWEN_OBS_42))
    assert not report.consistent and report.first_mismatch == turn2_start and "<think>" in report.message
    metrics = check_samples(tok, [out, Sample(prompt="single turn", tokens=[1, 2])], limit=8)
    assert metrics == {
        "rollout/chat_template/checked": 1.0,
        "rollout/chat_template/mismatched": 1.0,
        "rollout/chat_template/skipped": 0.0,
        "rollout/chat_template/first_mismatch_token": float(turn2_start),
    }
    assert check_samples(tok, [Sample(prompt="single turn", tokens=[1, 2])], limit=8) == {}  # not multi-turn


async def test_truncated_last_turn_is_a_prefix_and_cut_observation_is_skipped(tok, qwen3_tokenizer_dir, monkeypatch):
    t1, obs = enc(tok, TOOL_TURN), enc(tok, QWEN_OBS_42)
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN]))
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params(len(t1) + len(obs) + 5))
    assert out.status is Status.TRUNCATED
    assert check_sample(tok, out).consistent  # the stream stops where the limit cut the model's last turn
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN]))
    cut = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params(len(t1) + 3))
    assert check_sample(tok, cut) is None  # the observation itself was cut: nothing renders like that
    assert check_samples(tok, [cut], limit=8)["rollout/chat_template/skipped"] == 1.0


class TagEnv:
    """A tag-style environment (Search-R1 like): the observation text is appended verbatim."""

    stop = ["</calc>"]

    def reset(self, *, prompt, label, metadata):
        self.turns = 0

    async def step(self, model_turn):
        self.turns += 1
        return EnvStep(observation=" <result>42</result> ", done=self.turns > 1)


async def test_text_prompt_checks_retokenization_drift(tok, qwen3_tokenizer_dir, monkeypatch):
    turn1, turn2 = "<calc>6*7</calc>", " The answer is 42."
    install(monkeypatch, ScriptedEngine(tok, [turn1, turn2]))
    args = make_args(qwen3_tokenizer_dir, env_path=f"{__name__}:TagEnv")
    # (A prompt ending "?" would already differ: "?<" is one token when the whole text is re-tokenized.)
    out = await multi_turn.generate(args, Sample(prompt="Q: 6*7?\n", index=0), params())
    report = check_sample(tok, out)
    assert report.consistent and report.message.startswith("concatenated text:"), report.message
    # The engine sampled " answer" character by character: same text, other ids than re-tokenization.
    chars = [enc(tok, c)[0] for c in turn2]
    install(monkeypatch, ScriptedEngine(tok, [turn1, ""], token_overrides={1: chars}))
    out = await multi_turn.generate(args, Sample(prompt="Q: 6*7?\n", index=0), params())
    report = check_sample(tok, out)
    turn2_start = len(enc(tok, "Q: 6*7?\n")) + len(enc(tok, turn1)) + len(enc(tok, " <result>42</result> "))
    assert not report.consistent and report.first_mismatch == turn2_start, report.message  # " ", "T" vs " The"


async def test_env_options_named_like_deadline_arguments_reach_the_env(tok, qwen3_tokenizer_dir, monkeypatch):
    install(monkeypatch, ScriptedEngine(tok, [FINAL_TURN]))
    sample = Sample(prompt="x", metadata={"env_kwargs": {"what": "w", "flag": "f"}}, index=0)
    args = make_args(qwen3_tokenizer_dir, env_path=f"{__name__}:RecordingEnv")
    await multi_turn.generate(args, sample, params())
    assert RecordingEnv.seen[-1]["kwargs"] == {"what": "w", "flag": "f"}


async def test_template_kwargs_shape_every_turns_header(tok, qwen3_tokenizer_dir, monkeypatch):
    # --apply-chat-template --apply-chat-template-kwargs '{"enable_thinking": false}': the data source rendered the
    # prompt with Qwen3's empty think block after the assistant header, but the observation's header for turn 2 was
    # rendered without the kwargs: the model was prompted in thinking mode from its second turn on.
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
    engine = ScriptedEngine(tok, [call, "42<|im_end|>"])
    install(monkeypatch, engine)
    messages = [{"role": "user", "content": "What is 6*7?"}]
    kwargs = {"enable_thinking": False}
    prompt = tok.apply_chat_template(
        messages, tools=CalculatorEnv.tool_specs, tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    sample = Sample(prompt=prompt, metadata={"env": "calculator"}, index=0)
    args = make_args(qwen3_tokenizer_dir, apply_chat_template=True, apply_chat_template_kwargs=kwargs)
    out = await multi_turn.generate(args, sample, params())
    obs = enc(tok, QWEN_OBS_42 + "<think>\n\n</think>\n\n")  # the template's header for the next turn, as in turn 1
    assert engine.payloads[1]["input_ids"] == enc(tok, prompt) + enc(tok, call) + obs
    assert out.loss_mask == [1] * len(enc(tok, call)) + [0] * len(obs) + [1] * len(enc(tok, "42<|im_end|>"))


async def test_a_single_stop_string_stays_one_stop(tok, qwen3_tokenizer_dir, monkeypatch, tmp_path):
    # An eval dataset's `stop: "</answer>"` (a str, as SGLang takes it) became one stop string per character: every
    # turn of the episode ended at its first "<", "/" or "a".
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"contents": '"Paris"\nParis is the capital of France.'}) + "\n")
    engine = ScriptedEngine(tok, ["<answer> Paris </answer>"])
    install(monkeypatch, engine)
    meta = {"env": "search", "env_kwargs": {"corpus_path": str(corpus), "topk": 1}}
    sample = Sample(prompt="Question: What is the capital of France?\n", label="Paris", metadata=meta, index=0)
    await multi_turn.generate(make_args(qwen3_tokenizer_dir), sample, dict(params(), stop="</answer>"))
    assert engine.payloads[0]["sampling_params"]["stop"] == ["</answer>", "</search>"]


async def test_an_episode_cut_at_max_turns_is_marked_and_logged(tok, qwen3_tokenizer_dir, monkeypatch, caplog):
    # --max-turns defaults to 1: an env's episode ran one turn, its tool call ran and its result was dropped, and
    # nothing said so (a port of search-r1/retool that set --env-path alone trained single-turn).
    monkeypatch.setattr(multi_turn, "_num_cut_at_max_turns", 0)  # the process's count (logged at powers of two)
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN]))
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir, max_turns=1), calc_sample(), params())
    assert out.metadata["num_turns"] == 1 and out.metadata["max_turns_reached"] is True
    assert out.loss_mask == [1] * len(enc(tok, TOOL_TURN))  # no observation after the last turn
    assert "1 multi-turn episode(s) so far reached --max-turns 1 while the env still waited" in caplog.text
    caplog.clear()
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN]))
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir, max_turns=2), calc_sample(), params())
    assert out.metadata["num_turns"] == 2 and "max_turns_reached" not in out.metadata  # the answer ended it
    assert "reached --max-turns" not in caplog.text


async def test_env_tools_that_a_text_prompt_cannot_show_are_logged(tok, qwen3_tokenizer_dir, monkeypatch, caplog):
    # --apply-chat-template renders a text prompt with the row's --tool-key tools only: with no tools column the
    # calculator env's spec never reached the model, and nothing said so.
    monkeypatch.setattr(multi_turn, "_num_text_prompts_without_env_tools", 0)
    install(monkeypatch, ScriptedEngine(tok, [FINAL_TURN]))
    text = Sample(prompt="What is 6*7?", metadata={"env": "calculator"}, index=5)
    await multi_turn.generate(make_args(qwen3_tokenizer_dir), text, params())
    assert (
        "1 multi-turn episode(s) so far (sample 5) had a text prompt without the tools of env 'calculator', "
        "['calculator'] (the row has no --tool-key 'tools' tools" in caplog.text
    )
    caplog.clear()
    install(monkeypatch, ScriptedEngine(tok, [FINAL_TURN, FINAL_TURN]))
    await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())  # messages: rendered with them
    with_tools = Sample(prompt="p", metadata={"env": "calculator", "tools": CalculatorEnv.tool_specs}, index=6)
    await multi_turn.generate(make_args(qwen3_tokenizer_dir), with_tools, params())  # the row's own tools
    assert "had a text prompt without" not in caplog.text
