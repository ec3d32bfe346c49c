"""The `slime.*` namespace: the names the original's examples and docs import, with the original semantics."""

import asyncio
import importlib
import pathlib
import re
import types

import pytest

from slime_core.config import PluginArgs, SlimeArgs

REPO = pathlib.Path(__file__).resolve().parents[2]

# Every `from slime.X import Y` in the original's examples/ and docs (THUDM/slime 624b824a8) that is plugin
# API; the training stack (slime.backends, slime.agent but its OpenAI adapter, slime.observability, external_utils) is
# left out.
ORIGINAL_IMPORTS = {
    "slime.utils.types": ["Sample"],
    "slime.utils.http_utils": ["post", "get"],
    "slime.utils.misc": ["load_function", "SingletonMeta", "exec_command", "get_free_port"],
    "slime.utils.async_utils": ["run"],
    "slime.utils.processing_utils": [
        "load_tokenizer", "load_processor", "build_processor_kwargs", "encode_image_for_rollout_engine",
    ],
    "slime.utils.mask_utils": ["MultiTurnLossMaskGenerator", "get_response_lengths"],
    "slime.rollout.sglang_rollout": [
        "GenerateState", "generate", "generate_and_rm", "generate_and_rm_group", "generate_rollout",
        "eval_rollout", "get_model_url", "abort",
    ],
    "slime.rollout.base_types": ["RolloutFnTrainOutput", "RolloutFnEvalOutput", "call_rollout_fn"],
    "slime.rollout.data_source": ["RolloutDataSource", "RolloutDataSourceWithBuffer"],
    "slime.rollout.filter_hub.base_types": [
        "DynamicFilterOutput", "MetricGatherer", "call_dynamic_filter", "should_drop_dynamic_filter_output",
    ],
    "slime.rollout.filter_hub.dynamic_sampling_filters": ["check_reward_nonzero_std"],
    "slime.rollout.rm_hub": ["async_rm", "batched_async_rm", "grade_answer_verl", "remote_rm"],
    "slime.rollout.rm_hub.math_utils": [
        "extract_answer", "grade_answer_verl", "extract_boxed_answer", "grade_answer_sympy", "grade_answer_mathd",
    ],
    "slime.rollout.rm_hub.math_dapo_utils": ["compute_score"],
    "slime.rollout.rm_hub.ifbench": ["compute_ifbench_reward"],
    "slime.rollout.sft_rollout": ["generate_rollout"],
    "slime.rollout.fully_async_rollout": ["generate_rollout_fully_async", "AsyncRolloutWorker"],
    "slime.agent.adapters": ["OpenAIAdapter"],
    "slime.agent.adapters.openai": ["OpenAIAdapter"],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(ORIGINAL_IMPORTS))
def test_original_import_paths_resolve(module):
    mod = importlib.import_module(module)
    missing = [name for name in ORIGINAL_IMPORTS[module] if not hasattr(mod, name)]
    assert missing == []


def test_an_original_module_not_carried_is_named_as_such():
    # Issue 27: `--rollout-function-path slime.rollout.sleep_rollout.sleep` (the original's profiling guide) said
    # "is the directory holding it on PYTHONPATH?", sending the user to look for the original's repository.
    from slime_core.plugins import PluginError, load_function

    with pytest.raises(PluginError) as e:
        load_function("slime.rollout.sleep_rollout.sleep", flag="--rollout-function-path")
    assert str(e.value) == (
        "--rollout-function-path: 'slime.rollout.sleep_rollout.sleep' is the original slime's; this version does not"
        " provide it (slime-compat has no 'slime.rollout.sleep_rollout'; MIGRATION.md 'Plugins' lists the modules it"
        " carries)"
    )
    # A user's own missing module keeps the PYTHONPATH hint.
    with pytest.raises(PluginError, match=r"module 'my_rm_q27' not found .*on PYTHONPATH\?"):
        load_function("my_rm_q27.reward", flag="--custom-rm-path")


def test_agent_adapter_is_the_framework_class():
    from slime.agent.adapters import OpenAIAdapter
    from slime_rollout.agent import OpenAIAdapter as RolloutAdapter

    assert OpenAIAdapter is RolloutAdapter


