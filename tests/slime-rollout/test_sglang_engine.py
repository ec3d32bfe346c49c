"""The same client, launcher and weight updaters against a real SGLang server (GPU machine only).

Run on the GPU machine: `uv run pytest tests/slime-rollout/test_sglang_engine.py -m sglang`.
The model is a small random Qwen3 (bf16) so the test does not depend on downloads.
"""

import asyncio
import shutil
import types

import pytest
import torch

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

# bf16 engine kernels vs an fp32 transformers forward over the same bf16 weights.
LOGPROB_ATOL_BF16 = 0.1


@pytest.fixture(scope="module")
def small_qwen3_dir(tmp_path_factory, qwen3_tokenizer_dir):
    pytest.importorskip("sglang")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = tmp_path_factory.mktemp("small-qwen3")
    cfg = Qwen3Config(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=151936,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=151645,
        bos_token_id=151643,
        pad_token_id=151643,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_tokenizer_dir / f, out / f)
    return out


@pytest.fixture(scope="module")
def sglang_engine(small_qwen3_dir, tmp_path_factory):
    from slime_rollout.engines.launch import launch_engines

    args = types.SimpleNamespace(
        rollout_engine="sglang",
        hf_checkpoint=str(small_qwen3_dir),
        seed=1,
        sglang_mem_fraction_static=0.3,
        sglang_args={"disable_cuda_graph": True},
        rollout_num_gpus_per_engine=1,
    )
    with launch_engines(
        args, num_engines=1, gpus_per_engine=1, startup_timeout_s=600, log_dir=tmp_path_factory.mktemp("sgl-logs")
    ) as group:
        yield args, group


PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]


async def _greedy(url, n=6):
    from slime_rollout.client import RolloutClient

    client = RolloutClient([url])
    out = await client.generate(
        {
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True},
            "return_logprob": True,
        }
    )
    await client.aclose()
    return out


def test_generate_fields_and_logprobs(sglang_engine, small_qwen3_dir):
    from transformers import AutoModelForCausalLM

    _, group = sglang_engine
    out = asyncio.run(_greedy(group.urls[0]))
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 6
    ids = [e[1] for e in meta["output_token_logprobs"]]
    model = AutoModelForCausalLM.from_pretrained(small_qwen3_dir, dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + ids]).cuda()).logits[0, len(PROMPT) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1)[torch.arange(len(ids)), torch.tensor(ids)].cpu()
    got = torch.tensor([e[0] for e in meta["output_token_logprobs"]])
    torch.testing.assert_close(got, expected, atol=LOGPROB_ATOL_BF16, rtol=0)


def test_weight_updates_disk_tensor_distributed(sglang_engine, small_qwen3_dir, tmp_path):
    from slime_rollout.client import RolloutClient
    from slime_rollout.engines.process import find_free_port
    from slime_rollout.weight_sync import DiskWeightUpdater, DistributedWeightUpdater, TensorWeightUpdater
    from transformers import AutoModelForCausalLM

    args, group = sglang_engine
    args.update_weight_disk_dir = str(tmp_path)
    url = group.urls[0]
    client = RolloutClient([url])
    state = AutoModelForCausalLM.from_pretrained(small_qwen3_dir, dtype=torch.bfloat16).state_dict()
    g = torch.Generator().manual_seed(0)
    noisy = {k: (v.float() + 0.5 * torch.randn(v.shape, generator=g)).to(v.dtype) for k, v in state.items()}

    def buckets(sd, device="cpu"):
        items = [(k, v.to(device)) for k, v in sd.items()]
        return iter([items[i : i + 8] for i in range(0, len(items), 8)])

    def versions():
        return asyncio.run(client.get_weight_versions())

    base = asyncio.run(_greedy(url))["output_ids"]
    DiskWeightUpdater(args, client).update(buckets(noisy), "1")
    assert versions() == ["1"] and asyncio.run(_greedy(url))["output_ids"] != base
    TensorWeightUpdater(args, client).update(buckets(state, "cuda"), "2")  # CUDA IPC, flattened_bucket
    assert versions() == ["2"] and asyncio.run(_greedy(url))["output_ids"] == base
    if torch.cuda.device_count() < 2:
        pytest.skip("NCCL broadcast needs the trainer on another GPU than the engine (GPU 0)")
    dist = DistributedWeightUpdater(
        args, client, master_address="127.0.0.1", master_port=find_free_port(start=29700), backend="nccl"
    )
    dist.update(buckets(noisy, "cuda:1"), "3")
    assert versions() == ["3"] and asyncio.run(_greedy(url))["output_ids"] != base
    dist.update(buckets(state, "cuda:1"), "4")
    assert versions() == ["4"] and asyncio.run(_greedy(url))["output_ids"] == base
    asyncio.run(dist.adisconnect())


def test_abort_all(sglang_engine):
    from slime_rollout.client import RolloutClient

    _, group = sglang_engine

    async def go():
        client = RolloutClient(group.urls)
        task = asyncio.create_task(
            client.generate({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}})
        )
        await asyncio.sleep(0.5)
        await client.abort_all(timeout_s=60)
        out = await task
        assert out["meta_info"]["finish_reason"]["type"] == "abort"
        assert await client.engines[0].num_unfinished_requests() == 0

    asyncio.run(go())
