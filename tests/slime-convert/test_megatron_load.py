"""The converted checkpoint loads into a real megatron-core GPTModel (local spec, CPU, gloo world of 1)."""

import contextlib
import os

import pytest
import torch

from slime_convert import ModelArgs, hf_to_mcore

pytest.importorskip("transformers")
pytest.importorskip("megatron.core")


@pytest.fixture(scope="module")
def megatron_world():
    import torch.distributed as dist
    from megatron.core import parallel_state

    created = not dist.is_initialized()
    if created:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29631")
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()


def _build_gpt(args: ModelArgs):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    kwargs = args.transformer_config_kwargs()
    kwargs["activation_func"] = torch.nn.functional.silu
    config = TransformerConfig(
        **kwargs,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = get_gpt_layer_local_spec(
        num_experts=args.num_experts, qk_layernorm=args.qk_layernorm, normalization="RMSNorm"
    )
    return GPTModel(config=config, transformer_layer_spec=spec, **args.gpt_model_kwargs()).eval()


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "llama", "qwen3_moe"])
def test_converted_checkpoint_loads_strictly_and_matches_hf_logits(
    model_type, tiny_hf_model, tmp_path, megatron_world, monkeypatch
):
    from megatron.core import dist_checkpointing

    hf_model, hf_dir = tiny_hf_model(model_type)
    ckpt = hf_to_mcore(hf_dir, tmp_path / "mcore", progress=False)
    args = ModelArgs.from_hf_dir(hf_dir)
    model = _build_gpt(args)
    # Megatron-LM nests the model under "model"; common.pt entries come back beside it.
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt))
    assert state["checkpoint_version"] == 3.0
    missing, unexpected = model.load_state_dict(state["model"], strict=True)
    assert not missing and not unexpected

    # megatron-core's RoPE moves its buffer to torch.cuda.current_device(); on CPU point it at "cpu".
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    # The attention-dropout RNG fork needs CUDA RNG state; dropout is 0 and the model is in eval mode.
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    monkeypatch.setattr(get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
    if args.is_moe:
        # megatron-core's own router GEMM runs (its torch `mm` path, as `slime_train_megatron.model` selects in a run
        # without Transformer Engine): the module defines `te_general_gemm` only when TE imports.
        from megatron.core.transformer.moe import moe_utils

        if not hasattr(moe_utils, "te_general_gemm"):
            monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    tokens = torch.tensor([[1, 5, 77, 299, 3, 150, 42, 8]])
    positions = torch.arange(tokens.shape[1])[None]
    # Megatron masks where the mask is True (strictly upper triangle = future tokens); passing it avoids
    # megatron building its default mask on CUDA.
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), diagonal=1)[None, None]
    with torch.no_grad():
        logits = model(tokens, positions, attention_mask=mask)  # [1, T, V_pad]
        expected = hf_model(tokens).logits  # [1, T, V]
    assert logits.shape == (1, 8, args.padded_vocab_size(1))
    # fp32 end to end; tolerance 1e-4 absolute covers summation-order differences.
    torch.testing.assert_close(logits[..., : args.vocab_size], expected, atol=1e-4, rtol=0)
