"""Length flags above the engine's context are refused before launch (`slime_rollout.preflight`, issue 27 #13).

Reproducer: `--rollout-max-prompt-len 5000` on a model of 4,096 positions passed; prompts of 4,096 tokens and more
were kept, and left the engine no room to generate (the run trained on 1-token responses). The default limit (the
context less one token) drops them; a flag set above it must not bring them back unannounced.
"""

import json

import pytest

from slime_core.config import parse_args
from slime_rollout.preflight import check


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 4096}))
    (folder / "tokenizer.json").write_text("{}")  # present: the tokenizer-files check is not this test's
    return folder


def _errors(model, *extra):
    data = model.parent / "d.jsonl"
    data.write_text(json.dumps({"input": "1+1=", "label": "2"}) + "\n")
    cfg = parse_args(
        ["--train-backend", "fsdp", "--prompt-data", str(data), "--label-key", "label", "--hf-checkpoint", str(model),
         "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--num-rollout", "1",
         "--actor-num-gpus-per-node", "1", *extra]
    )  # fmt: skip
    return [p.message for p in check(cfg) if p.severity == "error" and "context" in p.message]


def test_a_prompt_limit_above_the_models_context_is_one_error(model):
    (error,) = _errors(model, "--rollout-max-prompt-len", "5000")
    assert error.startswith(
        f"--rollout-max-prompt-len 5000 is more than the engine's context allows (4095; the context is 4096 tokens: "
        f"max_position_embeddings in {model}/config.json)"
    )
    assert error.endswith("or give the engine a longer one with --sglang-context-length")
    (error,) = _errors(model, "--rollout-max-context-len", "8192")  # its derived prompt limit is not named twice
    assert error.startswith("--rollout-max-context-len 8192 is more than the engine's context allows (4096;")
    (error,) = _errors(model, "--eval-max-prompt-len", "4096")
    assert error.startswith("--eval-max-prompt-len 4096 is more than the engine's context allows (4095;")


def test_limits_within_the_context_or_an_engine_context_that_covers_them_pass(model):
    assert _errors(model) == []
    assert _errors(model, "--rollout-max-prompt-len", "4095", "--rollout-max-context-len", "4096") == []
    assert _errors(model, "--rollout-max-prompt-len", "5000", "--sglang-context-length", "16384") == []
    (error,) = _errors(model, "--rollout-max-prompt-len", "20000", "--sglang-context-length", "16384")
    assert "(16383; the context is 16384 tokens: --sglang-context-length)" in error
