"""The same client, launcher and weight updaters against a real SGLang server (GPU machine only).

Run on the GPU machine: `uv run pytest tests/slime-rollout/test_sglang_engine.py -m sglang`.
The model is a small random Qwen3 (bf16) so the test does not depend on downloads.
"""

import asyncio
import os

import pytest
import torch

from slime_core.config import SlimeArgs

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

# bf16 engine kernels vs an fp32 transformers forward over the same bf16 weights.
LOGPROB_ATOL_BF16 = 0.1


@pytest.fixture(scope="module")
def small_qwen3_dir(tmp_path_factory, make_tiny_qwen3):
    # On the staged GPU machine SGLang lives in its own site dir (SLIME_SGLANG_PYTHONPATH), not importable here.
    import importlib.util

    if importlib.util.find_spec("sglang") is None and not os.environ.get("SLIME_SGLANG_PYTHONPATH"):
        pytest.skip("needs SGLang (installed, or staged with SLIME_SGLANG_PYTHONPATH)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # head_dim 128 / 8 KV heads: the shapes whose SGLang JIT kernels the staging caches.
    return make_tiny_qwen3(
        tmp_path_factory.mktemp("small-qwen3"), dtype=torch.bfloat16, hidden_size=256, intermediate_size=512,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )  # fmt: skip


@pytest.fixture(scope="module")
def sglang_engine(small_qwen3_dir, tmp_path_factory):
    from slime_rollout.engines.launch import launch_engines

    args = SlimeArgs.from_dict(
        {
            "rollout_batch_size": 1,
            "num_rollout": 1,
            "rollout_engine": "sglang",
            "hf_checkpoint": str(small_qwen3_dir),
            "seed": 1,
            "sglang_args": {"disable_cuda_graph": True},
            "rollout_num_gpus_per_engine": 1,
        }
    )
    # colocate=True: memory saver on, as when the trainer shares the GPU (release/resume is tested below).
    with launch_engines(
        args,
        num_engines=1,
        gpus_per_engine=1,
        colocate=True,
        mem_fraction_static=0.3,
        startup_timeout_s=600,
        # SLIME_TEST_LOG_DIR: keep the engine logs where a GPU session collects them.
        log_dir=os.environ.get("SLIME_TEST_LOG_DIR") or tmp_path_factory.mktemp("sgl-logs"),
    ) as group:
        yield args, group


PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]


async def _greedy(url, n=6):
    from slime_rollout.engines.client import RolloutClient

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
    from transformers import AutoModelForCausalLM

    from slime_rollout.engines.client import RolloutClient
    from slime_rollout.engines.process import find_free_port
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater, DistributedWeightUpdater, TensorWeightUpdater

    args, group = sglang_engine
    args = args.model_copy(update={"update_weight_disk_dir": str(tmp_path)})
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
    from slime_rollout.engines.client import RolloutClient

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


def test_release_and_resume_memory(sglang_engine):
    """release_memory_occupation really frees the engine's GPU memory; resume takes it back."""
    from slime_rollout.engines.client import RolloutClient

    _, group = sglang_engine
    client = RolloutClient(group.urls)

    def free_gib():
        torch.cuda.synchronize()
        return torch.cuda.mem_get_info()[0] / 2**30

    async def call(method, **kw):
        await client.broadcast(method, **kw)

    greedy_before = asyncio.run(_greedy(group.urls[0]))["output_ids"]
    before = free_gib()
    asyncio.run(call("flush_cache"))
    asyncio.run(call("release_memory_occupation"))
    released = free_gib()
    asyncio.run(call("resume_memory_occupation"))
    resumed = free_gib()
    print(f"GPU free memory: {before:.2f} GiB -> released {released:.2f} GiB -> resumed {resumed:.2f} GiB")
    # mem fraction 0.3 of a 141 GB card: tens of GiB of KV cache; at least 10 GiB must come back.
    assert released - before > 10
    assert released - resumed > 10
    # Resumed weights memory holds no weights (no CPU backup): the trainer always pushes them next, as here.
    from transformers import AutoModelForCausalLM

    from slime_rollout.weight_sync.updaters import TensorWeightUpdater

    args, _ = sglang_engine
    state = AutoModelForCausalLM.from_pretrained(args.hf_checkpoint, dtype=torch.bfloat16).state_dict()
    TensorWeightUpdater(args, client).update(iter([[(k, v.cuda()) for k, v in state.items()]]), "after-resume")
    assert asyncio.run(_greedy(group.urls[0]))["output_ids"] == greedy_before


