"""`--make-vocab-size-divisible-by`: HF → torch_dist → HF with a divisor other than 128, and its recorded value."""

import argparse
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from slime_convert import ModelArgs, hf_to_mcore, mcore_to_hf
from slime_convert.cli import main
from slime_convert.load_shapes import check_torch_dist_checkpoint
from slime_convert.torch_dist import TorchDistReader
from slime_convert.vocab_padding import check_vocab_rows, recorded_divisor

pytest.importorskip("transformers")

EMBED = "embedding.word_embeddings.weight"


def _load_hf_dir(path):
    index = json.loads((path / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(path / file)))
    return out


def test_model_args_pad_with_the_divisor(tiny_hf_model):
    _, hf_dir = tiny_hf_model("qwen3")
    args = ModelArgs.from_hf_dir(hf_dir, make_vocab_size_divisible_by=64)
    # vocab 300: multiples of 64 × TP.
    assert [args.padded_vocab_size(tp) for tp in (1, 2, 4)] == [320, 384, 512]
    assert ModelArgs.from_hf_dir(hf_dir).padded_vocab_size(1) == 384  # Megatron's default 128
    assert args.gpt_model_kwargs(2)["vocab_size"] == 384
    flags = args.megatron_flags()
    assert flags[flags.index("--make-vocab-size-divisible-by") + 1] == "64"
    with pytest.raises(ValueError, match="--make-vocab-size-divisible-by must be a positive integer, got 0"):
        ModelArgs.from_hf_dir(hf_dir, make_vocab_size_divisible_by=0)


# The original's scripts use 64 (GLM-4.7) and 16 (GLM-5); vocab 300 is a multiple of neither × TP.
@pytest.mark.parametrize(
    ("model_type", "divisor", "tp", "rows"),
    [
        ("qwen3", 64, 1, 320),
        ("qwen2", 64, 2, 384),
        ("glm4", 64, 2, 384),
        ("llama", 16, 1, 304),
        ("qwen3_moe", 16, 2, 320),
    ],
)
def test_round_trip_with_another_divisor_is_bit_identical(model_type, divisor, tp, rows, tiny_hf_model, tmp_path):
    _, hf_dir = tiny_hf_model(model_type)
    original = _load_hf_dir(hf_dir)
    ckpt = hf_to_mcore(
        hf_dir, tmp_path / "mcore", tensor_model_parallel_size=tp, make_vocab_size_divisible_by=divisor, progress=False
    )
    reader = TorchDistReader(ckpt)
    keys = reader.tensor_keys()
    assert keys[EMBED][0] == (rows, 64)
    if "output_layer.weight" in keys:
        assert keys["output_layer.weight"][0] == (rows, 64)
    common = reader.common_state()
    assert recorded_divisor(common) == divisor and common["args"].padded_vocab_size == rows
    (embed,) = reader.read([(EMBED, ())])
    assert torch.equal(embed[300:], torch.zeros(rows - 300, 64))  # padding rows are zeros, as Megatron-LM's

    out = mcore_to_hf(ckpt, tmp_path / "hf-out", hf_dir, make_vocab_size_divisible_by=divisor, progress=False)
    converted = _load_hf_dir(out)
    assert converted.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(converted[name], tensor), name


