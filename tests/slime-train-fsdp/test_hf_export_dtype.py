"""The HF export's config.json states the dtype its tensors are written in (the checkpoint's, not the master's)."""

import json

import pytest
import torch
import torch.distributed as dist
from safetensors import safe_open

from slime_train_fsdp.hf_export import save_hf


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _tensor_dtypes(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys()}


@pytest.mark.parametrize("declared, expected", [("bfloat16", torch.bfloat16), (None, torch.float32)])
def test_export_dtype_matches_config(declared, expected, make_tiny_qwen3, tmp_path, one_rank):
    from transformers import AutoModelForCausalLM

    source = make_tiny_qwen3(tmp_path / "src")  # fp32 weights
    config = json.loads((source / "config.json").read_text())
    config.pop("dtype", None), config.pop("torch_dtype", None)
    if declared:
        config["torch_dtype"] = declared  # an older transformers' key
    (source / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)  # the trainer's fp32 master weights
    save_hf(model, tmp_path / "out", source_dir=source)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert _tensor_dtypes(tmp_path / "out") == {expected}
    name = str(expected).removeprefix("torch.")
    assert written["dtype"] == name and written.get("torch_dtype", name) == name


def test_export_replaces_an_old_export_by_rename_and_survives_a_crash_mid_swap(
    make_tiny_qwen3, tmp_path, one_rank, monkeypatch
):
    import os

    from transformers import AutoModelForCausalLM

    from slime_core import dir_swap

    source = make_tiny_qwen3(tmp_path / "src")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "previous").write_text("rollout 0")
    dir_swap.mark(out)  # an earlier export of this run
    real_replace = os.replace

    def die_before_the_new_export_lands(src, dst):
        if str(src) == str(tmp_path / "hf.tmp"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(dir_swap.os, "replace", die_before_the_new_export_lands)
    with pytest.raises(KeyboardInterrupt):
        save_hf(model, out, source_dir=source)
    monkeypatch.setattr(dir_swap.os, "replace", real_replace)
    assert (tmp_path / "hf.old" / "previous").read_text() == "rollout 0"  # the last export is still on disk
    save_hf(model, out, source_dir=source)
    assert not (out / "previous").exists() and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("hf")) == ["hf"]


def test_export_refuses_a_folder_slime_did_not_write_and_deletes_nothing(make_tiny_qwen3, tmp_path, one_rank):
    from transformers import AutoModelForCausalLM

    from slime_core.dir_swap import ReplaceRefused

    source = make_tiny_qwen3(tmp_path / "src")
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("precious\n")
    with pytest.raises(ReplaceRefused, match=f"--save-hf {data}: is a non-empty folder that slime did not write"):
        save_hf(model, data, source_dir=source)
    assert (data / "train.jsonl").read_text() == "precious\n"
    assert not (tmp_path / "data.tmp").exists() and not (tmp_path / "data.old").exists()


@pytest.mark.parametrize("declared, expected", [("bfloat16", torch.bfloat16), ("float32", torch.float32)])
def test_weight_push_dtype_is_the_checkpoint_dtype(declared, expected, make_tiny_qwen3, tmp_path, one_rank):
    """The pushed tensors have the checkpoint's dtype, not the fp32 master's (building the fp32 model rewrites the
    config object's dtype; a bf16 checkpoint's pushes went out in fp32, twice the bytes)."""
    from slime_core.config import SlimeArgs
    from slime_train_fsdp import FSDPTrainBackend

    source = make_tiny_qwen3(tmp_path / "src")
    config = json.loads((source / "config.json").read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = declared
    (source / "config.json").write_text(json.dumps(config))
    backend = FSDPTrainBackend()
    fields = dict(hf_checkpoint=str(source), train_backend="fsdp", attn_implementation="sdpa", rollout_batch_size=2,
                  n_samples_per_prompt=2, global_batch_size=4, num_rollout=1)  # fmt: skip
    backend.init(SlimeArgs.from_dict(fields), with_ref=False)
    pushed = {t.dtype for bucket in backend.named_hf_weights(1 << 30) for _, t in bucket}
    assert pushed == {expected}
    assert all(p.dtype == torch.float32 for p in backend.model.parameters())  # the masters stay fp32
