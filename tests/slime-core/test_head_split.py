"""`head_split_problems`: the attention heads must split evenly over engine TP, Megatron TP and Ulysses CP.

Found by the fifth hostile pass on issue 27 (item 8): `--dry-run` passed an engine of 3 GPUs, Megatron TP 3 and FSDP
CP 3 on Qwen3-4B (32 heads, 8 KV heads); each run then failed deep in start-up.
"""

import pytest

from slime_core.config.head_split import head_split_problems

QWEN3_4B = {"num_attention_heads": 32, "num_key_value_heads": 8}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"engine_tp": 3}, ["--rollout-num-gpus-per-engine 3: num_attention_heads 32 is not divisible by 3"]),
        ({"engine_tp": 16}, []),  # 16 % 8: each KV head replicated on 2 ranks, as SGLang does
        ({"engine_tp": 4}, []),
        ({"engine_tp": 8, "engine_dp_attention": 8}, []),  # attention on 1 GPU per DP rank
        (
            {"engine_tp": 6, "engine_dp_attention": 2},
            [
                "--rollout-num-gpus-per-engine 6 (attention on 3 GPUs with --sglang-pp-size 1 / --sglang-dp-size 2): "
                "num_attention_heads 32 "
                "is not divisible by 3"
            ],
        ),  # fmt: skip
        (
            {"engine_tp": None, "megatron_tp": 3},
            ["--tensor-model-parallel-size 3: num_attention_heads 32 and num_key_value_heads 8 not divisible by 3"],
        ),
        (
            {"engine_tp": None, "megatron_tp": 16},
            ["--tensor-model-parallel-size 16: num_key_value_heads 8 not divisible by 16"],
        ),
        (
            {"engine_tp": None, "ulysses_cp": 3},
            ["--context-parallel-size 3: num_attention_heads 32 and num_key_value_heads 8 not divisible by 3"],
        ),
        ({"engine_tp": 1, "megatron_tp": 8, "ulysses_cp": 1}, []),
        (
            {"engine_tp": 6, "engine_pp": 2},
            [
                "--rollout-num-gpus-per-engine 6 (attention on 3 GPUs with --sglang-pp-size 2 / --sglang-dp-size 1): "
                "num_attention_heads 32 is not divisible by 3"
            ],
        ),  # fmt: skip
    ],
)
def test_head_split(kwargs, expected):
    assert head_split_problems(QWEN3_4B, **kwargs) == expected


def test_kv_heads_that_do_not_replicate_evenly_and_vlm_text_config():
    config = {"num_attention_heads": 24, "num_key_value_heads": 6}
    assert head_split_problems(config, engine_tp=4) == [
        "--rollout-num-gpus-per-engine 4: num_key_value_heads 6 does not split over 4 (nor 4 over it)"
    ]
    vlm = {"vision_config": {"num_attention_heads": 16}, "text_config": {"num_attention_heads": 28}}
    assert head_split_problems(vlm, engine_tp=8) == [
        "--rollout-num-gpus-per-engine 8: num_attention_heads 28 is not divisible by 8"
    ]
    assert head_split_problems({}, engine_tp=3) == []  # config.json says nothing: nothing to check
