"""`--true-on-policy-mode` on the GPU: the trainer's log-probs equal SGLang's bit for bit (issue 29).

Run on the GPU machine: `uv run pytest tests/slime-train-fsdp/test_true_on_policy_gpu.py -m sglang`. Collects on
CPU (everything heavy is imported inside the tests) and skips there. The model is a small random bf16 Qwen3 with
head_dim 128 (`make_tiny_qwen3`), served by SGLang with the mode's flags; the trainer side is the HF model with
the mirrored forward (no FSDP: one process, the same bf16 values FSDP's mixed precision would give). This
process enables SGLang's batch-invariant ops (as the trainer does), which stay on for the rest of the session.
"""

import asyncio
import os

import pytest
import torch

from slime_core.config import SlimeArgs

pytestmark = [pytest.mark.sglang, pytest.mark.gpu]

PROMPTS = [[785, 4226, 374, 220, 17, 10, 17, 28], [40, 1079, 264, 3460], [3838, 374, 279, 6722, 315, 9625, 30] * 40]
MAX_NEW = 40


@pytest.fixture(scope="module")
def engine(tmp_path_factory, make_tiny_qwen3):
    import importlib.util

    if importlib.util.find_spec("sglang") is None and not os.environ.get("SLIME_SGLANG_PYTHONPATH"):
        pytest.skip("needs SGLang (installed, or staged with SLIME_SGLANG_PYTHONPATH)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # Engine and trainer must pick the same batch-invariant matmul (the engine inherits this environment).
    os.environ.setdefault("SGLANG_ENABLE_JIT_DEEPGEMM", "0")
    from slime_rollout.engines.launch import launch_engines

    model_dir = make_tiny_qwen3(
        tmp_path_factory.mktemp("top-qwen3"), dtype=torch.bfloat16, hidden_size=256, intermediate_size=512,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )  # fmt: skip
    args = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "rollout_engine": "sglang", "train_backend": "fsdp",
         "hf_checkpoint": str(model_dir), "seed": 1, "rollout_num_gpus_per_engine": 1, "true_on_policy_mode": True}
    )  # fmt: skip
    with launch_engines(
        args, num_engines=1, gpus_per_engine=1, colocate=False, mem_fraction_static=0.3, startup_timeout_s=600,
        log_dir=os.environ.get("SLIME_TEST_LOG_DIR") or tmp_path_factory.mktemp("top-logs"),
    ) as group:  # fmt: skip
        yield model_dir, group.urls[0]


async def _generate(url, seeds, *, concurrent=True):
    from slime_rollout.engines.client import RolloutClient

    client = RolloutClient([url])

    def one(prompt, seed):
        params = {"temperature": 0.8, "max_new_tokens": MAX_NEW, "ignore_eos": True, "sampling_seed": seed}
        return client.generate({"input_ids": prompt, "sampling_params": params, "return_logprob": True})

    pairs = [(p, s) for p in PROMPTS for s in seeds]
    if concurrent:
        outs = await asyncio.gather(*(one(p, s) for p, s in pairs))
    else:
        outs = [await one(p, s) for p, s in pairs]
    await client.aclose()
    # (prompt, response tokens, response log-probs) per request
    entries = [o["meta_info"]["output_token_logprobs"] for o in outs]
    return [(p, [e[1] for e in es], [e[0] for e in es]) for (p, _), es in zip(pairs, entries, strict=True)]


def test_same_seed_same_tokens_whatever_the_batch(engine):
    _, url = engine
    first = asyncio.run(_generate(url, [11, 12]))
    again = asyncio.run(_generate(url, [11, 12], concurrent=False))  # other batch compositions, radix-cache hits
    assert [t for _, t, _ in first] == [t for _, t, _ in again]
    assert [lp for _, _, lp in first] == [lp for _, _, lp in again]
    assert first[0][1] != first[1][1]  # different seeds draw different tokens


def test_trainer_log_probs_equal_the_engine_log_probs(engine):
    from transformers import AutoModelForCausalLM

    from slime_train_fsdp.packing import ForwardOptions, install_response_forward, pack_micro_batch, response_log_probs
    from slime_train_fsdp.true_on_policy import install_mirrored_qwen3

    model_dir, url = engine
    samples = asyncio.run(_generate(url, [21, 22]))
    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    install_response_forward(model, ForwardOptions(true_on_policy=True))
    install_mirrored_qwen3(model, device)
    seqs = [torch.tensor(p + t) for p, t, _ in samples]
    lengths = [len(t) for _, t, _ in samples]
    mb = pack_micro_batch(seqs, lengths, list(range(len(seqs))), device)
    with torch.no_grad():
        logp, _, _ = response_log_probs(model, mb, temperature=0.8, chunk_size=1024)
    engine_logp = torch.tensor([x for _, _, lp in samples for x in lp], dtype=torch.float32)
    diff = (logp.cpu() - engine_logp).abs()
    assert torch.equal(logp.cpu(), engine_logp), f"max |diff| {diff.max():.3g}, mean {diff.mean():.3g}"


