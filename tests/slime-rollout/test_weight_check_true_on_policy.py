"""Weight checks under `--true-on-policy-mode`: SGLang holds embeddings and norms in fp32, the rest in bf16."""

import torch

from slime_rollout.engines.weight_checksum import tensor_checksum
from slime_rollout.weight_sync.check import PushChecksums


def test_embeddings_and_norms_are_hashed_as_the_engine_holds_them():
    g = torch.Generator().manual_seed(0)
    push = [
        ("model.embed_tokens.weight", torch.randn(8, 4, generator=g).bfloat16()),
        ("model.layers.0.input_layernorm.weight", torch.randn(4, generator=g).bfloat16()),
        ("model.layers.0.self_attn.q_norm.weight", torch.randn(2, generator=g).bfloat16()),
        ("model.layers.0.mlp.down_proj.weight", torch.randn(4, 6, generator=g).bfloat16()),
    ]
    sample = PushChecksums(100, seed=0, dtype=torch.bfloat16, fp32_params=True)
    list(sample.watch(iter([list(push)])))
    # The engine's fp32 parameters hold the pushed bf16 values exactly; its linear weights stay bf16.
    expected = {
        "model.embed_tokens.weight": tensor_checksum(push[0][1].float()),
        "model.layers.0.input_layernorm.weight": tensor_checksum(push[1][1].float()),
        "model.layers.0.self_attn.q_norm.weight": tensor_checksum(push[2][1].float()),
        "model.layers.0.mlp.down_proj.weight": tensor_checksum(push[3][1]),
    }
    assert sample.checksums == expected
    plain = PushChecksums(100, seed=0, dtype=torch.bfloat16)
    list(plain.watch(iter([list(push)])))
    assert plain.checksums["model.embed_tokens.weight"] == tensor_checksum(push[0][1])  # off: bf16 as before
