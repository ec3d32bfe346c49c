"""Plugins written the way the original slime's examples are (THUDM/slime `examples/`) run through our loop.

`example_plugins/` holds short stand-ins written for these tests, one per original example (each names the file it
mirrors): the same `slime.*` imports, signatures and moves on `args` and samples, only as much as each test needs.
A scripted engine (a real aiohttp server speaking SGLang's `/generate`) answers by prompt, so each plugin's control
flow and rewards are known in advance.
"""

import pathlib
import sys

import pytest
from aiohttp import web
from transformers import AutoTokenizer

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.generation.rollout import generate_rollout_async

PLUGINS = pathlib.Path(__file__).parent / "example_plugins"
PLUGIN_MODULES = ("ex_multi_agent", "ex_search_r1", "ex_retool", "ex_tau_bench")


@pytest.fixture
def example_plugins(monkeypatch):
    """Puts the stand-ins on sys.path, each imported afresh (module state such as a call counter starts over).

    The plugin loader's per-path cache is emptied too: another test of this process (the original scripts' dry
    run) may have loaded `ex_search_r1.generate` from an earlier module object, whose `SEARCH` this test's
    monkeypatch would then not reach.
    """
    from slime_core.plugins import forget_loaded_plugins

    monkeypatch.syspath_prepend(str(PLUGINS))
    for name in PLUGIN_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    forget_loaded_plugins()
    yield
    for name in PLUGIN_MODULES:
        sys.modules.pop(name, None)
    forget_loaded_plugins()


async def _serve(reply_for, routes=()):
    """A scripted SGLang: `/generate` takes `text` or decodes `input_ids` with `reply_for.tokenizer` and answers
    `reply_for(prompt)` (stop, log-prob -0.5 per token); `routes` adds `(path, handler)` pairs."""
    tokenizer = reply_for.tokenizer
    seen = []

    async def generate(request):
        body = await request.json()
        prompt = body["text"] if "text" in body else tokenizer.decode(body["input_ids"])
        seen.append(prompt)
        text = reply_for(prompt)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][: body["sampling_params"]["max_new_tokens"]]
        meta = {"output_token_logprobs": [[-0.5, t, None] for t in ids], "finish_reason": {"type": "stop"},
                "prompt_tokens": len(body.get("input_ids", [])), "completion_tokens": len(ids),
                "weight_version": "0"}  # fmt: skip
        return web.json_response({"text": tokenizer.decode(ids), "output_ids": ids, "meta_info": meta})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path, handler in routes:
        app.router.add_post(path, handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1], seen


class _OneGroup:
    """A data source handing out one group of `n` copies of a prompt with a label."""

    def __init__(self, prompt, label, n):
        self.prompt, self.label, self.n = prompt, label, n

    def get_samples(self, num_groups):
        return [[Sample(prompt=self.prompt, label=self.label, index=j, group_index=0) for j in range(self.n)]]

    def add_samples(self, groups):
        raise AssertionError("nothing is returned to the source")


def _args(tokenizer_dir, port, **kw):
    fields = dict(rollout_batch_size=1, n_samples_per_prompt=1, num_rollout=1, hf_checkpoint=str(tokenizer_dir),
                  rollout_max_response_len=64, rollout_max_context_len=4096, sglang_server_concurrency=8,
                  rollout_num_gpus=1, rollout_num_gpus_per_engine=1, sglang_router_ip="127.0.0.1",
                  sglang_router_port=port)  # fmt: skip
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


# --- examples/multi_agent: a fan-out generate function (solvers, rewriters, a selector), rewards inside it ---


async def test_multi_agent_example_runs_through_the_loop(example_plugins, qwen3_tokenizer_dir):
    def reply(prompt):
        if prompt.startswith("Rewrite:"):
            return "r</think>rewritten: the answer is \\boxed{7}"
        if prompt.startswith("Select one:"):
            return "ok</think>Judgment: 2"
        return "s</think>first try: \\boxed{7}"

    reply.tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    runner, port, seen = await _serve(reply)
    try:
        args = _args(qwen3_tokenizer_dir, port, rm_type="deepscaler",
                     custom_generate_function_path="ex_multi_agent.generate")  # fmt: skip
        out, leftovers = await generate_rollout_async(args, 0, _OneGroup("What is 3 + 4?", "7", 1))
    finally:
        await runner.cleanup()
    assert leftovers == []
    (group,) = out.samples
    (fan_out,) = group
    assert len(seen) == 5 and len(fan_out) == 5  # 2 solvers, 2 rewriters, 1 selector
    # Every agent answered 7 = label: deepscaler 1.0, the selector picked a right one -> x1.2 for all.
    assert [s.reward for s in fan_out] == [pytest.approx(1.2)] * 5
    assert {s.rollout_id for s in fan_out} == {0}  # the plugin stamps the input sample's index
    for s in fan_out:
        assert s.status is Status.COMPLETED
        assert len(s.rollout_log_probs) == len(s.loss_mask) == s.response_length > 0
        assert s.rollout_log_probs == [-0.5] * s.response_length
        assert s.response_content  # an attribute of the plugin's own
    # The trainer's input: all 5 in one reward group (their group_index) and one loss denominator (rollout_id).
    from slime_core.train_data import build_rollout_batches

    (batch,) = build_rollout_batches(args, fan_out, dp_size=1)
    assert len(batch.tokens) == 5


