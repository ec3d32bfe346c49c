"""LoRA on the engine side: the reference engine serves base + adapter, `LoraWeightUpdater` moves only the adapter.

The adapter is random A and B under PEFT names; the expected log-probs are the base model's forward with
`W + (alpha/r)·B A` merged in by hand (fp32, tolerance 1e-5 as for the base engine).
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


def _adapter(base_dir, seed):
    """Random (non-zero) A and B for every target module of the tiny Qwen3, as PEFT-named buckets, and the
    reference: the base model with `W + (alpha/r)·B A` merged in by hand (no peft involved)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    bucket = []
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in TARGETS:
                a = torch.randn(4, module.in_features) * 0.1
                b = torch.randn(module.out_features, 4) * 0.1
                bucket += [(f"base_model.model.{name}.lora_A.weight", a), (f"base_model.model.{name}.lora_B.weight", b)]
                module.weight += (8.0 / 4) * (b @ a)
    return [bucket], model


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
    (first_buckets, first), (second_buckets, second) = _adapter(tiny_qwen3_dir, 1), _adapter(tiny_qwen3_dir, 2)
    cfg = _cfg(hf_checkpoint=str(tiny_qwen3_dir), update_weight_disk_dir=str(tmp_path / "sync"))
    updater = LoraWeightUpdater(cfg, RolloutClient([url]))

    async def scenario():
        plain = RolloutClient([url])
        adapted = RolloutClient([url], lora_name=LORA_NAME)  # what get_client(args) builds with --lora-rank
        with pytest.raises(EngineError, match="not loaded"):
            await _greedy(adapted)
        await updater.aupdate(first_buckets, "1")
        assert await plain.get_weight_versions() == ["1"]
        # Concurrent base and adapter requests: each batch runs one adapter, each reply its own model's numbers.
        (ids_a, lp_a), (ids_b, lp_b) = await asyncio.gather(_greedy(adapted), _greedy(plain))
        await updater.aupdate(second_buckets, "2")
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
