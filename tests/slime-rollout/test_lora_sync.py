"""LoRA on the engine side: the reference engine serves base + adapter, `LoraWeightUpdater` moves only the adapter.

The adapter comes from peft itself (random A and B, PEFT files); the expected log-probs are peft's forward on
the same tiny Qwen3 (fp32, tolerance 1e-5 as for the base engine).
"""

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_core.config import SlimeArgs
from slime_core.lora import LORA_NAME
from slime_rollout.client import EngineClient, EngineError, RolloutClient
from slime_rollout.engines.launch import build_sglang_command, lora_server_args
from slime_rollout.lora_sync import LoraWeightUpdater

LOGPROB_ATOL = 1e-5
PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]
TARGETS = ["q_proj", "v_proj", "down_proj"]


def _cfg(**fields):
    base = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp", "lora_rank": 4, "lora_alpha": 8.0,
            "lora_target_modules": TARGETS}  # fmt: skip
    return SlimeArgs.from_dict({**base, **fields})


def _peft_model(base_dir, seed):
    """A peft LoRA model with random (non-zero) A and B on the tiny Qwen3."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8.0, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False)
    return get_peft_model(base, config).eval()


def _adapter_buckets(peft_model):
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model)
    return [[(f"base_model.model.{k.removeprefix('base_model.model.')}", v) for k, v in state.items()]]


def _expected(model, output_ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + output_ids])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits.float(), -1)[torch.arange(len(output_ids)), torch.tensor(output_ids)]


async def _greedy(client, **extra):
    out = await client.generate(
        {
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True},
            "return_logprob": True,
            **extra,
        }  # fmt: skip
    )
    return out["output_ids"], torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])


def test_sglang_command_enables_lora():
    cmd = build_sglang_command(_cfg(), host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=3,
                               memory_saver=False, python="py")  # fmt: skip
    i = cmd.index("--enable-lora")
    assert cmd[i : i + 9] == ["--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", *TARGETS,
                              "--max-loras-per-batch", "1"]  # fmt: skip
    assert lora_server_args(_cfg().model_copy(update={"lora_rank": 0})) == []
    assert "--max-lora-rank" not in lora_server_args(_cfg(), ["--max-lora-rank=8"])  # a pass-through flag wins


def test_reference_engine_serves_base_and_adapter_and_updater_moves_only_adapter(
    reference_engine, tiny_qwen3_dir, tmp_path
):
    url = reference_engine.urls[0]
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    first, second = _peft_model(tiny_qwen3_dir, 1), _peft_model(tiny_qwen3_dir, 2)
    cfg = _cfg(hf_checkpoint=str(tiny_qwen3_dir), update_weight_disk_dir=str(tmp_path / "sync"))
    updater = LoraWeightUpdater(cfg, RolloutClient([url]))

    async def scenario():
        plain = RolloutClient([url])
        adapted = RolloutClient([url], lora_name=LORA_NAME)  # what get_client(args) builds with --lora-rank
        with pytest.raises(EngineError, match="not loaded"):
            await _greedy(adapted)
        await updater.aupdate(_adapter_buckets(first), "1")
        assert await plain.get_weight_versions() == ["1"]
        # Concurrent base and adapter requests: each batch runs one adapter, each reply its own model's numbers.
        (ids_a, lp_a), (ids_b, lp_b) = await asyncio.gather(_greedy(adapted), _greedy(plain))
        await updater.aupdate(_adapter_buckets(second), "2")
        ids_c, lp_c = await _greedy(adapted)
        loaded = await EngineClient(url).unload_lora_adapter(LORA_NAME)
        await EngineClient(url).update_weight_version("default")  # the engine is shared with other test modules
        for c in (plain, adapted):
            await c.aclose()
        return (ids_a, lp_a), (ids_b, lp_b), (ids_c, lp_c), loaded

    (ids_a, lp_a), (ids_b, lp_b), (ids_c, lp_c), loaded = asyncio.run(scenario())
    torch.testing.assert_close(lp_a, _expected(first, ids_a), atol=LOGPROB_ATOL, rtol=0)
    torch.testing.assert_close(lp_b, _expected(base, ids_b), atol=LOGPROB_ATOL, rtol=0)
    torch.testing.assert_close(lp_c, _expected(second, ids_c), atol=LOGPROB_ATOL, rtol=0)
    assert not torch.allclose(lp_a, lp_b)  # the adapter changes the model
    assert loaded["loaded_adapters"] == {}
    # Only the newest adapter directory is kept; it holds the adapter files only (no base weights).
    assert [p.name for p in (tmp_path / "sync").iterdir()] == ["lora_v000002"]
    files = sorted(p.name for p in (tmp_path / "sync" / "lora_v000002").iterdir())
    assert files == ["adapter_config.json", "adapter_model.safetensors"]


def test_validation_resolves_and_guards_lora_sync():
    cfg = _cfg()
    assert cfg.weight_sync == "lora" and cfg.update_weight_disk_dir.endswith("weight_sync")
    with pytest.raises(ValueError, match="--lora-rank needs --train-backend fsdp"):
        _cfg(train_backend="megatron")
    with pytest.raises(ValueError, match="with --lora-rank only the adapter is synced"):
        _cfg(weight_sync="tensor")
    with pytest.raises(ValueError, match="--weight-sync lora syncs a LoRA adapter"):
        _cfg(lora_rank=0, weight_sync="lora")
