"""`--sglang-enable-deterministic-inference` on the CPU reference engine: a request's output does not depend on its
batch-mates.

Issue 27 (pass 81): two runs of the demo with the same flags drew the same tokens for 60 rollouts and then differed.
The engine batches whatever requests arrived together (left-padded to a common length, one matmul for all rows), and
which requests arrive together depends on timing; a row's log-probs then change in their last bits with its
batch-mates (measured on the demo model: every one of 64 rows, by up to 1.5e-5), and once in a while a sampled token
flips. The flag was noted as having no effect on the reference engine; it now runs requests one at a time.
"""

import asyncio

import pytest
from transformers import AutoTokenizer

from slime_rollout.engines.client import EngineClient

TEXTS = ["Hi", "A much longer prompt about clips and friends in April and May", "2+2=", "Tell me", "x y z w"]


def _requests(tok):
    return [
        {
            "input_ids": tok.encode(t),
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 6 + i, "ignore_eos": True, "sampling_seed": i},
            "return_logprob": True,
        }
        for i, t in enumerate(TEXTS)
    ]


def _outputs(results):
    return [(r["output_ids"], [e[0] for e in r["meta_info"]["output_token_logprobs"]]) for r in results]


async def _sequential_and_concurrent(url, tok):
    engine = EngineClient(url, timeout=120)
    reqs = _requests(tok)
    sequential = [await engine.generate(r) for r in reqs]
    # reversed, all at once: other batch-mates, another arrival order, other padded lengths
    concurrent = (await asyncio.gather(*(engine.generate(r) for r in reversed(reqs))))[::-1]
    return _outputs(sequential), _outputs(concurrent)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return AutoTokenizer.from_pretrained(tiny_qwen3_dir)


@pytest.fixture(scope="module")
def deterministic_engine(tiny_qwen3_dir, private_tmp, reference_args, engine_base_port):
    from slime_rollout.engines.launch import launch_engines

    cfg = reference_args(tiny_qwen3_dir, sglang_args={"num_threads": "1", "enable_deterministic_inference": True})
    group = launch_engines(
        cfg,
        num_engines=1,
        gpus_per_engine=1,
        startup_timeout_s=300,
        log_dir=private_tmp / "deterministic-engine-logs",
        base_port=engine_base_port + 50,
    )
    yield group
    group.shutdown()


async def test_deterministic_engine_output_is_bit_identical_whatever_its_batch_mates(deterministic_engine, tokenizer):
    sequential, concurrent = await _sequential_and_concurrent(deterministic_engine.urls[0], tokenizer)
    assert [len(ids) for ids, _ in sequential] == [6, 7, 8, 9, 10]
    assert concurrent == sequential  # exact: token ids and every float of the log-probs


async def test_the_launched_deterministic_engine_reports_the_batch_of_one_it_runs(deterministic_engine):
    # The launcher passes --max-running-requests 64 with the flag; /server_info said 64 while requests ran one at a
    # time (issue 27). Now both SGLang places say 1, and so does /v1/loads.
    engine = EngineClient(deterministic_engine.urls[0], timeout=60)
    info, loads = await engine.server_info(), await engine.get_loads()
    assert info["enable_deterministic_inference"] is True and info["max_running_requests"] == 1
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 1
    assert loads["loads"][0]["max_running_requests"] == 1


async def test_the_batching_engine_is_not_bit_identical(reference_engine, tokenizer):
    # Why the flag exists: the default engine batches, and a row's log-probs move with its batch-mates.
    sequential, concurrent = await _sequential_and_concurrent(reference_engine.urls[0], tokenizer)
    assert [ids for ids, _ in concurrent] == [ids for ids, _ in sequential]
    assert concurrent != sequential


def test_the_flag_reaches_the_engine_and_is_no_longer_noted_as_ignored(tiny_qwen3_dir, reference_args):
    from slime_rollout.engines.launch.reference import build_reference_command, preflight

    on = reference_args(tiny_qwen3_dir, sglang_args={"enable_deterministic_inference": True})
    off = reference_args(tiny_qwen3_dir, sglang_args={"enable_deterministic_inference": "false"})
    assert "--enable-deterministic-inference" in build_reference_command(on, host="h", port=1, random_seed=0)
    assert "--enable-deterministic-inference" not in build_reference_command(off, host="h", port=1, random_seed=0)
    assert preflight(on) == []
