"""`--sglang-*` MoE flags on a dense model (issue 27, item 8): refused from config.json alone, without SGLang."""

import json
import pathlib

import pytest

from slime_core.config.sglang_moe import dense_model_moe_flags

CONFIGS = pathlib.Path(__file__).parents[1] / "fixtures" / "hf-configs"


def _config(name):
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize(
    ("sglang_args", "refused"),
    [
        ({"ep_size": "2"}, ["--sglang-ep-size 2"]),
        ({"expert_parallel_size": "4"}, ["--sglang-expert-parallel-size 4"]),
        ({"enable_ep_moe": True}, ["--sglang-enable-ep-moe"]),
        (
            {"moe_a2a_backend": "deepep", "enable_eplb": True},
            ["--sglang-moe-a2a-backend deepep", "--sglang-enable-eplb"],
        ),
        ({"ep_num_redundant_experts": "8"}, ["--sglang-ep-num-redundant-experts 8"]),
        ({"enable_flashinfer_cutlass_moe": True}, ["--sglang-enable-flashinfer-cutlass-moe"]),
        # SGLang's defaults and switches turned off ask for nothing.
        ({"ep_size": "1", "moe_a2a_backend": "none", "moe_runner_backend": "auto", "enable_eplb": "false"}, []),
        ({"mem_fraction_static": "0.7", "enable_dp_attention": True, "dp_size": "2"}, []),  # not MoE options
    ],
)
def test_moe_flags_on_dense_models(sglang_args, refused):
    for dense in ("Qwen3-4B", "Qwen3-32B", "Qwen2.5-0.5B-Instruct"):
        assert dense_model_moe_flags(sglang_args, _config(dense)) == refused


@pytest.mark.parametrize("moe", ["Qwen3-30B-A3B", "Qwen3-235B-A22B"])
def test_moe_models_take_them(moe):
    assert dense_model_moe_flags({"ep_size": "8", "enable_eplb": True, "moe_a2a_backend": "deepep"}, _config(moe)) == []


def test_a_multimodal_config_is_read_through_its_text_config():
    wrapped = {"model_type": "qwen2_5_vl", "text_config": _config("Qwen3-4B")}
    assert dense_model_moe_flags({"ep_size": "2"}, wrapped) == ["--sglang-ep-size 2"]
