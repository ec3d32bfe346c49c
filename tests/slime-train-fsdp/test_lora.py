"""LoRA on the FSDP backend (2 ranks, gloo, tiny Qwen3 fp32): base model at start, only adapters train and sync,
the PEFT export loads in peft and the merged export in transformers with the trainer's log-probs (1e-5)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import pathlib
import shutil
import socket
import traceback

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")

TOL = 1e-5
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _worker():
    spec = importlib.util.spec_from_file_location("slime_fsdp_lora_worker", pathlib.Path(__file__).with_name(
        "_lora_worker.py"))  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rank(rank: int, world: int, port: int, out: pathlib.Path, ckpt: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    try:
        _worker().run(out, ckpt)
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, qwen3_tokenizer_dir) -> list[dict]:
    from transformers import AutoModelForCausalLM, Qwen3Config

    ckpt = tmp_path_factory.mktemp("tiny_qwen3_lora")
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                         tie_word_embeddings=False)  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks are forked from this process
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(ckpt)
    for f in qwen3_tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, ckpt / f.name)
    _worker()
    out = tmp_path_factory.mktemp("lora_out") / "ranks"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(r, 2, port, out, str(ckpt))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    torch.set_num_threads(threads)
    for rank, p in enumerate(procs):
        err = out / f"rank{rank}.err"
        assert p.exitcode == 0, err.read_text() if err.exists() else p.exitcode
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_only_adapters_train(lora_runs):
    res = lora_runs[0]
    # 2 layers × 7 target modules × (A, B); the base weights are frozen and not in the optimizer.
    assert len(res["trainable"]) == 2 * 7 * 2 and all(".lora_" in n for n in res["trainable"])
    assert res["optimizer_params"] == 28 < res["num_params"]
    assert res["base_changed"] == []
    assert res["lora_B_norm"] > 0  # B starts at zero; training moved it
    assert all(s["train/grad_norm"] > 0 for s in res["steps"])


def test_starts_as_the_base_model_then_moves(lora_runs):
    res = lora_runs[0]
    assert res["init_vs_base"] <= TOL  # B = 0: exactly the base model's log-probs
    assert res["trained_vs_base"] > 1e-3


def test_weight_sync_moves_only_the_adapter(lora_runs):
    pushed = lora_runs[0]["pushed"]
    assert len(pushed) == 28
    for name, shape in pushed:
        assert name.startswith("base_model.model.model.layers.") and name.endswith((".lora_A.weight", ".lora_B.weight"))
        assert name.split(".")[-3] in TARGETS
        assert shape[0] == 4 if ".lora_A." in name else shape[1] == 4
    assert lora_runs[1]["pushed"] == pushed  # every rank walks the same gather


def test_exports_load_in_peft_and_transformers(lora_runs):
    res = lora_runs[0]
    assert {"adapter_config.json", "adapter_model.safetensors", "merged"} <= set(res["export_files"])
    assert res["peft_diff"] <= TOL
    assert res["merged_diff"] <= TOL