def _cuda_with_sglang():
    import importlib.util

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if importlib.util.find_spec("sglang") is None and not os.environ.get("SLIME_SGLANG_PYTHONPATH"):
        pytest.skip("needs SGLang (installed, or staged with SLIME_SGLANG_PYTHONPATH)")


def test_sglang_attention_kernels_agree_with_sdpa_and_are_batch_invariant():
    """Diagnostic for the trainer side alone: the kernels compute attention, and a row's values do not depend on
    what else is packed with it (bf16 vs SDPA: 2e-2)."""
    _cuda_with_sglang()
    from slime_train_fsdp.true_on_policy.attention import MirroredAttention, plan_attention, sdpa_packed
    from slime_train_fsdp.true_on_policy.kernels import load_kernels

    device = torch.device("cuda")
    kernels = load_kernels(device)
    g = torch.Generator(device="cuda").manual_seed(0)
    lengths, prompts = [300, 45, 700], [120, 44, 10]
    t = sum(lengths)
    q = torch.randn(t, 16, 128, device=device, generator=g).bfloat16()
    k = torch.randn(t, 8, 128, device=device, generator=g).bfloat16()
    v = torch.randn(t, 8, 128, device=device, generator=g).bfloat16()
    plan = plan_attention(lengths, prompts, device, kernels.split_tile_size)
    out = MirroredAttention.apply(q, k, v, plan, 128**-0.5, kernels)
    torch.testing.assert_close(out, sdpa_packed(q, k, v, lengths, 128**-0.5), atol=2e-2, rtol=2e-2)
    # The last sequence alone gives bit-identical rows.
    alone = MirroredAttention.apply(
        q[-700:], k[-700:], v[-700:], plan_attention([700], [10], device, kernels.split_tile_size), 128**-0.5, kernels
    )
    assert torch.equal(alone, out[-700:])


def test_mirrored_attention_gradients_match_per_sequence_sdpa():
    """The backward's one varlen call over the row gives the gradients of causal attention per sequence (bf16
    inputs, fp32 reference; flash vs SDPA math: 2e-2)."""
    _cuda_with_sglang()
    from slime_train_fsdp.true_on_policy.attention import MirroredAttention, plan_attention, sdpa_packed
    from slime_train_fsdp.true_on_policy.kernels import load_kernels

    device = torch.device("cuda")
    kernels = load_kernels(device)
    g = torch.Generator(device="cuda").manual_seed(1)
    lengths, prompts = [300, 45, 700], [120, 44, 10]
    t = sum(lengths)
    leaves = [torch.randn(t, h, 128, device=device, generator=g).bfloat16().requires_grad_(True) for h in (16, 8, 8)]
    grad = torch.randn(t, 16, 128, device=device, generator=g).bfloat16()
    plan = plan_attention(lengths, prompts, device, kernels.split_tile_size)
    MirroredAttention.apply(*leaves, plan, 128**-0.5, kernels).backward(grad)
    refs = [x.detach().float().requires_grad_(True) for x in leaves]
    sdpa_packed(*refs, lengths, 128**-0.5).backward(grad.float())
    for name, x, ref in zip("qkv", leaves, refs, strict=True):
        assert x.grad.abs().max() > 0, name
        torch.testing.assert_close(x.grad.float(), ref.grad, atol=2e-2, rtol=2e-2, msg=lambda m, n=name: f"d{n}: {m}")


def test_trainer_log_probs_do_not_depend_on_packing(engine):
    from transformers import AutoModelForCausalLM

    from slime_train_fsdp.packing import ForwardOptions, install_response_forward, pack_micro_batch, response_log_probs
    from slime_train_fsdp.true_on_policy import install_mirrored_qwen3

    model_dir, url = engine
    samples = asyncio.run(_generate(url, [31]))
    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    install_response_forward(model, ForwardOptions(true_on_policy=True))
    install_mirrored_qwen3(model, device)
    seqs = [torch.tensor(p + t) for p, t, _ in samples]
    lengths = [len(t) for _, t, _ in samples]
    with torch.no_grad():
        packed, _, _ = response_log_probs(model, pack_micro_batch(seqs, lengths, list(range(len(seqs))), device),
                                          temperature=0.8, chunk_size=7)  # fmt: skip
        alone = [response_log_probs(model, pack_micro_batch([s], [n], [0], device), temperature=0.8, chunk_size=1024)[0]
                 for s, n in zip(seqs, lengths, strict=True)]  # fmt: skip
    assert torch.equal(packed, torch.cat(alone))