# --- examples/search-r1: multi-turn generate posting `text`, a search tool over HTTP, masked observations ---


async def test_search_r1_example_runs_through_the_loop(example_plugins, monkeypatch, qwen3_tokenizer_dir):
    import ex_search_r1

    queries = []

    async def retrieve(request):
        body = await request.json()
        queries.append(body["queries"])
        return web.json_response({"result": [[{"contents": "Paris is the capital of France."}]]})

    first = "<think>I should look it up</think><search>capital of France</search>"

    def reply(prompt):
        return "<think>found it</think><answer>Paris</answer>" if "<information>" in prompt else first

    reply.tokenizer = tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    runner, port, seen = await _serve(reply, routes=[("/retrieve", retrieve)])
    monkeypatch.setitem(ex_search_r1.SEARCH, "search_url", f"http://127.0.0.1:{port}/retrieve")
    try:
        args = _args(qwen3_tokenizer_dir, port, custom_generate_function_path="ex_search_r1.generate",
                     custom_rm_path="ex_search_r1.reward_func", n_samples_per_prompt=2)  # fmt: skip
        label = {"ground_truth": {"target": ["Paris"]}, "style": "rule"}
        out, _ = await generate_rollout_async(args, 0, _OneGroup("Question: capital of France?\n", label, 2))
    finally:
        await runner.cleanup()
    assert queries == [["capital of France"]] * 2 and len(seen) == 4
    obs = "\n\n<information>Paris is the capital of France.</information>\n\n"
    # Each sample's second turn posts the prompt, its first turn and the observation as one text.
    assert sorted(seen)[2:] == ["Question: capital of France?\n" + first + obs] * 2
    obs_ids = tokenizer(obs, add_special_tokens=False)["input_ids"]
    turn1 = tokenizer(first, add_special_tokens=False)["input_ids"]
    for s in out.samples[0]:
        assert s.reward == 1.0  # exact match
        assert s.status is Status.COMPLETED
        rest = s.response_length - len(turn1) - len(obs_ids)
        assert rest > 0
        assert s.loss_mask == [1] * len(turn1) + [0] * len(obs_ids) + [1] * rest
        assert s.rollout_log_probs == [-0.5] * len(turn1) + [0.0] * len(obs_ids) + [-0.5] * rest
        assert s.response == first + obs + "<think>found it</think><answer>Paris</answer>"


# --- examples/retool: a code-interpreter tool (a python3 subprocess), a dict reward read with --reward-key ---


async def test_retool_example_runs_through_the_loop(example_plugins, qwen3_tokenizer_dir):
    call = '<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(3 + 4)"}}\n</tool_call>'

    def reply(prompt):
        return "The tool says 7. Answer: \\boxed{7}" if "<interpreter>" in prompt else call

    reply.tokenizer = tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    runner, port, seen = await _serve(reply)
    try:
        args = _args(qwen3_tokenizer_dir, port, custom_generate_function_path="ex_retool.generate",
                     custom_rm_path="ex_retool.reward_func", reward_key="score",
                     n_samples_per_prompt=2)  # fmt: skip
        out, _ = await generate_rollout_async(args, 0, _OneGroup("What is 3 + 4?", "7", 2))
    finally:
        await runner.cleanup()
    assert len(seen) == 4
    obs = "\n\n<interpreter>\nOutput:\n7\n</interpreter>\n\n"
    obs_ids = tokenizer(obs, add_special_tokens=False)["input_ids"]
    n_call = len(tokenizer(call, add_special_tokens=False)["input_ids"])
    for s in out.samples[0]:
        assert s.reward["score"] == 1.0 and s.get_reward_value(args) == 1.0
        assert s.tool_call_count == 1 and s.status is Status.COMPLETED
        assert s.loss_mask == [1] * n_call + [0] * len(obs_ids) + [1] * (s.response_length - n_call - len(obs_ids))
        assert s.response == call + obs + "The tool says 7. Answer: \\boxed{7}"
    assert out.metrics["rollout/raw_reward"] == 1.0