def test_compat_modules_are_thin():
    # Adapters only: no module of the namespace grows into a second implementation.
    sizes = {p.name: len(p.read_text().splitlines()) for p in (REPO / "packages/slime-compat/src/slime").rglob("*.py")}
    assert max(sizes.values()) < 200, sizes


def test_sample_is_the_framework_class_with_original_call_forms():
    from slime.utils.types import Sample
    from slime_core.sample import Sample as CoreSample

    assert Sample is CoreSample and Sample.Status.TRUNCATED.value == "truncated"
    args = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "reward_key": "acc"})
    s = Sample(prompt="q", tokens=[1, 2, 3], label="7")
    # The original's keyword form with `args` first (search-r1, retool): model turn, then a masked tool turn.
    meta = {"finish_reason": {"type": "length"}, "weight_version": "4"}
    s.append_response_tokens(args, tokens=[10, 11], log_probs=[-0.5, -0.25], trainable=True, meta_info=meta)
    s.append_response_tokens(args, tokens=[12], trainable=False)
    assert (s.tokens, s.response_length, s.loss_mask) == ([1, 2, 3, 10, 11, 12], 3, [1, 1, 0])
    assert s.rollout_log_probs == [-0.5, -0.25, 0.0]
    assert s.status is Sample.Status.TRUNCATED and s.weight_versions == ["4"]
    s.append_response_tokens(args, tokens=[13], log_probs=[-1.0], meta_info={"finish_reason": {"type": "stop"}},
                             update_terminal_info=False)  # fmt: skip
    assert s.status is Sample.Status.TRUNCATED  # a mid-call span leaves the terminal state alone
    s.reward = {"acc": 1.0, "score": -1.0}
    assert s.get_reward_value(args) == 1.0  # original signature: get_reward_value(args)
    assert s.get_reward_value("score") == -1.0
    s.payload_text = "q" + s.response  # plugins set their own attributes (original retool example)
    assert s.payload_text == "q"


def test_hand_set_response_then_append_keeps_the_original_mask_rule():
    from slime.utils.types import Sample

    s = Sample(tokens=[1, 2, 3], response_length=2)  # a plugin set prompt + 2 response tokens by hand
    s.append_response_tokens(tokens=[4], trainable=False)
    assert s.loss_mask == [1, 1, 0]


def test_misc_helpers():
    from slime.utils.misc import SingletonMeta, load_function, should_run_periodic_action
    from slime_rollout.generation.rollout import generate_rollout

    class Once(metaclass=SingletonMeta):
        def __init__(self, value):
            self.value = value

    assert Once(1) is Once(2) and Once(3).value == 1
    assert load_function("slime.rollout.sglang_rollout.generate_rollout") is generate_rollout
    # interval 3, 10 rollouts of 4 per epoch: every 3rd, epoch ends (4, 8) and — with num_rollout — the last.
    due = [i for i in range(10) if should_run_periodic_action(i, 3, 4, 10)]
    assert due == [2, 3, 5, 7, 8, 9]
    assert not should_run_periodic_action(5, None, 4, 10)