def test_first_step_trainer_logprobs_match_engine(sglang_engine, small_qwen3_dir, tmp_path):
    """Rollout log-probs from SGLang vs the FSDP trainer's log-probs of the same tokens (bf16 both sides)."""
    import os

    import torch.distributed as dist

    from slime_core.config import parse_args
    from slime_core.sample import Sample
    from slime_core.train_data import build_rollout_batches
    from slime_train_fsdp import FSDPTrainBackend

    _, group = sglang_engine
    prompts = [[785, 4226, 374, 220, 17, 10, 17, 28], [9707, 11, 1879, 0, 3555, 374, 220, 18, 9, 19]]
    samples = []
    for i, prompt in enumerate(prompts * 4):
        out = asyncio.run(_sample(group.urls[0], prompt))
        s = Sample(prompt="", tokens=list(prompt), index=i, group_index=i // 2, reward=float(i % 2))
        lps = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
        ids = [e[1] for e in out["meta_info"]["output_token_logprobs"]]
        s.append_response_tokens(ids, log_probs=lps, meta_info=out["meta_info"])
        samples.append(s)
    args = parse_args(
        [
            "--train-backend", "fsdp", "--hf-checkpoint", str(small_qwen3_dir), "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--global-batch-size", "8", "--num-rollout", "1",
            "--rollout-max-response-len", "32", "--rollout-temperature", "1.0", "--lr", "1e-6",
            "--rollout-engine", "sglang", "--bf16",
        ]
    )  # fmt: skip
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        backend = FSDPTrainBackend()
        backend.init(args, with_ref=False)
        (batch,) = build_rollout_batches(args, samples, dp_size=1)
        trainer = torch.cat(backend.compute_log_probs(batch))
        engine = torch.cat(batch.rollout_log_probs)
        diff = (trainer - engine).abs()
        print(f"first step |trainer - rollout| log-prob: mean {diff.mean():.4g}, max {diff.max():.4g}")
        # Which side is off? Both against an fp32 transformers forward of the same tokens.
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(small_qwen3_dir, dtype=torch.float32).cuda().eval()
        ref = []
        with torch.no_grad():
            for tokens, n in zip(batch.tokens, batch.response_lengths, strict=True):
                logits = hf(input_ids=tokens[None].cuda()).logits[0, -n - 1 : -1].float()
                ref.append(torch.log_softmax(logits, -1).gather(-1, tokens[-n:, None].cuda())[:, 0].cpu())
        ref = torch.cat(ref)
        print(
            f"vs fp32 HF: engine mean {(engine - ref).abs().mean():.4g} max {(engine - ref).abs().max():.4g}; "
            f"trainer mean {(trainer - ref).abs().mean():.4g} max {(trainer - ref).abs().max():.4g}"
        )
        print("engine ", [round(x, 3) for x in engine[:8].tolist()])
        print("trainer", [round(x, 3) for x in trainer[:8].tolist()])
        print("hf fp32", [round(x, 3) for x in ref[:8].tolist()])
        assert diff.mean() < 0.05 and diff.max() < 0.5  # bf16 kernels on both sides
    finally:
        dist.destroy_process_group()


async def _sample(url, prompt):
    from slime_rollout.engines.client import RolloutClient

    client = RolloutClient([url])
    out = await client.generate(
        {
            "input_ids": prompt,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 32, "ignore_eos": True},
            "return_logprob": True,
        }
    )
    await client.aclose()
    return out


def test_weight_content_check_against_sglang_checksums(sglang_engine, small_qwen3_dir):
    """`/weights_checker` on the real server: every parameter's checksum equals ours of the checkpoint's bytes.

    All of them (k = all), fused `qkv_proj` / `gate_up_proj` included, so a naming or fusing rule that SGLang does
    not follow fails here, not silently in a run.
    """
    from slime_rollout.engines.client import EngineClient
    from slime_rollout.weight_sync.check import PushChecksums, check_engines, engine_checksums

    _, group = sglang_engine

    async def go():
        engine = EngineClient(group.urls[0], timeout=60)
        try:
            ranks = await engine_checksums(engine)
            names = set().union(*ranks)
            expected = PushChecksums.from_checkpoint(
                small_qwen3_dir, len(names), seed=0, dtype=torch.bfloat16, engine_names=names
            )
            return names, expected, await check_engines([engine], expected.checksums)
        finally:
            await engine.aclose()

    names, expected, report = asyncio.run(go())
    print(f"sglang weights_checker: {len(names)} names, {report}")
    assert report.mismatches == [] and report.checked == len(names) == len(expected.checksums)
    assert expected.unmatched == 0  # every checkpoint tensor has its SGLang name (tied lm_head: not in the file)
