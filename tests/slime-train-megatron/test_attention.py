"""slime's packed core attention for megatron-core's local spec (`slime_train_megatron.attention`).

CPU: the kernel against a dense block-causal softmax written here in float64; the backend with the packed
attention (default) against megatron-core's DotProductAttention with a dense mask (`--attention-backend local`):
same log-probs, losses and gradients on packed micro-batches of several sequences. GPU (`gpu and megatron`): the
flash varlen kernel against the exact per-sequence path.
"""

import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_train_megatron.settings import MegatronSettings

pytest.importorskip("megatron.core")

from slime_train_megatron.attention import attention_kind, packed_causal_attention  # noqa: E402


def _reference(q, k, v, lengths, scale):
    """Dense float64 softmax over the whole row with a block-diagonal causal mask (K/V repeated to all heads)."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    n = q.shape[0]
    allowed = (seg[:, None] == seg[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _qkv(lengths, heads=4, kv_heads=2, dim=16, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    return [torch.randn(n, h, dim, generator=g).to(device, dtype) for h in (heads, kv_heads, kv_heads)]


def _cu(lengths, device="cpu"):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def test_packed_attention_equals_dense_block_causal_softmax():
    lengths = [5, 1, 9, 3]
    q, k, v = _qkv(lengths)
    scale = 16**-0.5
    out = packed_causal_attention(q, k, v, _cu(lengths), max(lengths), scale=scale)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference(q, k, v, lengths, scale), atol=1e-6, rtol=0)  # fp32 vs fp64
    # Host lengths given (the backend's no-sync path) or derived from cu_seqlens: the same computation.
    assert torch.equal(out, packed_causal_attention(q, k, v, _cu(lengths), 9, scale=scale, lengths=lengths))


def test_no_attention_across_sequences():
    lengths = [6, 7]
    q, k, v = _qkv(lengths)
    out = packed_causal_attention(q, k, v, _cu(lengths), 7, scale=0.25)
    k2, v2 = k.clone(), v.clone()
    k2[6:] += 1.0
    v2[6:] -= 2.0  # only the second sequence's keys and values change
    out2 = packed_causal_attention(q, k2, v2, _cu(lengths), 7, scale=0.25)
    assert torch.equal(out[:6], out2[:6])
    assert (out[6:] - out2[6:]).abs().min() > 1e-3


def test_bad_shapes_raise():
    q, k, v = _qkv([4, 4], heads=3, kv_heads=2)
    with pytest.raises(ValueError, match="not a multiple"):
        packed_causal_attention(q, k, v, _cu([4, 4]), 4, scale=1.0)
    q, k, v = _qkv([4, 4])
    with pytest.raises(ValueError, match="sum to 7"):
        packed_causal_attention(q, k, v, _cu([4, 3]), 4, scale=1.0)


@pytest.mark.parametrize(
    ("backend", "te", "cp", "expected"),
    [
        ("auto", False, 1, "packed"),
        ("flash", False, 1, "packed"),
        ("local", False, 1, "dense"),
        ("auto", True, 2, "transformer_engine"),
        ("fused", True, 1, "transformer_engine"),
        ("fused", False, 1, "Transformer Engine backend"),
        ("unfused", False, 1, "Transformer Engine backend"),
        ("local", True, 1, "needs --transformer-impl local"),
        ("auto", False, 2, "context-parallel-size"),
        ("local", False, 2, "context-parallel-size"),
    ],
)
def test_attention_kind(backend, te, cp, expected):
    settings = MegatronSettings(attention_backend=backend, context_parallel_size=cp)
    if expected in ("packed", "dense", "transformer_engine"):
        assert attention_kind(settings, te) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            attention_kind(settings, te)


def test_flag_is_parsed_from_megatron_args():
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
    assert MegatronSettings.from_config(cfg).attention_backend == "auto"
    s = MegatronSettings.from_config(cfg.model_copy(update={"megatron_args": ["--attention-backend", "local"]}))
    assert s.attention_backend == "local"
    with pytest.raises(ValueError, match=r"--attention-backend sdpa: Input should be .auto., .flash."):
        MegatronSettings.from_config(cfg.model_copy(update={"megatron_args": ["--attention-backend", "sdpa"]}))


def test_module_rejects_what_it_does_not_implement(megatron_cpu_world):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from slime_train_megatron.attention import PackedCoreAttention

    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, attention_dropout=0.1)
    with pytest.raises(ValueError, match="attention dropout 0.1"):
        PackedCoreAttention(config, 1, AttnMaskType.causal, "self")
    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4, attention_dropout=0.0)
    with pytest.raises(ValueError, match="attention mask type padding"):
        PackedCoreAttention(config, 1, AttnMaskType.padding, "self")
    assert PackedCoreAttention(config, 1, AttnMaskType.causal, "self").softmax_scale == pytest.approx(8**-0.5)


def _packed_batch():
    """Two optimizer steps; micro-batches of 3 and 2 sequences of different lengths (several per packed row)."""
    g = torch.Generator().manual_seed(3)
    lengths, resp = [9, 14, 6, 11, 17, 8, 12, 10], [4, 6, 2, 5, 9, 3, 7, 4]
    tokens = [torch.randint(1, 300, (n,), generator=g) for n in lengths]
    rewards = [1.0, -1.0, 0.5, -0.5, 1.0, 0.0, -1.0, 0.25]
    return RolloutBatch(
        tokens=tokens, response_lengths=resp, loss_masks=[torch.ones(r) for r in resp], rewards=rewards,
        raw_rewards=rewards, loss_denominators=[float(r) for r in resp],
        micro_batches=[[[0, 1, 2], [3]], [[4, 5], [6, 7]]], step_sample_counts=[4, 4],
        step_token_counts=[float(sum(resp[:4])), float(sum(resp[4:]))],
    )  # fmt: skip


def _run(env, hf_dir, attention_backend):
    args = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3",
                          "--attention-backend", attention_backend],
        "advantage_estimator": "grpo", "rollout_temperature": 0.9, "kl_coef": 0.0, "use_kl_loss": False,
        "entropy_coef": 0.01, "eps_clip": 0.2,
    })  # fmt: skip
    backend = env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    batch = _packed_batch()
    log_probs = backend.compute_log_probs(batch)
    backend.train(0, batch)
    # After train(): the DDP buffers hold the last optimizer step's gradients.
    grads = {n: p.main_grad.clone() for n, p in backend.module.named_parameters()}
    return backend, log_probs, backend.step_metrics, grads


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2"])
def test_backend_packed_attention_equals_dense_mask(model_type, cpu_backend_env, tiny_hf):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from slime_train_megatron.attention import PackedCoreAttention

    _, hf_dir = tiny_hf(model_type)
    packed, lp_packed, metrics_packed, grads_packed = _run(cpu_backend_env, hf_dir, "auto")
    dense, lp_dense, metrics_dense, grads_dense = _run(cpu_backend_env, hf_dir, "local")
    assert packed.attention == "packed" and dense.attention == "dense"
    core = [type(layer.self_attention.core_attention) for layer in packed.module.decoder.layers]
    assert core == [PackedCoreAttention] * 2
    assert type(dense.module.decoder.layers[0].self_attention.core_attention) is DotProductAttention
    # fp32 throughout; RoPE positions restart per sequence on the packed path and run on along the row on the
    # dense one (equal in exact arithmetic): 1e-5.
    for a, b in zip(lp_packed, lp_dense, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert len(metrics_packed) == len(metrics_dense) == 2
    for step_p, step_d in zip(metrics_packed, metrics_dense, strict=True):
        assert step_p.keys() == step_d.keys()
        for key in ("train/loss", "train/pg_loss", "train/entropy_loss", "train/grad_norm"):
            assert step_p[key] == pytest.approx(step_d[key], rel=1e-5, abs=1e-6), key
        assert step_p["train/grad_norm"] > 0
    assert grads_packed.keys() == grads_dense.keys()
    for name, grad in grads_packed.items():
        torch.testing.assert_close(grad, grads_dense[name], atol=1e-5, rtol=1e-4, msg=name)
    assert any(g.abs().max() > 1e-3 for g in grads_packed.values())


@pytest.mark.gpu
@pytest.mark.megatron
def test_cuda_varlen_kernel_equals_exact_path():
    """bf16 flash varlen (native GQA) vs the exact per-sequence path in fp32: outputs and input gradients."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    lengths = [1024, 300, 1, 777, 2000]
    q, k, v = _qkv(lengths, heads=16, kv_heads=8, dim=128, device="cuda")
    cu = _cu(lengths, "cuda")
    grad_out = torch.randn_like(q)

    def run(dtype):
        x = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = packed_causal_attention(*x, cu, max(lengths), scale=128**-0.5)
        (out.float() * grad_out).sum().backward()
        return out.float(), [t.grad.float() for t in x]

    out_bf16, grads_bf16 = run(torch.bfloat16)  # varlen_attn
    out_fp32, grads_fp32 = run(torch.float32)  # per-sequence SDPA
    # bf16 inputs and kernel vs fp32: 2e-2 absolute on O(1) values (unit-variance inputs).
    torch.testing.assert_close(out_bf16, out_fp32, atol=2e-2, rtol=0)
    for got, want, name in zip(grads_bf16, grads_fp32, "qkv", strict=True):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2, msg=name)
