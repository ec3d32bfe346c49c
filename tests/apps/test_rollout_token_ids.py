"""Token ids the trainer gets must index the policy's embedding (`slime_core.train_data.check_token_ids`)."""

import json

import pytest

from slime_app.rollout_manager import policy_vocab_size, rollout_batches
from slime_core.config import PluginArgs, parse_args
from slime_core.sample import Sample


def _model(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    policy_vocab_size.cache_clear()
    return str(tmp_path)


def _args(hf_checkpoint):
    cfg = parse_args(["--train-backend", "fsdp", "--hf-checkpoint", hf_checkpoint, "--prompt-data", "/d.jsonl",
                      "--num-rollout", "1", "--rollout-batch-size", "1", "--n-samples-per-prompt", "2",
                      "--global-batch-size", "2", "--rollout-max-response-len", "8"])  # fmt: skip
    return PluginArgs.from_config(cfg)


def _group(second_tokens):
    return [
        Sample(index=0, group_index=0, tokens=[1, 2, 3], response_length=1, reward=1.0, loss_mask=[1]),
        Sample(index=1, group_index=0, tokens=second_tokens, response_length=2, reward=0.0, loss_mask=[1, 1]),
    ]


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([5, 64, 7], "sample 1: token id 64 at position 1 (response) is outside the policy's vocabulary [0, 64)"),
        ([5, 6, -100], "sample 1: token id -100 at position 2 (response)"),  # HF's ignore index as padding
        ([-1, 6, 7], "sample 1: token id -1 at position 0 (prompt)"),
    ],
)
def test_a_token_id_outside_the_vocabulary_is_one_error_naming_the_sample(tmp_path, tokens, message):
    # A custom generate function, env or data source that builds `tokens` itself (another tokenizer's ids, -100 or -1
    # as padding): the batches were built, and the trainer's embedding failed on it (CPU: "IndexError: index out of
    # range in self" deep in the model; GPU: a device-side assert), naming no sample.
    args = _args(_model(tmp_path, {"model_type": "qwen3", "vocab_size": 64}))
    with pytest.raises(ValueError, match=r"^" + message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        rollout_batches(args, _group(tokens), dp_size=1, rollout_id=0)
    batches, _ = rollout_batches(args, _group([5, 63, 0]), dp_size=1, rollout_id=0)  # the edges are in range
    assert [t.tolist() for t in batches[0].tokens] == [[1, 2, 3], [5, 63, 0]]


def test_a_multimodal_models_vocabulary_is_its_text_configs(tmp_path):
    path = _model(tmp_path, {"model_type": "qwen2_5_vl", "text_config": {"vocab_size": 32}})
    assert policy_vocab_size(path) == 32
    with pytest.raises(ValueError, match=r"token id 40 at position 1 \(response\)"):
        rollout_batches(_args(path), _group([5, 40, 7]), dp_size=1, rollout_id=0)


def test_no_config_json_is_a_warning_not_an_error(tmp_path, caplog):
    policy_vocab_size.cache_clear()
    assert policy_vocab_size(str(tmp_path / "missing")) is None
    assert "token ids are not checked against the vocabulary" in caplog.text
