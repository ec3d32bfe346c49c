"""Fixtures for the Megatron backend tests: tiny HF models and a one-rank gloo world for megatron-core."""

from __future__ import annotations

import contextlib
import os
import socket

import pytest
import torch

TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=300, max_position_embeddings=256, rms_norm_eps=1e-6,
)  # fmt: skip
FAMILIES = {
    "qwen3": dict(head_dim=32, tie_word_embeddings=False),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    # GLM-4-0414: q/k/v biases, interleaved RoPE on half of each head, sandwich norms, fused gate_up_proj.
    "glm4": dict(
        head_dim=16,
        attention_bias=True,
        partial_rotary_factor=0.5,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """Factory: `tiny_hf(model_type) -> (fp32 HF model, dir)`; norms/biases randomized."""
    pytest.importorskip("transformers")
    import transformers

    cache: dict[str, tuple] = {}

    def make(model_type: str):
        if model_type not in cache:
            out = tmp_path_factory.mktemp(f"hf-{model_type}")
            config = transformers.AutoConfig.for_model(model_type, **TINY, **FAMILIES[model_type])
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "norm" in name or "bias" in name:
                        p.normal_(1.0 if "norm" in name else 0.0, 0.1)
            model.save_pretrained(out)
            cache[model_type] = (model, out)
        return cache[model_type]

    return make


@pytest.fixture()
def megatron_cpu_world(monkeypatch):
    """torch.distributed (gloo, world 1) + megatron parallel_state, with CPU shims for CUDA-only calls."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
    from megatron.core.transformer.moe import router

    created = not dist.is_initialized()
    if created:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    # RoPE moves its buffer to torch.cuda.current_device(); attention dropout forks the CUDA RNG; the MoE
    # router's gating GEMM is a TE kernel. On CPU: "cpu", a no-op fork, a plain linear.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(
        router,
        "router_gating_linear",
        lambda x, w, b, dtype: torch.nn.functional.linear(x.to(dtype), w.to(dtype), None if b is None else b.to(dtype)),
    )
    yield
    parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()
