"""`--multimodal-keys` / `--freeze-vision-tower` rules (`slime_core.config.validation_multimodal`)."""

import pytest

from slime_core.config import ConfigError, SlimeArgs, parse_args
from slime_core.config.unsupported import UNSUPPORTED

BASE = {"rollout_batch_size": 4, "num_rollout": 1, "train_backend": "fsdp", "apply_chat_template": True}
KEYS = {"image": "images"}


def make(**overrides):
    return SlimeArgs.from_dict({**BASE, **overrides})


def test_image_keys_are_accepted_from_the_command_line_as_json():
    args = parse_args(["--rollout-batch-size", "4", "--num-rollout", "1", "--train-backend", "fsdp",
                       "--apply-chat-template", "--multimodal-keys", '{"image": "images"}'])  # fmt: skip
    assert args.multimodal_keys == KEYS
    assert "multimodal_keys" not in UNSUPPORTED


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"multimodal_keys": {"video": "videos"}}, "media type 'video' is not implemented (supported: image)"),
        ({"multimodal_keys": {"image": ""}}, "'image' must name a dataset column"),
        ({"multimodal_keys": KEYS, "apply_chat_template": False}, "--multimodal-keys needs --apply-chat-template"),
        ({"multimodal_keys": KEYS, "train_backend": "megatron"}, "train vision-language models with --train-backend"),
        ({"freeze_vision_tower": True, "train_backend": "megatron"}, "--freeze-vision-tower is an FSDP option"),
        ({"multimodal_keys": KEYS, "lora_rank": 8}, "--lora-rank 8: LoRA on vision-language models is not implemented"),
    ],
)
def test_broken_rules_are_one_line_errors_naming_the_flags(overrides, message):
    with pytest.raises(ConfigError) as err:
        make(**overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_vision_inputs_are_not_split_over_context_parallel_ranks():
    with pytest.raises(ConfigError, match="with --context-parallel-size 2: vision inputs are not split"):
        parse_args(["--rollout-batch-size", "4", "--num-rollout", "1", "--train-backend", "fsdp",
                    "--actor-num-gpus-per-node", "2", "--apply-chat-template", "--multimodal-keys",
                    '{"image": "images"}', "--context-parallel-size", "2"])  # fmt: skip


def test_a_bad_json_value_names_the_flag():
    with pytest.raises(ConfigError, match="--multimodal-keys: not valid JSON"):
        parse_args(["--rollout-batch-size", "4", "--num-rollout", "1", "--multimodal-keys", "{image: x}"])