async def test_retool_example_in_an_eval_rollout(example_plugins, qwen3_tokenizer_dir, tmp_path):
    # The example script's `--eval-prompt-data aime ...`: the same generate and dict reward, read with --reward-key.
    from slime_rollout.generation.eval import eval_rollout_async

    def reply(prompt):
        return "No tool needed. Answer: \\boxed{7}" if "3 + 4" in prompt else "Answer: \\boxed{1}"

    reply.tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
    data = tmp_path / "aime.jsonl"
    data.write_text('{"prompt": "What is 3 + 4?", "label": "7"}\n{"prompt": "What is 5 + 4?", "label": "9"}\n')
    runner, port, _ = await _serve(reply)
    try:
        args = _args(qwen3_tokenizer_dir, port, custom_generate_function_path="ex_retool.generate",
                     custom_rm_path="ex_retool.reward_func", reward_key="score",
                     eval_prompt_data=["aime", str(data)], input_key="prompt", label_key="label",
                     n_samples_per_eval_prompt=2)  # fmt: skip
        out = await eval_rollout_async(args, 0)
    finally:
        await runner.cleanup()
    # math_dapo: 1.0 right, -1.0 wrong, then the tool bonus: min(-0.6, -1.0 + (0 - 2) / 2 * 0.1) = -1.1.
    assert sorted(out.data["aime"]["rewards"]) == [-1.1, -1.1, 1.0, 1.0]


# --- examples/geo3k_vlm_multi_turn: its --custom-config-path YAML holds settings its rollout reads as attributes ---


def test_custom_config_keys_are_plugin_attributes_as_in_the_original(tmp_path):
    from slime_core.config.cli import parse_args

    # The same kind of YAML as the example's geo3k_vlm_multi_turn_config.yaml: a flag and a setting of its own.
    config = tmp_path / "multi_turn_config.yaml"
    config.write_text("max_turns: 3\nrollout_interaction_env_path: my_envs.geometry_env\n")
    cfg = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--custom-config-path", str(config)])
    args = PluginArgs.from_config(cfg)
    # The example's rollout.py: `_load_env_module(args.rollout_interaction_env_path)`, `args.max_turns`.
    # Was: AttributeError (the key was only in args.custom_config).
    assert args.rollout_interaction_env_path == "my_envs.geometry_env"
    assert args.max_turns == 3  # a flag here: the field itself
    assert args.custom_config == {"rollout_interaction_env_path": "my_envs.geometry_env"}
    # A plugin setting never shadows a flag, even in a hand-built config.
    shadow = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "custom_config": {"lr": 5.0}})
    assert PluginArgs.from_config(shadow).lr == shadow.lr


# --- examples/tau-bench: the generate function returns a new Sample (string status, the task index) ---


async def test_tau_bench_example_data_and_result_samples(example_plugins, qwen3_tokenizer_dir, tmp_path):
    from slime_rollout.data.source import RolloutDataSourceWithBuffer

    # The rows the example's tau1_mock.py writes: `{"index": i, "metadata": task}`, read with `--input-key index`.
    data = tmp_path / "retail_train_tasks.jsonl"
    data.write_text("".join(f'{{"index": {i}, "metadata": {{"task": {i}}}}}\n' for i in (5, 6)))
    args = _args(qwen3_tokenizer_dir, 1, custom_generate_function_path="ex_tau_bench.generate",
                 n_samples_per_prompt=2, rollout_batch_size=1, prompt_data=str(data), input_key="index")  # fmt: skip
    # Was: "line 1: --input-key 'index' holds int 5, not a prompt": the example could not start.
    source = RolloutDataSourceWithBuffer(args)
    out, _ = await generate_rollout_async(args, 0, source)
    # Without a custom generate function a number is still refused, saying what would read it.
    with pytest.raises(ValueError, match=r"line 1: --input-key 'index' holds int 5, .*only by a --custom-generate"):
        RolloutDataSourceWithBuffer(_args(qwen3_tokenizer_dir, 1, prompt_data=str(data), input_key="index"))
    group = out.samples[0]
    assert sorted(s.reward for s in group) == [0.0, 1.0]
    assert sorted(s.status.name for s in group) == ["COMPLETED", "TRUNCATED"]
    for s in group:
        assert s.loss_mask == [1, 1, 0, 1] and s.response_length == 4 and s.tokens == [7, 8, 9, 10, 11, 12]
        assert s.metadata == {"task": 5}
    # New samples without group_index or rollout log-probs (the example keeps none) still make a training batch.
    from slime_core.train_data import build_rollout_batches

    (batch,) = build_rollout_batches(args, group, dp_size=1)
    assert len(batch.tokens) == 2


