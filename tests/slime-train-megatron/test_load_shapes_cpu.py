"""`MegatronTrainBackend.init` checks `--ref-load`/`--load`/`--hf-checkpoint` shapes before building the model.

Before: a 2-layer `--ref-load` with a 4-layer `--hf-checkpoint` config built the model and then failed inside
megatron-core's `dist_checkpointing.load` ("linear_qkv has 32 rows, expected 256" on the GPU run), naming no flag.
"""

import json

import pytest

from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")

_MEGATRON = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]


def _bigger_config(hf_dir, dst):
    """A config-only `--hf-checkpoint` describing the tiny model with 4 layers instead of 2."""
    dst.mkdir()
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    (dst / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    return dst


def _init(backend_module, **fields):
    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "megatron_args": _MEGATRON, **fields}
    )
    backend = backend_module.MegatronTrainBackend()
    built = []
    original = backend_module.build_parallel_model
    backend_module.build_parallel_model = lambda *a, **k: built.append(1) or original(*a, **k)
    try:
        backend.init(cfg, with_ref=False)
    finally:
        backend_module.build_parallel_model = original
    return built


def test_a_smaller_ref_load_is_refused_before_the_model_is_built(cpu_backend_env, tiny_hf, tmp_path):
    from slime_convert import hf_to_mcore

    _, hf_dir = tiny_hf("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "mcore", progress=False)
    big = _bigger_config(hf_dir, tmp_path / "big")
    built = []
    with pytest.raises(ValueError) as e:
        built = _init(cpu_backend_env, hf_checkpoint=str(big), ref_load=str(tmp_path / "mcore"))
    msg = str(e.value)
    assert msg.startswith(f"--ref-load {tmp_path / 'mcore'}: decoder.layers.")
    assert "linear_qkv.weight has shape [2, 256, 64], expected [4, 256, 64]" in msg
    assert f"{big}/config.json says num_hidden_layers=4" in msg and built == []


def test_a_load_of_another_depth_is_refused_naming_load(cpu_backend_env, tiny_hf, tmp_path):
    import torch
    import transformers

    from slime_convert import hf_to_mcore

    _, hf_dir = tiny_hf("qwen3")
    layers = {"num_hidden_layers": 1, "layer_types": ["full_attention"]}
    config = transformers.AutoConfig.from_pretrained(hf_dir, **layers)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path / "one")
    hf_to_mcore(tmp_path / "one", tmp_path / "mcore", progress=False)
    with pytest.raises(ValueError) as e:
        _init(cpu_backend_env, hf_checkpoint=str(hf_dir), load=str(tmp_path / "mcore"))
    msg = str(e.value)
    assert msg.startswith(f"--load {tmp_path / 'mcore'}: decoder.layers.")
    assert "linear_qkv.weight has shape [1, 256, 64], expected [2, 256, 64]" in msg
    assert "num_hidden_layers=2" in msg


def test_hf_weights_of_another_depth_are_refused_naming_hf_checkpoint(cpu_backend_env, tiny_hf, tmp_path):
    import shutil

    _, hf_dir = tiny_hf("qwen3")
    mixed = tmp_path / "mixed"
    shutil.copytree(hf_dir, mixed)
    config = json.loads((mixed / "config.json").read_text())
    (mixed / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    with pytest.raises(ValueError, match=rf"^--hf-checkpoint {mixed}: model\.layers\.2\..* is missing"):
        _init(cpu_backend_env, hf_checkpoint=str(mixed))
