"""`--true-on-policy-mode`: the flag parses, what the mode does not cover is refused, the engine flags it implies."""

import json

import pytest

# Validating the mode reads the capability records of the FSDP backend and the engines: their packages must be
# installed (the workspace suite; the slime-core isolation run only imports this module).
pytest.importorskip("slime_train_fsdp")
pytest.importorskip("slime_rollout")

from slime_core.config import ConfigError, SlimeArgs, parse_args, validation
from slime_core.config import base as config_base
from slime_core.config.true_on_policy import true_on_policy_server_args

BASE = {"rollout_batch_size": 4, "num_rollout": 1, "train_backend": "fsdp", "true_on_policy_mode": True}


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    monkeypatch.setattr(config_base, "_WARNED", set())
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)


def _checkpoint(tmp_path, arch="Qwen3ForCausalLM", model_type="qwen3", **extra):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type, **extra}))
    return str(tmp_path)


def make(**overrides):
    return SlimeArgs.from_dict({**BASE, **overrides})


def test_flag_parses_and_validates_for_a_dense_qwen3(tmp_path):
    args = parse_args(
        [
            "--rollout-batch-size",
            "4",
            "--num-rollout",
            "1",
            "--train-backend",
            "fsdp",
            "--true-on-policy-mode",
            "--hf-checkpoint",
            _checkpoint(tmp_path),
        ]  # fmt: skip
    )
    assert args.true_on_policy_mode is True


def test_engine_flags_in_the_mode_and_none_without():
    assert true_on_policy_server_args(make()) == [
        "--rl-on-policy-target",
        "fsdp",
        "--enable-deterministic-inference",
        "--attention-backend",
        "triton",
    ]
    assert true_on_policy_server_args(make(true_on_policy_mode=False)) == []


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"train_backend": "megatron"}, "implemented by --train-backend fsdp only, got --train-backend megatron"),
        ({"rollout_num_gpus_per_engine": 2}, "--rollout-num-gpus-per-engine 2: engine TP splits"),
        ({"sglang_args": {"attention_backend": "fa3"}}, "--sglang-attention-backend fa3: the trainer mirrors"),
        # One GPU per engine: DP attention of 2 has no TP ranks to split (refused before the mode's own rule).
        ({"sglang_args": {"dp_size": "2", "enable_dp_attention": True}}, "--sglang-dp-size 2 must divide each engine"),
        ({"lora_rank": 8}, "--lora-rank 8: LoRA adds matmuls"),
        ({"sglang_args": {"enable_mixed_chunk": True}}, "--sglang-enable-mixed-chunk True: generated tokens"),
        ({"sglang_args": {"speculative_algorithm": "EAGLE"}}, "--sglang-speculative-algorithm EAGLE"),
        ({"rollout_top_p": 0.9}, "--rollout-top-p 0.9 / --rollout-top-k -1"),
        ({"rollout_top_k": 20}, "--rollout-top-k 20"),
        ({"partial_rollout": True, "over_sampling_batch_size": 8}, "--partial-rollout: a resumed sample"),
        ({"log_probs_head": "fp32"}, "--log-probs-head fp32: the mode runs SGLang's own kernels"),
        ({"attn_implementation": "sdpa"}, "--attn-implementation sdpa"),
        ({"fsdp_compile_layers": True}, "--fsdp-compile-layers True"),
    ],
)
def test_uncovered_settings_are_refused_in_one_line(tmp_path, overrides, fragment):
    with pytest.raises(ConfigError) as info:
        make(hf_checkpoint=_checkpoint(tmp_path), **overrides)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_context_parallel_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--context-parallel-size 2: use 1"):
        make(hf_checkpoint=_checkpoint(tmp_path), megatron_args=["--context-parallel-size", "2"])


@pytest.mark.parametrize(
    ("arch", "model_type"),
    [("Qwen3MoeForCausalLM", "qwen3_moe"), ("Qwen2ForCausalLM", "qwen2"), ("LlamaForCausalLM", "llama")],
)
def test_models_other_than_dense_qwen3_are_refused(tmp_path, arch, model_type):
    with pytest.raises(ConfigError, match=f"architectures \\['{arch}'\\] \\(model_type '{model_type}'\\)"):
        make(hf_checkpoint=_checkpoint(tmp_path, arch, model_type))


@pytest.mark.parametrize(("stored", "sglang_args"), [("float32", {}), ("bfloat16", {"dtype": "float16"})])
def test_a_gpu_engine_serving_other_than_bf16_is_refused(tmp_path, stored, sglang_args):
    path = _checkpoint(tmp_path, torch_dtype=stored)
    with pytest.raises(ConfigError, match="the engine would serve .* weights"):
        make(hf_checkpoint=path, rollout_engine="sglang", sglang_args=sglang_args)
    make(hf_checkpoint=_checkpoint(tmp_path, torch_dtype="bfloat16"), rollout_engine="sglang")  # bf16: fine


def test_fp8_checkpoint_is_refused(tmp_path):
    quant = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    path = _checkpoint(tmp_path, quantization_config=quant)
    with pytest.raises(ConfigError, match="is an FP8 checkpoint"):
        make(hf_checkpoint=path)


def test_flag_is_no_longer_listed_unsupported():
    from slime_core.config.unsupported import UNSUPPORTED

    assert "true_on_policy_mode" not in UNSUPPORTED


def test_multi_turn_environments_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="--env-path/--max-turns 3: tool output is prefilled"):
        make(hf_checkpoint=_checkpoint(tmp_path), max_turns=3)


def test_delta_weight_sync_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--update-weight-mode delta: the engine holds embeddings and norms in fp32"):
        make(hf_checkpoint=_checkpoint(tmp_path), update_weight_mode="delta")
