import pytest

from slime_core.config import SlimeArgs
from slime_train_megatron.settings import MegatronSettings

# A real, validated run config; tests set fields with model_copy (no re-validation, so bad Megatron tokens
# reach the settings' own parser).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def test_defaults_follow_slime():
    s = MegatronSettings.from_config(_CONFIG)
    assert s.bf16 and not s.fp16 and s.use_distributed_optimizer and s.tensor_model_parallel_size == 1
    assert s.params_dtype_name == "bfloat16"


def test_tokens_override_config_fields_and_unknown_are_ignored(caplog):
    args = _CONFIG.model_copy(
        update=dict(
            lr=3e-6,
            lr_warmup_iters=1,
            megatron_args=["--tensor-model-parallel-size", "2", "--sequence-parallel", "--fp16", "--lr-warmup-iters",
                           "5", "--no-use-distributed-optimizer", "--attention-softmax-in-fp32"],
        )
    )  # fmt: skip
    s = MegatronSettings.from_config(args)
    assert s.tensor_model_parallel_size == 2 and s.sequence_parallel and s.fp16 and not s.bf16
    assert s.lr == 3e-6 and s.lr_warmup_iters == 5 and not s.use_distributed_optimizer
    assert "--attention-softmax-in-fp32" in caplog.text


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        (["--tensor-model-parallel-size", "two"], "tensor_model_parallel_size"),
        (["--fp16", "--fp32"], "mutually exclusive"),
        (["--expert-tensor-parallel-size", "2"], "expert-tensor-parallel"),
        (["--lr-decay-style", "exp"], "lr_decay_style"),
        (["--tensor-model-parallel-size"], "megatron-args"),
    ],
)
def test_bad_values_raise_value_error(tokens, match):
    with pytest.raises(ValueError, match=match):
        MegatronSettings.from_config(_CONFIG.model_copy(update={"megatron_args": tokens}))


def test_sequence_parallel_without_tp_is_disabled():
    s = MegatronSettings.from_config(_CONFIG.model_copy(update={"megatron_args": ["--sequence-parallel"]}))
    assert not s.sequence_parallel


def test_world_layout():
    s = MegatronSettings(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, expert_model_parallel_size=2)
    assert s.world_layout(8).data_parallel_size == 2
    with pytest.raises(ValueError, match="not divisible"):
        s.world_layout(6)
