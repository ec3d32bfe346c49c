"""Preflight (every launch and `--dry-run`) checks every stored key's shape, as the Megatron loader does.

Before: the field comparison (`slime_app.checkpoint_shapes`) reads a few tensors (q/k/v and gate rows, the highest
layer index), so one tensor of another width or a missing middle layer passed `--dry-run` and the run stopped in
the loader after start-up, naming no flag.
"""

import json
import pathlib

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file

from slime_app.checkpoints import check_checkpoints
from slime_core.config import parse_args

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf-configs"
# A 2-layer Qwen3: hidden 16, 2 query heads and 1 key/value head of 8 dims, MLP 24, vocabulary 256, tied head.
TINY = {**json.loads((FIXTURES / "Qwen3-4B.json").read_text()), "num_hidden_layers": 2, "hidden_size": 16,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": 24,
        "vocab_size": 256, "layer_types": ["full_attention"] * 2, "max_window_layers": 2}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A real tiny Qwen3 saved by transformers (safetensors): `(dir, its tensors)`."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("tiny")
    config = transformers.Qwen3Config(**{k: v for k, v in TINY.items() if k not in ("architectures", "model_type")})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out, load_file(str(out / "model.safetensors"))


def _copy_with(src: pathlib.Path, dst: pathlib.Path, tensors: dict) -> pathlib.Path:
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def _cfg(model, *extra):
    return parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--hf-checkpoint", str(model), *extra])


def test_the_tiny_model_itself_passes_with_a_note(tiny):
    hf_dir, _ = tiny
    notes = check_checkpoints(_cfg(hf_dir))
    assert "--hf-checkpoint: every tensor's shape checked against --hf-checkpoint's config.json" in notes


def test_one_narrower_tensor_in_the_last_layer_is_refused(tiny, tmp_path):
    hf_dir, tensors = tiny
    bad = _copy_with(hf_dir, tmp_path / "bad", {**tensors, "model.layers.1.mlp.down_proj.weight": torch.zeros(16, 20)})
    with pytest.raises(ValueError) as info:
        check_checkpoints(_cfg(hf_dir, "--train-backend", "fsdp", "--use-kl-loss", "--ref-load", str(bad)))
    message = str(info.value)
    assert message.startswith(
        f"--ref-load {bad}: model.layers.1.mlp.down_proj.weight in model.safetensors has shape [16, 20], "
        "expected [16, 24]"
    ), message
    assert f"{hf_dir}/config.json says num_hidden_layers=2, hidden_size=16" in message
    assert "intermediate_size=24" in message


def test_a_missing_middle_layer_is_refused(tiny, tmp_path):
    hf_dir, tensors = tiny
    # Layers 0 and 2 of a 3-layer config: the highest index says 3 layers, so the field comparison passed.
    config = {**json.loads((hf_dir / "config.json").read_text()), "num_hidden_layers": 3,
              "layer_types": ["full_attention"] * 3}  # fmt: skip
    three = tmp_path / "three"
    three.mkdir()
    (three / "config.json").write_text(json.dumps(config))
    gap = {k.replace("model.layers.1.", "model.layers.2."): v for k, v in tensors.items()}
    save_file(gap, str(three / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"^--hf-checkpoint {three}: model\.layers\.1\.input_layernorm\.weight is "
                       r"missing \(11 tensors missing\)"):  # fmt: skip
        check_checkpoints(_cfg(three))


def test_a_torch_dist_ref_load_with_another_down_projection_width(tiny, tmp_path):
    hf_dir, _ = tiny
    ref = tmp_path / "ref"
    state = {
        "embedding.word_embeddings.weight": torch.zeros(256, 16),
        "decoder.layers.self_attention.linear_qkv.weight": torch.zeros(2, (2 + 2 * 1) * 8, 16),
        "decoder.layers.mlp.linear_fc1.weight": torch.zeros(2, 2 * 24, 16),  # the field comparison reads this one
        "decoder.layers.mlp.linear_fc2.weight": torch.zeros(2, 16, 20),  # and not this one
    }
    dcp.save(state, checkpoint_id=str(ref / "iter_0000010"), no_dist=True)
    (ref / "latest_checkpointed_iteration.txt").write_text("10")
    with pytest.raises(ValueError) as info:
        check_checkpoints(_cfg(hf_dir, "--train-backend", "megatron", "--ref-load", str(ref)))
    message = str(info.value)
    assert message.startswith(
        f"--ref-load {ref}: decoder.layers.mlp.linear_fc2.weight has shape [2, 16, 20], expected [2, 16, 24]"
    ), message
    assert f"Is --ref-load a checkpoint of the model --hf-checkpoint {hf_dir} describes?" in message


def test_a_torch_dist_ref_load_padded_with_64_at_preflight(tmp_path):
    """GLM-4.7's `--make-vocab-size-divisible-by 64`: vocabulary 300 → 320 rows (128 would be 384)."""
    transformers = pytest.importorskip("transformers")
    from slime_convert import hf_to_mcore

    hf_dir = tmp_path / "hf"
    fields = {k: v for k, v in TINY.items() if k not in ("architectures", "model_type")}
    transformers.AutoModelForCausalLM.from_config(
        transformers.Qwen3Config(**{**fields, "vocab_size": 300})
    ).save_pretrained(hf_dir)
    ref = tmp_path / "ref"
    hf_to_mcore(hf_dir, ref, make_vocab_size_divisible_by=64, progress=False)
    megatron = ["--train-backend", "megatron", "--ref-load", str(ref)]
    # Before: `--make-vocab-size-divisible-by 64` was refused by the flag table, and without it the field comparison
    # said `vocab_rows 320 vs 300`.
    check_checkpoints(_cfg(hf_dir, *megatron, "--make-vocab-size-divisible-by", "64"))
    with pytest.raises(ValueError) as info:
        check_checkpoints(_cfg(hf_dir, *megatron))
    message = str(info.value)
    assert "\n" not in message and message.startswith(
        f"--ref-load {ref}: written with --make-vocab-size-divisible-by "
        "64, read with --make-vocab-size-divisible-by 128"
    ), message
    # FSDP exports it to HF, dropping the padding: no divisor needed.
    check_checkpoints(_cfg(hf_dir, "--train-backend", "fsdp", "--ref-load", str(ref)))
