"""LoRA on the FSDP backend (2 ranks, gloo, tiny Qwen3 fp32): base model at start, only adapters train and sync,
the PEFT export loads in peft, in SGLang's way of reading it, and the merged export in transformers with the
trainer's log-probs (1e-5). On a tied-embedding checkpoint with memory poisoned before the load: every tensor is
written, the LoRA model at init computes the full model's log-probs bit for bit, and its compiled layers compile
as many graphs as the full model's (one per grad mode). `--save` then `--load` restores adapters, Adam's moments and
the step exactly, from a checkpoint that holds the adapters only (or, written before, the whole model)."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import pytest
import torch

pytestmark = [
    pytest.mark.slow,  # multi-process: ranks forked (from the forkserver, _launch.py)
]

TOL = 1e-5
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


_LAUNCH = pathlib.Path(__file__).with_name("_launch.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch", _LAUNCH)
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(pathlib.Path(__file__).with_name("_lora_worker.py"))


def _run_ranks(tmp_path_factory, tokenizer_dir, scenario: str, *, tie_word_embeddings: bool) -> list[dict]:
    """Writes a tiny Qwen3 checkpoint and runs `scenario` of `_lora_worker.py` on 2 forked gloo ranks."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    ckpt = tmp_path_factory.mktemp(f"tiny_qwen3_{scenario}")
    config = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                         tie_word_embeddings=tie_word_embeddings)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(ckpt)
    for f in tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, ckpt / f.name)
    _ranks.workers()  # the worker module's import errors show here, not in a rank
    return _ranks.forked(scenario, 2, tmp_path_factory.mktemp(f"{scenario}_out"), ckpt)


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, qwen3_tokenizer_dir) -> list[dict]:
    return _run_ranks(tmp_path_factory, qwen3_tokenizer_dir, "lora", tie_word_embeddings=False)


@pytest.fixture(scope="module")
def init_runs(tmp_path_factory, qwen3_tokenizer_dir) -> list[dict]:
    # Tied embeddings as Qwen3-0.6B: lm_head and embed_tokens are one parameter under two names.
    return _run_ranks(tmp_path_factory, qwen3_tokenizer_dir, "init", tie_word_embeddings=True)


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory, qwen3_tokenizer_dir) -> list[dict]:
    return _run_ranks(tmp_path_factory, qwen3_tokenizer_dir, "resume", tie_word_embeddings=False)


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory, qwen3_tokenizer_dir) -> list[dict]:
    return _run_ranks(tmp_path_factory, qwen3_tokenizer_dir, "reference", tie_word_embeddings=False)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_kl_reference_is_the_base_model_on_every_rank(reference_runs, kind):
    # With 2 ranks the reference forward stopped on "The size of tensor a (64) must match the size of tensor b (32)":
    # FSDP2 keeps the root's parameters (embeddings, final norm, head) gathered after a no-grad forward, so the swap
    # copied the held shards into whole tensors (and back). One rank never showed it: a shard is the whole tensor.
    for res in reference_runs:
        assert res[f"{kind}_ref_vs_base"] <= TOL
        assert res[f"{kind}_ref_vs_base_after_step"] <= TOL  # LoRA: the base without the trained adapter
        assert res[f"{kind}_actor_vs_base_after_step"] > 1e-3
        assert all(kl is not None for kl in res[f"{kind}_kl_steps"])


def test_a_lora_checkpoint_holds_the_adapters_only(resume_runs):
    # The frozen base is --hf-checkpoint's: each save wrote the whole model (here 25 base tensors, for a real model
    # gigabytes) besides the adapters, as the original's FSDP LoRA (which saved `adapter/`) never did.
    saved = resume_runs[0]["adapters"]["saved_model_keys"]
    assert len(saved) == 2 * 7 * 2 and all(".lora_A." in k or ".lora_B." in k for k in saved)
    assert len(resume_runs[0]["whole"]["saved_model_keys"]) == 28 + 25  # the layout before: base tensors too


@pytest.mark.parametrize("layout", ["adapters", "whole"])
def test_save_then_load_restores_adapters_optimizer_and_step(resume_runs, layout):
    for res in (r[layout] for r in resume_runs):
        assert res["start"] == 1 and res["steps"] == (2, 2)  # 2 optimizer steps per rollout
        assert res["params_equal"] and res["optimizer_equal"] and res["num_optimizer_tensors"] == 28 * 2
        assert res["ref_equal"] and res["ref_moved"] > 1e-3  # the updated reference, not the base, resumes
        # The next rollout continues: the same loss and the same weights after it, bit for bit.
        assert res["next_loss"][0] == res["next_loss"][1]
        assert res["params_equal_after_step"]


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


def test_engines_read_the_synced_adapter_as_the_trainer_computes(lora_runs):
    res = lora_runs[0]
    # The trained adapter (B != 0) read by SGLang's rules (stacked q/k/v and gate/up, alpha / r) is the trainer's
    # model; the weight sync's buckets are the exported tensors.
    assert res["sglang_diff"] <= TOL
    assert res["pushed_equals_export"]


def test_every_tensor_is_loaded_over_poisoned_memory(init_runs):
    for res in init_runs:
        assert res["full_non_finite"] == [] and res["lora_non_finite"] == []


def test_lora_at_init_is_the_full_model_bit_for_bit(init_runs):
    for res in init_runs:
        # B = 0: x Aᵀ Bᵀ is exactly 0, so the packed forward is the full model's to the last bit.
        assert res["lora_equals_full"] and res["lora_vs_full"] == 0.0
        assert res["lora_vs_hf"] <= TOL


def test_compiled_layers_compile_once_per_grad_mode_under_lora(init_runs):
    for res in init_runs:
        # Frozen embeddings used to hand layer 0 a hidden state that does not require grad and the others one
        # that does; dynamo guards on it and compiled a third graph (on the GPU run: the recompile limit).
        assert res["layer_input_requires_grad"] == {True: [{True}, {True}], False: [{False}, {False}]}
        assert res["lora_graphs"] == res["full_graphs"] == 2
