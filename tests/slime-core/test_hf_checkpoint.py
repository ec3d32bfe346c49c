"""`slime_core.hf_checkpoint`: the HF export layout both training backends write (exact bytes and names)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from slime_core.hf_checkpoint import HFCheckpointWriter, source_dtype, write_hf_checkpoint


@pytest.fixture
def source(tmp_path):
    """An HF directory's non-weight files plus weights the writer must not copy."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3", "torch_dtype": "bfloat16"}))
    (src / "tokenizer.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"old weights")
    (src / "model.safetensors.index.json").write_text("{}")
    return src


def _tensors():
    # 4·4 + 4·3 + 4·2 = 16 + 12 + 8 bytes of float32 (4 bytes each)
    return [("a", torch.arange(4.0)), ("b", torch.ones(3)), ("c", torch.full((2,), 7.0))]


def test_one_shard_is_model_safetensors_with_the_assets(source, tmp_path):
    write_hf_checkpoint(_tensors(), tmp_path / "out", source_dir=source, is_writer=True)
    out = tmp_path / "out"
    # `.slime_export` marks a folder slime wrote: the next export may replace it (slime_core.dir_swap).
    assert sorted(p.name for p in out.iterdir()) == [".slime_export", "config.json", "model.safetensors",
                                                      "tokenizer.json"]  # fmt: skip
    got = load_file(str(out / "model.safetensors"))
    assert {k: v.tolist() for k, v in got.items()} == {"a": [0, 1, 2, 3], "b": [1, 1, 1], "c": [7, 7]}
    # The tensors are float32, so the copied config says so (its legacy key too), whatever the source declared.
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "float32"
    assert not (tmp_path / "out.tmp").exists()


def test_shards_are_cut_before_the_budget_is_passed_and_indexed(source, tmp_path):
    # 28 bytes: a (16) + b (12) fit exactly, c (8) would pass it and opens the second shard.
    write_hf_checkpoint(_tensors(), tmp_path / "out", source_dir=source, is_writer=True, max_shard_bytes=28)
    out = tmp_path / "out"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    assert index == {"metadata": {"total_size": 36}, "weight_map": {"a": first, "b": first, "c": second}}
    assert sorted(load_file(str(out / first))) == ["a", "b"] and sorted(load_file(str(out / second))) == ["c"]
    assert not (out / "model.safetensors").exists()


def test_cast_to_the_source_dtype_and_integers_kept(source, tmp_path):
    named = [("w", torch.tensor([1.5, -2.0])), ("step", torch.tensor([3], dtype=torch.int64))]
    write_hf_checkpoint(named, tmp_path / "out", source_dir=source, is_writer=True, dtype=source_dtype(source))
    got = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert got["w"].dtype == torch.bfloat16 and got["w"].tolist() == [1.5, -2.0]
    assert got["step"].dtype == torch.int64
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_reader_rank_writes_nothing_but_drains_the_collective_iterator(source, tmp_path):
    drained = []

    def named():
        for name, t in _tensors():
            drained.append(name)  # stands for a gather every rank must join
            yield name, t

    write_hf_checkpoint(named(), tmp_path / "out", source_dir=source, is_writer=False)
    assert drained == ["a", "b", "c"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_an_old_export_and_a_stale_staging_dir_are_replaced(source, tmp_path):
    out = tmp_path / "out"
    write_hf_checkpoint(_tensors(), out, source_dir=source, is_writer=True)  # rollout 0's export
    (tmp_path / "out.tmp").mkdir()
    (tmp_path / "out.tmp" / ".slime_export").write_text("")  # a killed export's staging dir (marked)
    (tmp_path / "out.tmp" / "half-written").write_text("")
    write_hf_checkpoint(_tensors(), out, source_dir=source, is_writer=True)
    assert sorted(p.name for p in out.iterdir()) == [".slime_export", "config.json", "model.safetensors",
                                                      "tokenizer.json"]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_bad_input_fails_clearly(source, tmp_path):
    with pytest.raises(ValueError, match="shard size must be > 0"):
        HFCheckpointWriter(tmp_path / "out", source_dir=source, max_shard_bytes=0)
    writer = HFCheckpointWriter(tmp_path / "out", source_dir=source)
    writer.add("a", torch.ones(1))
    with pytest.raises(ValueError, match="'a' written twice"):
        writer.add("a", torch.ones(1))


def test_read_weight_map_keeps_names_inside_the_folder_and_refuses_the_rest(tmp_path):
    import json

    from slime_core.hf_checkpoint import read_weight_map

    index = tmp_path / "model.safetensors.index.json"
    inside = {"a": "model-00001-of-00002.safetensors", "b": "shards/model-00002-of-00002.safetensors"}
    index.write_text(json.dumps({"metadata": {}, "weight_map": inside}))
    assert read_weight_map(index) == inside
    for file, why in [
        ("../x.safetensors", "leads out of the folder ('..')"),
        ("a/../../x.safetensors", "leads out of the folder ('..')"),
        ("/abs/x.safetensors", "is not a file name inside the folder"),
        ("\\\\server\\share\\x.safetensors", "is not a file name inside the folder"),
    ]:
        index.write_text(json.dumps({"weight_map": {**inside, "c": file}}))
        with pytest.raises(ValueError) as e:
            read_weight_map(index)
        assert str(e.value) == f"{index}: weight_map['c'] = {file!r} {why}"