def test_rm_hub_graders():
    from slime.rollout.rm_hub import compute_score_dapo, f1_score, get_deepscaler_rule_based_reward
    from slime.rollout.rm_hub.math_dapo_utils import compute_score
    from slime.rollout.rm_hub.math_utils import extract_answer, grade_answer_verl, last_boxed_only_string

    assert compute_score is compute_score_dapo
    assert extract_answer(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert last_boxed_only_string(r"a \boxed{3} b \boxed{4}") == r"\boxed{4}"
    assert grade_answer_verl(r"\boxed{0.5}", r"\boxed{\frac12}") is True
    assert grade_answer_verl("no box here", "3") is False and grade_answer_verl(r"\boxed{3}", "") is False
    assert compute_score("Answer: 42", "42") == {"score": 1.0, "acc": True, "pred": "42"}
    assert compute_score("Answer: 41", "42")["score"] == -1.0
    assert get_deepscaler_rule_based_reward(r"<think>x</think> \boxed{6}", "6") == 1
    assert get_deepscaler_rule_based_reward(r"\boxed{6}", "6") == 0  # no </think>: not graded
    # "the cat sat" vs "cat sat down": normalized tokens [cat, sat] vs [cat, sat, down] -> p=1, r=2/3, f1=0.8
    f1, precision, recall = f1_score("the cat sat", "cat sat down")
    assert (round(f1, 6), precision, round(recall, 6)) == (0.8, 1.0, round(2 / 3, 6))
    assert f1_score(None, "x") == (0.0, 0.0, 0.0) and f1_score("yes", "no") == (0.0, 0.0, 0.0)


def test_dapo_compute_score_marks_no_answer_as_the_original():
    """The original's `compute_score` gives `pred` "[INVALID]" when no `Answer:` line is found and None when
    `strict_box_verify` finds no box; its examples branch on them (strands_sglang's reward_func grades again with
    `strict_box_verify=True` when `pred == "[INVALID]"`; retool's turns a None `pred` into ""). Here `pred` was "":
    strands' `... The answer is \\boxed{42}` scored -1.05 instead of 1.0 (the original, run on the same text)."""
    from slime.rollout.rm_hub.math_dapo_utils import compute_score

    boxed_only = "The tool says 42. The answer is \\boxed{42}"
    assert compute_score(boxed_only, "42") == {"score": -1.0, "acc": False, "pred": "[INVALID]"}
    assert compute_score(boxed_only, "42", strict_box_verify=True) == {"score": 1.0, "acc": True, "pred": "42"}
    assert compute_score("Answer: 42", "42", strict_box_verify=True) == {"score": -1.0, "acc": False, "pred": None}


def test_filter_hub():
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput, call_dynamic_filter
    from slime.rollout.filter_hub.dynamic_sampling_filters import check_reward_nonzero_std
    from slime.utils.types import Sample

    args = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
    same = [Sample(reward=1.0), Sample(reward=1.0)]
    assert call_dynamic_filter(check_reward_nonzero_std, args, same) == DynamicFilterOutput(False, "zero_std_1.0")
    assert call_dynamic_filter(lambda a, g: True, args, same) == DynamicFilterOutput(keep=True)
    assert call_dynamic_filter(None, args, same).keep


def test_filter_hub_helpers_of_the_original_rollout_loop():
    # A custom rollout function copied from the original's generate_rollout_async imports these (issue 27 plugin
    # pass: an ImportError before).
    from slime.rollout.filter_hub.base_types import (
        DynamicFilterOutput,
        MetricGatherer,
        should_drop_dynamic_filter_output,
    )

    drop = DynamicFilterOutput(keep=False, reason="zero_std_1.0", keep_when_insufficient=True)
    kept, plain_drop = DynamicFilterOutput(keep=True), DynamicFilterOutput(keep=False)
    assert should_drop_dynamic_filter_output(kept, remaining_batch_size=1, target_data_size=4) is False
    assert should_drop_dynamic_filter_output(drop, remaining_batch_size=5, target_data_size=4) is True
    assert should_drop_dynamic_filter_output(drop, remaining_batch_size=4, target_data_size=4) is False
    assert should_drop_dynamic_filter_output(plain_drop, remaining_batch_size=1, target_data_size=4) is True
    gatherer = MetricGatherer()
    for reason in ("zero_std_1.0", "zero_std_1.0", None, "too_long"):
        gatherer.on_dynamic_filter_drop(reason=reason)
    expected = {"rollout/dynamic_filter/drop_zero_std_1.0": 2, "rollout/dynamic_filter/drop_too_long": 1}
    assert gatherer.collect() == expected


def test_call_rollout_fn_wraps_legacy_returns():
    from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, call_rollout_fn

    out = call_rollout_fn(lambda args, rid, ds, evaluation: [["g"]], None, 0, None, evaluation=False)
    assert out == RolloutFnTrainOutput(samples=[["g"]])
    out = call_rollout_fn(lambda args, rid, ds, evaluation: {"d": {}}, None, 0, None, evaluation=True)
    assert out == RolloutFnEvalOutput(data={"d": {}})


@pytest.mark.slow  # 5-12 s: runs in the full suite, not in the per-package isolation run
def test_generate_state_and_model_url(qwen3_tokenizer_dir):
    from slime.rollout.sglang_rollout import GenerateState, get_model_url
    from slime.utils.misc import SingletonMeta

    cfg = SlimeArgs.from_dict({
        "rollout_batch_size": 2, "n_samples_per_prompt": 3, "num_rollout": 1, "hf_checkpoint": str(qwen3_tokenizer_dir),
        "rollout_max_response_len": 16, "rollout_temperature": 0.7, "sglang_server_concurrency": 5,
        "sglang_args": {"enable_deterministic_inference": True, "dp_size": "2", "enable_dp_attention": True},
        "rollout_seed": 10, "rollout_num_gpus_per_engine": 2,  # DP attention of 2 over each engine's 2 TP ranks
    })  # fmt: skip
    args = PluginArgs.from_config(cfg, engine_urls=["http://h:1", "http://h:2"], router_url="http://r:9")
    SingletonMeta.clear_instances(GenerateState)
    try:
        state = GenerateState(args)
        assert GenerateState(None) is state  # one per process
        assert state.tokenizer("1+1=", add_special_tokens=False)["input_ids"] == [16, 10, 16, 28]
        assert state.sampling_params["temperature"] == 0.7 and state.sampling_params["max_new_tokens"] == 16
        assert state.semaphore._value == 10  # 5 per engine × 2 engines
        assert state.group_sampling_seeds == [10, 11, 12] and state.dp_counts == [0, 0]
        with state.dp_rank_context() as rank:
            assert state.dp_counts[rank] == 1
        assert state.dp_counts == [0, 0]
        state.aborted = True
        assert state.state(False).aborted and state.state(True).aborted
        state.reset()
        assert not state.aborted and state.pendings == set() and state.remaining_batch_size == 0
    finally:
        SingletonMeta.clear_instances(GenerateState)
    assert get_model_url(args, "actor") == "http://r:9/generate"
    assert get_model_url(args, "ref", "/health") == "http://r:9/health"


def test_original_math_utils_names_and_remote_rm():
    # Issue 27: reward plugins of the original import these from its math_utils / rm_hub; they were missing.
    from slime.rollout.rm_hub import remote_rm
    from slime.rollout.rm_hub.math_utils import extract_boxed_answer, grade_answer_mathd, grade_answer_sympy

    assert extract_boxed_answer(r"first \boxed{1}, then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_boxed_answer("no box") is None
    assert grade_answer_sympy("0.5", r"\frac{1}{2}") is True and grade_answer_mathd("3", "4") is False
    sample = types.SimpleNamespace(prompt="p", response="r", label="l")
    with pytest.raises(ValueError, match="--rm-type remote_rm needs --rm-url"):
        asyncio.run(remote_rm(types.SimpleNamespace(rm_url=None), sample))


def test_abort_stops_the_engines_and_collects_partial_groups(monkeypatch, qwen3_tokenizer_dir):
    # The original's `abort(args, rollout_id)` (custom rollout functions copied from sglang_rollout call it).
    import slime.rollout.sglang_rollout as sglang_rollout
    from slime.rollout.sglang_rollout import GenerateState, abort
    from slime.utils.misc import SingletonMeta
    from slime_core.sample import Sample

    calls = []

    class Client:
        async def abort_all(self):
            calls.append("abort_all")

    monkeypatch.setattr(sglang_rollout, "get_client", lambda args: Client())
    cfg = SlimeArgs.from_dict({
        "rollout_batch_size": 2, "num_rollout": 1, "hf_checkpoint": str(qwen3_tokenizer_dir), "partial_rollout": True,
        "rollout_max_response_len": 8,
    })  # fmt: skip
    args = PluginArgs.from_config(cfg, engine_urls=["http://h:1"], router_url="http://r:9")
    SingletonMeta.clear_instances(GenerateState)

    async def run():
        state = GenerateState(args)
        started = Sample(index=0, response="12", metadata={})
        resumed = Sample(index=1, response="3", metadata={"start_rollout_id": 2})

        async def group(samples):
            return samples

        state.pendings = {asyncio.ensure_future(group([started, resumed])), asyncio.ensure_future(group([Sample()]))}
        collected = await abort(args, 5)
        return state, started, resumed, collected

    try:
        state, started, resumed, collected = asyncio.run(run())
        assert calls == ["abort_all"] and state.aborted and state.pendings == set()
        assert sorted(len(g) for g in collected) == [1, 2]
        assert started.metadata["start_rollout_id"] == 5 and resumed.metadata["start_rollout_id"] == 2
    finally:
        SingletonMeta.clear_instances(GenerateState)


def test_generate_and_rm_group_adapter_uses_the_callers_sampling_params(monkeypatch, qwen3_tokenizer_dir):
    from slime.rollout import sglang_rollout
    from slime.utils.misc import SingletonMeta
    from slime.utils.types import Sample
    from slime_rollout.generation import group_rollout

    seen = []

    async def fake_generate(args, sample, sampling_params):
        seen.append(dict(sampling_params))
        sample.status = Sample.Status.COMPLETED
        sample.reward = 1.0
        return sample

    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "n_samples_per_prompt": 2, "num_rollout": 1,
                               "hf_checkpoint": str(qwen3_tokenizer_dir), "rollout_max_response_len": 4})  # fmt: skip
    args = PluginArgs.from_config(cfg, engine_urls=["http://h:1"])
    monkeypatch.setattr(group_rollout, "default_generate", fake_generate)
    SingletonMeta.clear_instances(sglang_rollout.GenerateState)
    try:
        group = [Sample(prompt="a"), Sample(prompt="a")]
        out = asyncio.run(sglang_rollout.generate_and_rm_group(args, group, {"temperature": 0.1, "max_new_tokens": 3}))
        assert [s.session_id is not None for s in out] == [True, True]
        # The caller's params, plus each sample's own seed (generation.seeds: rollout seed, prompt, index).
        assert [{k: v for k, v in p.items() if k != "sampling_seed"} for p in seen] == [
            {"temperature": 0.1, "max_new_tokens": 3}
        ] * 2
        assert len({p["sampling_seed"] for p in seen}) == 2
        sglang_rollout.GenerateState(args).aborted = True
        fresh = [Sample(prompt="b"), Sample(prompt="b")]
        assert asyncio.run(sglang_rollout.generate_and_rm_group(args, fresh, None)) is fresh  # aborted: untouched
    finally:
        SingletonMeta.clear_instances(sglang_rollout.GenerateState)


