"""`slime_convert.load_shapes`: a loader's checkpoint against `--hf-checkpoint`'s config, from headers only.

Before: a 2-layer `--ref-load` with a larger `--hf-checkpoint` failed inside the load with "linear_qkv has 32 rows,
expected 256", naming neither flag nor config field.
"""

import json

import pytest

from slime_convert.cli import main
from slime_convert.load_shapes import check_hf_checkpoint, check_torch_dist_checkpoint
from slime_convert.model_args import ModelArgs

pytest.importorskip("transformers")


def _config_dir(hf_dir, dst, **changes):
    """A config-only `--hf-checkpoint` (what the trainer builds) with `changes` applied to `hf_dir`'s config."""
    dst.mkdir()
    config = json.loads((hf_dir / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def qwen3(tiny_hf_model, tmp_path_factory):
    _, hf_dir = tiny_hf_model("qwen3")  # 2 layers, hidden 64, 4 heads of 32, 2 KV heads, intermediate 96
    save = tmp_path_factory.mktemp("mc")
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(save), "--no-progress"]) == 0
    return hf_dir, save


def test_matching_checkpoints_pass(qwen3):
    hf_dir, save = qwen3
    args = ModelArgs.from_hf_dir(hf_dir)
    check_hf_checkpoint("--hf-checkpoint", hf_dir, args, config_dir=hf_dir)
    check_torch_dist_checkpoint("--ref-load", save, args, config_dir=hf_dir)


def test_fewer_layers_than_the_config_names_flag_key_and_fields(qwen3, tmp_path):
    hf_dir, save = qwen3
    big = _config_dir(hf_dir, tmp_path / "big", num_hidden_layers=4)
    args = ModelArgs.from_hf_dir(big)
    with pytest.raises(ValueError) as e:
        check_torch_dist_checkpoint("--ref-load", save, args, config_dir=big)
    msg = str(e.value)
    assert msg.startswith(f"--ref-load {save}: decoder.layers.self_attention.linear_qkv.layer_norm_weight has shape")
    assert "linear_qkv.weight has shape [2, 256, 64], expected [4, 256, 64]" in msg and "(and 5 more)" in msg
    assert f"{big}/config.json says num_hidden_layers=4" in msg
    assert f"Is --ref-load a checkpoint of the model --hf-checkpoint {big} describes?" in msg

    with pytest.raises(ValueError) as e:
        check_hf_checkpoint("--ref-load", hf_dir, args, config_dir=big)
    msg = str(e.value)
    assert msg.startswith(f"--ref-load {hf_dir}: model.layers.2.input_layernorm.weight is missing (22 tensors missing)")
    assert "num_hidden_layers=4" in msg


def test_more_layers_than_the_config(qwen3, tmp_path):
    hf_dir, _ = qwen3
    small = _config_dir(hf_dir, tmp_path / "small", num_hidden_layers=1)
    with pytest.raises(ValueError, match=r"layer 1 is stored \(1 layers beyond num_hidden_layers\)"):
        check_hf_checkpoint("--ref-load", hf_dir, ModelArgs.from_hf_dir(small), config_dir=small)


def test_wrong_width_names_the_first_key_and_its_file(qwen3, tmp_path):
    hf_dir, save = qwen3
    wide = _config_dir(hf_dir, tmp_path / "wide", intermediate_size=48)
    args = ModelArgs.from_hf_dir(wide)
    with pytest.raises(ValueError) as e:
        check_hf_checkpoint("--hf-checkpoint", hf_dir, args, config_dir=wide)
    msg = str(e.value)
    assert msg.startswith(f"--hf-checkpoint {hf_dir}: model.layers.0.mlp.gate_proj.weight in model-")
    assert "has shape [96, 64], expected [48, 64]" in msg and "intermediate_size=48" in msg
    fc2 = r"linear_fc2\.weight has shape \[2, 64, 96\], expected \[2, 64, 48\]"
    with pytest.raises(ValueError, match=rf"^--load .*{fc2}"):
        check_torch_dist_checkpoint("--load", save, args, config_dir=wide)


def test_no_tensor_data_is_read(qwen3, tmp_path, monkeypatch):
    """Headers only: a check that read tensors would cost a full load before the GPUs are even set up."""
    from slime_convert import hf_io

    hf_dir, _ = qwen3
    monkeypatch.setattr(hf_io.HFCheckpointReader, "get", lambda self, name: pytest.fail(f"read tensor {name}"))
    check_hf_checkpoint("--hf-checkpoint", hf_dir, ModelArgs.from_hf_dir(hf_dir), config_dir=hf_dir)


def test_checking_an_hf_checkpoint_does_not_import_torchs_distributed_checkpoint():
    # Every run's driver checks --hf-checkpoint here; DCP is needed only for a torch_dist checkpoint.
    import subprocess
    import sys

    code = "import sys, slime_convert.load_shapes; print('torch.distributed.checkpoint' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
