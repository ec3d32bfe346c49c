"""`sp_norm`: the local spec's torch norms under `--sequence-parallel` (the TP 2 run: test_parallel_layouts_cpu.py)."""

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: E402
from megatron.core.transformer.torch_norm import WrappedTorchNorm  # noqa: E402
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules  # noqa: E402

from slime_convert import ModelArgs  # noqa: E402
from slime_train_megatron.model import build_transformer_config  # noqa: E402
from slime_train_megatron.settings import MegatronSettings  # noqa: E402
from slime_train_megatron.sp_norm import SequenceParallelTorchNorm, sequence_parallel_norms  # noqa: E402


def _config(hf_dir):
    """The run's transformer config with `sequence_parallel` on (set after its checks, which want TP > 1)."""
    settings = MegatronSettings(fp32=True, transformer_impl="local")
    config = build_transformer_config(ModelArgs.from_hf_dir(hf_dir), settings, cpu=True)
    config.sequence_parallel = True
    return config


def test_every_torch_norm_of_the_spec_and_the_final_norm_is_marked(megatron_cpu_world, tiny_hf):
    """megatron-core's `WrappedTorchNorm` asserts `not sequence_parallel`; the replacement is the same torch RMSNorm
    with its weight marked, so megatron-core sums its gradient over the TP ranks' sequence shares."""
    _, hf_dir = tiny_hf("qwen3")
    with pytest.raises(AssertionError, match="sequence parallel not supported by torch LayerNorm"):
        WrappedTorchNorm(_config(hf_dir), 64)
    config = _config(hf_dir)
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    block = sequence_parallel_norms(spec, config)
    assert isinstance(block, TransformerBlockSubmodules) and len(block.layer_specs) == 2
    assert block.layer_norm is SequenceParallelTorchNorm
    layer = block.layer_specs[0].submodules
    attention = layer.self_attention.submodules
    for norm in (layer.input_layernorm, layer.pre_mlp_layernorm, attention.q_layernorm, attention.k_layernorm):
        assert norm is SequenceParallelTorchNorm
    assert spec.submodules.input_layernorm is WrappedTorchNorm  # the given spec is left as it was
    norm = SequenceParallelTorchNorm(config, 64, eps=1e-6)
    assert isinstance(norm, torch.nn.RMSNorm) and norm.eps == 1e-6 and norm.weight.sequence_parallel is True
    x = torch.randn(3, 64)
    torch.testing.assert_close(norm(x), torch.nn.RMSNorm(64, eps=1e-6)(x), rtol=0, atol=0)
