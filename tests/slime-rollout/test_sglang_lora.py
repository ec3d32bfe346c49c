"""LoRA on a real SGLang server (GPU machine only): base + adapter served together, adapter-only weight sync.

Run on the GPU machine: `uv run pytest tests/slime-rollout/test_sglang_lora.py -m sglang -s` (prints the adapter
sync time). The adapter comes from peft (random A and B) on a small random bf16 Qwen3.
"""

import asyncio
import importlib.util
import os
import time

import pytest
import torch

from slime_core.config import SlimeArgs
from slime_core.lora import LORA_NAME

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

LOGPROB_ATOL_BF16 = 0.1  # bf16 engine kernels vs an fp32 transformers forward over the same bf16 weights
PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def lora_engine(tmp_path_factory, make_tiny_qwen3):
    if importlib.util.find_spec("sglang") is None and not os.environ.get("SLIME_SGLANG_PYTHONPATH"):
        pytest.skip("needs SGLang (installed, or staged with SLIME_SGLANG_PYTHONPATH)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from slime_rollout.engines.launch import launch_engines

    model_dir = make_tiny_qwen3(
        tmp_path_factory.mktemp("small-qwen3-lora"), dtype=torch.bfloat16, hidden_size=256, intermediate_size=512,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )  # fmt: skip
    args = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "rollout_engine": "sglang", "hf_checkpoint": str(model_dir),
        "seed": 1, "sglang_args": {"disable_cuda_graph": True}, "rollout_num_gpus_per_engine": 1,
        "train_backend": "fsdp", "lora_rank": 8, "lora_alpha": 16.0, "lora_target_modules": TARGETS,
        "update_weight_disk_dir": str(tmp_path_factory.mktemp("lora-sync")),
    })  # fmt: skip
    with launch_engines(args, num_engines=1, gpus_per_engine=1, colocate=False, mem_fraction_static=0.3,
                        startup_timeout_s=600,
                        log_dir=os.environ.get("SLIME_TEST_LOG_DIR") or tmp_path_factory.mktemp("sgl-lora-logs"),
                        ) as group:  # fmt: skip
        yield args, group, model_dir


def _peft(model_dir, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16.0, target_modules=TARGETS, lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(base, config).eval()
    with torch.no_grad():  # the engine holds bf16 weights: compare against the same bf16-rounded adapter
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(p.to(torch.bfloat16).float())
    return model


def _expected(model, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + ids])).logits[0, len(PROMPT) - 1 : -1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]


async def _greedy(client):
    params = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
    out = await client.generate({"input_ids": PROMPT, "return_logprob": True, "sampling_params": params})
    return out["output_ids"], torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])


def test_sglang_serves_base_and_synced_adapter(lora_engine):
    from peft import get_peft_model_state_dict

    from slime_rollout.client import RolloutClient
    from slime_rollout.lora_sync import LoraWeightUpdater

    args, group, model_dir = lora_engine
    url = group.urls[0]
    model = _peft(model_dir, 3)
    buckets = [[(k, v.to(torch.bfloat16)) for k, v in get_peft_model_state_dict(model).items()]]
    updater = LoraWeightUpdater(args, RolloutClient([url]))

    async def go():
        t0 = time.perf_counter()
        await updater.aupdate(buckets, "1")
        seconds = time.perf_counter() - t0
        adapted, plain = RolloutClient([url], lora_name=LORA_NAME), RolloutClient([url])
        a, b = await _greedy(adapted), await _greedy(plain)
        versions = await plain.get_weight_versions()
        await updater.aupdate(buckets, "2")  # unload + load again
        for c in (adapted, plain):
            await c.aclose()
        return seconds, a, b, versions

    seconds, (ids_a, lp_a), (ids_b, lp_b), versions = asyncio.run(go())
    print(f"LoRA adapter sync (r=8, 7 modules x 2 layers) into SGLang: {seconds:.3f} s")
    assert versions == ["1"]
    torch.testing.assert_close(lp_a, _expected(model, ids_a), atol=LOGPROB_ATOL_BF16, rtol=0)
    with model.disable_adapter():
        torch.testing.assert_close(lp_b, _expected(model, ids_b), atol=LOGPROB_ATOL_BF16, rtol=0)