def test_cli_records_and_checks_the_divisor(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")
    save = tmp_path / "m"
    flag = ["--make-vocab-size-divisible-by"]
    assert main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(save), "--tp", "2", *flag, "64",
                 "--no-progress"]) == 0  # fmt: skip
    assert TorchDistReader(save / "release").tensor_keys()[EMBED][0] == (384, 64)
    to_hf = ["mcore-to-hf", "--input-dir", str(save), "--origin-hf-dir", str(hf_dir), "--no-progress"]
    caplog.clear()
    assert main([*to_hf, "--output-dir", str(tmp_path / "h128"), *flag, "128"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "written with --make-vocab-size-divisible-by 64, read with " \
        "--make-vocab-size-divisible-by 128" in errors[0]  # fmt: skip
    assert not (tmp_path / "h128").exists()
    assert main([*to_hf, "--output-dir", str(tmp_path / "h64"), *flag, "64"]) == 0
    assert (
        main(
            [
                *to_hf,
                "--output-dir",
                str(tmp_path / "h"),
            ]
        )
        == 0
    )  # no divisor given: the padding is dropped
    for bad in ("0", "x"):
        with pytest.raises(SystemExit):
            main(["hf-to-mcore", "--hf-checkpoint", str(hf_dir), "--save", str(tmp_path / "y"), *flag, bad])
    assert main(["megatron-args", "--hf-checkpoint", str(hf_dir), *flag, "64"]) == 0


def test_an_unrecorded_divisor_is_judged_by_the_rows(tiny_hf_model, tmp_path, caplog):
    """A checkpoint without the record (another tool's): the rows must be a multiple of the divisor given."""
    _, hf_dir = tiny_hf_model("qwen3")
    ckpt = hf_to_mcore(hf_dir, tmp_path / "mcore", make_vocab_size_divisible_by=64, progress=False)
    common = torch.load(ckpt / "common.pt", weights_only=False)
    del common["args"].make_vocab_size_divisible_by
    torch.save(common, ckpt / "common.pt")
    assert recorded_divisor(TorchDistReader(ckpt).common_state()) is None
    with pytest.raises(ValueError, match=r"has 320 rows, not a multiple of --make-vocab-size-divisible-by 128"):
        mcore_to_hf(ckpt, tmp_path / "out", hf_dir, make_vocab_size_divisible_by=128, progress=False)


def test_a_megatron_load_refuses_another_divisor_in_one_line(tiny_hf_model, tmp_path):
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "mcore", make_vocab_size_divisible_by=64, progress=False)
    args64 = ModelArgs.from_hf_dir(hf_dir, make_vocab_size_divisible_by=64)
    args128 = ModelArgs.from_hf_dir(hf_dir)
    load = str(tmp_path / "mcore")
    check_torch_dist_checkpoint("--ref-load", load, args64, config_dir=hf_dir, tensor_model_parallel_size=1)
    with pytest.raises(ValueError) as info:
        check_torch_dist_checkpoint("--ref-load", load, args128, config_dir=hf_dir, tensor_model_parallel_size=1)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"--ref-load {load}: written with --make-vocab-size-divisible-by 64, read with ")
    assert "--make-vocab-size-divisible-by 128" in message
    # Same divisor, another TP: 320 rows stored, 384 built; megatron-core reads the shared rows (allow_shape_mismatch),
    # so it loads (a TP 2 save resumed at TP 1: test_parallel_layouts_cpu.py). It was refused.
    check_torch_dist_checkpoint("--ref-load", load, args64, config_dir=hf_dir, tensor_model_parallel_size=2)
    # Rows that cannot hold the vocabulary, or are padded by another scheme, are still refused in one line.
    stored = {"embedding.word_embeddings.weight": ((320, 64), torch.float32)}
    small = dataclasses.replace(ModelArgs.from_hf_dir(hf_dir, make_vocab_size_divisible_by=64), vocab_size=330)
    with pytest.raises(ValueError, match=r"^--load x: embedding.word_embeddings.weight has 320 rows, this run builds "):
        check_vocab_rows("--load x", stored, small, 1)
    with pytest.raises(ValueError, match=r"has 320 rows, this run builds 384"):
        check_vocab_rows("--load x", stored, ModelArgs.from_hf_dir(hf_dir), 1)  # 320 is no multiple of 128
    # An export (no TP given) drops the padding whatever it is.
    check_torch_dist_checkpoint("--ref-load", load, args128, config_dir=hf_dir)


def test_recorded_divisor_reads_megatron_lm_args():
    assert recorded_divisor({"args": argparse.Namespace(make_vocab_size_divisible_by=64)}) == 64
    assert recorded_divisor({"make_vocab_size_divisible_by": 32, "args": argparse.Namespace()}) == 32
    assert recorded_divisor({"iteration": 3}) is None
