"""Both training backends' `--save-hf` writers produce the same checkpoint, byte for byte, from the same weights.

The FSDP export gathers from the (here unsharded) HF module; the Megatron export is fed the HF-named tensors its
`iter_hf_weights` yields (tied `lm_head.weight` left out, as HF writes it). Their gathering is tested in each
backend's tests; this holds the files they write to one layout (`slime_core.hf_checkpoint`).
"""

import pathlib

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _files(path: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("max_shard_bytes", [5 * 1024**3, 200_000])  # one shard; several with an index
def test_fsdp_and_megatron_exports_are_byte_identical(make_tiny_qwen3, tmp_path, one_rank, max_shard_bytes):
    from transformers import AutoModelForCausalLM

    from slime_train_fsdp.hf_export import save_hf as fsdp_save_hf
    from slime_train_megatron.hf_export import save_hf as megatron_save_hf

    ids = dict(bos_token_id=0, eos_token_id=1, pad_token_id=0)  # within the small vocab
    source = make_tiny_qwen3(tmp_path / "src", vocab_size=512, **ids)  # fp32, tied embeddings
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    fsdp_save_hf(model, tmp_path / "fsdp", source_dir=source, max_shard_bytes=max_shard_bytes)
    hf_named = [(n, t) for n, t in model.state_dict().items() if n != "lm_head.weight"]
    megatron_save_hf(iter(hf_named), tmp_path / "megatron", source_dir=source, max_shard_bytes=max_shard_bytes)

    fsdp, megatron = _files(tmp_path / "fsdp"), _files(tmp_path / "megatron")
    assert fsdp.keys() == megatron.keys()
    for name in fsdp:
        assert fsdp[name] == megatron[name], name
    weights = {n for n in fsdp if n.endswith(".safetensors")}
    if max_shard_bytes > 1024**3:
        assert weights == {"model.safetensors"} and "model.safetensors.index.json" not in fsdp
    else:
        assert len(weights) > 1 and "model.safetensors.index.json" in fsdp
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "megatron", dtype=torch.float32).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name