async def set_status_string(args, sample, sampling_params):
    sample.tokens, sample.response_length, sample.loss_mask, sample.response = [1, 2], 1, [1], "x"
    sample.status = "aborted" if sample.index == 0 else "Truncated"
    return sample


def reward_one(args, sample):
    return 1.0


async def set_unknown_status(args, sample, sampling_params):
    sample.status = "done"
    return sample


async def test_a_status_string_a_plugin_assigns_is_read_as_that_status(qwen3_tokenizer_dir):
    from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm

    args = _args(qwen3_tokenizer_dir, 1, custom_generate_function_path=f"{__name__}.set_status_string",
                 custom_rm_path=f"{__name__}.reward_one")  # fmt: skip
    state = RolloutState.create(args, rollout_id=0)
    aborted = await generate_and_rm(args, Sample(prompt="p", index=0), state, {"max_new_tokens": 4})
    # Was: the string, unequal to Status.ABORTED, so the aborted sample was rewarded and trained on.
    assert aborted.status is Status.ABORTED and aborted.reward is None
    truncated = await generate_and_rm(args, Sample(prompt="p", index=1), state, {"max_new_tokens": 4})
    assert truncated.status is Status.TRUNCATED and truncated.to_dict()["status"] == "truncated"
    args.custom_generate_function_path = f"{__name__}.set_unknown_status"
    with pytest.raises(ValueError, match=r"set_unknown_status.*sample 2: unknown status 'done' \(one of \["):
        await generate_and_rm(args, Sample(prompt="p", index=2), state, {"max_new_tokens": 4})
    with pytest.raises(ValueError, match=r"sample 3: unknown status 'done'"):
        Sample(index=3, status="done")


# --- examples/geo3k_vlm_multi_turn: its rollout builds image prompts with GenerateState(args).processor ---


@pytest.mark.slow  # builds a tiny VLM checkpoint (~10 s)
def test_generate_state_holds_the_checkpoints_processor(make_tiny_vlm, qwen3_tokenizer_dir, tmp_path):
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.misc import SingletonMeta

    vlm = make_tiny_vlm(tmp_path / "vlm")
    for checkpoint, has_processor in ((vlm, True), (qwen3_tokenizer_dir, False)):
        SingletonMeta.clear_instances(GenerateState)
        try:
            state = GenerateState(_args(checkpoint, 1))
            # The example: `if processor: processor(text=..., images=...)`, else text only (was: always text only).
            assert (state.processor is not None) == has_processor
            if has_processor:
                assert state.processor.image_processor is not None
        finally:
            SingletonMeta.clear_instances(GenerateState)


def scaled_advantages(args, rollout_data):
    """A custom advantage function reading its own `--custom-config-path` setting from `args`, as in the original."""
    import torch

    lengths, rewards = rollout_data["response_lengths"], rollout_data["rewards"]
    scale = args.my_advantage_scale
    rollout_data["advantages"] = [torch.full((n,), scale * r) for n, r in zip(lengths, rewards, strict=True)]
    rollout_data["returns"] = [torch.zeros(n) for n in lengths]


def test_trainer_hooks_read_custom_config_keys_too(tmp_path):
    import torch

    from slime_core.algorithms.advantages import compute_advantages_and_returns
    from slime_core.config.cli import parse_args

    config = tmp_path / "custom.yaml"
    config.write_text("my_advantage_scale: 3.0\n")
    cfg = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--n-samples-per-prompt", "2",
                      "--custom-config-path", str(config),
                      "--custom-advantage-function-path", f"{__name__}.scaled_advantages"])  # fmt: skip
    # The trainer holds the frozen config; its hooks get the plugin view (was: AttributeError my_advantage_scale).
    adv, _ = compute_advantages_and_returns(cfg, rewards=[1.0, -0.5], loss_masks=[torch.ones(2), torch.ones(1)])
    torch.testing.assert_close(adv[0], torch.full((2,), 3.0))
    torch.testing.assert_close(adv[1], torch.tensor([-1.5]))