def test_no_training_stack_modules():
    # Of slime.backends only the loss helpers exist (tests/slime-compat/test_backends.py); of slime.agent the adapter.
    for name in (
        "slime.backends.megatron_utils.actor",
        "slime.backends.sglang_utils",
        "slime.ray",
        "slime.agent.adapters.anthropic",
        "slime.agent.harness",
        "slime.utils.external_utils.command_utils",
    ):
        with pytest.raises(
            ModuleNotFoundError, match=re.escape(name.rsplit(".", 1)[0] if "external" in name else name)
        ):
            importlib.import_module(name)


def test_unknown_processing_utils_name_is_an_attribute_error():
    # The image helpers are real functions now (tests/slime-compat/test_processing_utils.py); others stay absent.
    from slime.utils import processing_utils

    with pytest.raises(AttributeError, match="has no attribute 'prepare_model_inputs'"):
        processing_utils.prepare_model_inputs  # noqa: B018


def test_the_originals_remaining_utils_helpers():
    # Each was missing here (an AttributeError in a plugin written for the original): misc.decode_int32_meta_array,
    # Box, group_by, chunk_named_params_by_size; async_utils.get_async_loop, AsyncLoopThread;
    # http_utils.get_rollout_num_engines, terminate_process.
    import asyncio
    import base64
    import multiprocessing
    import signal
    import struct

    import torch

    from slime.utils.async_utils import AsyncLoopThread, get_async_loop, run
    from slime.utils.http_utils import get_rollout_num_engines, terminate_process
    from slime.utils.misc import Box, chunk_named_params_by_size, decode_int32_meta_array, group_by
    from slime_rollout.generation.group_rollout import num_engines
    from slime_rollout.runtime.async_utils import get_loop

    packed = struct.pack("<4i", 3, -1, 7, 2**31 - 1)
    for value in (
        base64.b64encode(packed).decode(),
        packed,
        [3, -1, 7, 2**31 - 1],
        torch.tensor([[3, -1], [7, 2**31 - 1]]),
    ):
        got = decode_int32_meta_array({"other": 1, "routed_experts": value}, ("missing", "routed_experts"))
        assert got.dtype == torch.int32 and got.tolist() == [3, -1, 7, 2**31 - 1]
    assert decode_int32_meta_array({"k": None}, "k") is None and decode_int32_meta_array({}, "k") is None
    assert decode_int32_meta_array({"k": ""}, "k").tolist() == []  # torch.frombuffer refused an empty buffer
    with pytest.raises(ValueError, match=r"^decode_int32_meta_array: meta_info.k has 5 bytes, not int32 values"):
        decode_int32_meta_array({"k": b"12345"}, "k")

    thing = object()
    assert Box(thing).inner is thing
    assert group_by(["ab", "c", "de", "f"], key=len) == {2: ["ab", "de"], 1: ["c", "f"]}
    assert group_by([1, 2, 1]) == {1: [1, 1], 2: [2]}
    params = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([2, 2, 5, 1])]  # 8, 8, 20, 4 bytes
    buckets = [[name for name, _ in b] for b in chunk_named_params_by_size(params, 16)]
    assert buckets == [["w0"], ["w1"], ["w2"], ["w3"]]  # 8 + 8 reaches 16: closed before, as the original
    assert [[n for n, _ in b] for b in chunk_named_params_by_size(params, 17)] == [["w0", "w1"], ["w2"], ["w3"]]

    async def where():
        return asyncio.get_running_loop()

    shared = get_async_loop()
    assert shared.loop is get_loop() and shared.run(where()) is get_loop() and run(where()) is get_loop()
    own = AsyncLoopThread()
    assert own.run(where()) is own.loop is not get_loop()
    own.loop.call_soon_threadsafe(own.loop.stop)

    def cfg(engine_urls=None, **fields):
        args = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})
        return PluginArgs.from_config(args, engine_urls=engine_urls)

    assert get_rollout_num_engines(cfg(rollout_num_gpus=8, rollout_num_gpus_per_engine=2)) == 4
    assert get_rollout_num_engines(cfg(rollout_num_gpus_per_engine=1)) == 0  # no rollout GPUs: the original's 0
    # External engines, no rollout GPUs: the rollout uses all three (the count was 0 here before).
    three = [f"http://h{i}:30000" for i in range(3)]
    assert get_rollout_num_engines(cfg(three)) == 3 == num_engines(cfg(three))
    assert get_rollout_num_engines(cfg(three, rollout_num_gpus=8, rollout_num_gpus_per_engine=2)) == 3
    process = multiprocessing.get_context("spawn").Process(target=_sleep_long, daemon=True)
    process.start()
    terminate_process(process, timeout=30)
    assert process.exitcode == -signal.SIGTERM  # stopped by the SIGTERM, not dead of its own
    terminate_process(process)  # already gone: a no-op


def _sleep_long():
    import time

    time.sleep(300)


def test_slime_utils_misc_does_not_import_torch():
    # The original's slime.utils.misc did not import torch; every plugin that only wants load_function paid for it.
    import subprocess
    import sys

    code = "import sys, slime.utils.misc; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_eval_rollout_returns_the_original_output_type(monkeypatch):
    # The original's eval_rollout returns (RolloutFnEvalOutput(data=...), []); this one returned the bare data dict,
    # so a custom rollout function reading `output.data` (as the original's generate_rollout pattern does) failed.
    import asyncio

    import slime.rollout.sglang_rollout as original
    from slime.rollout.base_types import RolloutFnEvalOutput

    data = {"toy": {"rewards": [1.0], "truncated": [False], "samples": []}}

    async def fake_eval(args, rollout_id):
        return RolloutFnEvalOutput(data=data, metrics={"eval/toy": 1.0})

    monkeypatch.setattr(original, "eval_rollout_async", fake_eval)
    output, leftovers = asyncio.run(original.eval_rollout(None, 0))
    assert isinstance(output, RolloutFnEvalOutput) and output.data is data and leftovers == []
