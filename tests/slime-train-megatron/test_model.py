"""CPU checks of the Megatron model path: build from HF config, direct HF load, HF export, THD log-probs."""

import dataclasses

import pytest
import torch

from slime_convert import ModelArgs
from slime_train_megatron.logprobs import vocab_parallel_log_probs
from slime_train_megatron.packing import pack_thd
from slime_train_megatron.settings import MegatronSettings

pytest.importorskip("megatron.core")


def _build(hf_dir):
    from slime_train_megatron.model import build_gpt_model, build_transformer_config, load_hf_weights

    model_args = ModelArgs.from_hf_dir(hf_dir)
    # allgather named: what the CPU model runs for alltoall too (`model.moe_token_dispatcher`; test_moe_cpu.py).
    settings = MegatronSettings(fp32=True, transformer_impl="local", moe_token_dispatcher_type="allgather")
    model = build_gpt_model(model_args, settings, build_transformer_config(model_args, settings, cpu=True)).eval()
    load_hf_weights(model, str(hf_dir), model_args, settings)
    return model, model_args


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "qwen3_moe", "glm4", "llama"])
def test_direct_hf_load_export_and_logits(model_type, tiny_hf, megatron_cpu_world):
    from safetensors.torch import load_file

    from slime_train_megatron.model import iter_hf_weights

    hf_model, hf_dir = tiny_hf(model_type)
    model, model_args = _build(hf_dir)

    # Export == the HF checkpoint, bit for bit (names, shapes, values).
    exported = dict(iter_hf_weights(model, model_args))
    original = {}
    for f in hf_dir.glob("*.safetensors"):
        original.update(load_file(str(f)))
    assert set(exported) == set(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name

    # Causal full-sequence logits match HF (fp32, 1e-4).
    tokens = torch.tensor([[3, 17, 250, 8, 99, 1]])
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)[None, None]
    with torch.no_grad():
        logits = model(tokens, torch.arange(6)[None], attention_mask=mask)
    torch.testing.assert_close(logits[..., :300], hf_model(tokens).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling"])  # transformers >= 5 / < 5 config.json
def test_llama3_rope_scaling_matches_hf_at_long_positions(spelling, tiny_hf, megatron_cpu_world, tmp_path):
    """Llama 3.1's 'llama3' RoPE scaling reaches megatron-core (it was refused as written by transformers < 5, and
    taken for plain RoPE as written by transformers 5, whose logits differ from HF's past a few hundred tokens)."""
    import json
    import shutil

    hf_model, hf_dir = tiny_hf("llama")
    config = json.loads((hf_dir / "config.json").read_text())
    if spelling == "rope_scaling":  # the published Llama-3.1 config.json (transformers 4.42)
        params = config.pop("rope_parameters")
        config["rope_theta"] = params.pop("rope_theta")
        config["rope_scaling"] = params
        hf_dir = shutil.copytree(hf_dir, tmp_path / "hf")
        (hf_dir / "config.json").write_text(json.dumps(config))
    model, model_args = _build(hf_dir)
    assert model_args.rope_scaling_factor == 8.0
    assert model_args.megatron_flags()[-3:] == ["--use-rope-scaling", "--rotary-scaling-factor", "8"]
    # Positions 0..599: the head's middle frequencies (wavelengths 2k-8k tokens) turn by up to ~2 rad, scaled or not.
    n = 600
    tokens = torch.randint(0, 300, (1, n), generator=torch.Generator().manual_seed(0))
    mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)[None, None]
    with torch.no_grad():
        logits = model(tokens, torch.arange(n)[None], attention_mask=mask)[..., :300]
        expected = hf_model(tokens).logits
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)  # fp32
    # The frequencies themselves, against HF's (the low ones divided by 8, the middle ones blended).
    inv_freq = model.rotary_pos_emb.inv_freq
    torch.testing.assert_close(inv_freq, hf_model.model.rotary_emb.inv_freq.to(inv_freq), atol=0, rtol=1e-6)
    # The logits check can fail: plain RoPE (the scaling dropped) misses it (by 5e-4 on this random model).
    plain = dataclasses.replace(model_args, rope_scaling_factor=None)
    settings = MegatronSettings(fp32=True, transformer_impl="local")
    from slime_train_megatron.model import build_gpt_model, build_transformer_config

    unscaled = build_gpt_model(plain, settings, build_transformer_config(plain, settings, cpu=True)).eval()
    unscaled.load_state_dict(model.state_dict())
    with torch.no_grad():
        wrong = unscaled(tokens, torch.arange(n)[None], attention_mask=mask)[..., :300]
    assert (wrong - expected).abs().max() > 2e-4


def test_glm4_torch_dist_checkpoint_loads_strictly(tiny_hf, megatron_cpu_world, tmp_path):
    """GLM4 through slime-convert's torch_dist (what an FSDP/Megatron `--ref-load` holds) into the GLM4 layers."""
    from megatron.core import dist_checkpointing

    from slime_convert import hf_to_mcore
    from slime_train_megatron.layers import SandwichNormTransformerLayer
    from slime_train_megatron.model import build_gpt_model, build_transformer_config

    hf_model, hf_dir = tiny_hf("glm4")
    ckpt = hf_to_mcore(hf_dir, tmp_path / "mcore", progress=False)
    model_args = ModelArgs.from_hf_dir(hf_dir)
    settings = MegatronSettings(fp32=True, transformer_impl="local")
    model = build_gpt_model(model_args, settings, build_transformer_config(model_args, settings, cpu=True)).eval()
    assert all(isinstance(layer, SandwichNormTransformerLayer) for layer in model.decoder.layers)
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt))
    missing, unexpected = model.load_state_dict(state["model"], strict=True)
    assert not missing and not unexpected
    norm = model.decoder.layers[1].post_mlp_layernorm.weight
    torch.testing.assert_close(norm, hf_model.model.layers[1].post_mlp_layernorm.weight, atol=0, rtol=0)
    tokens = torch.tensor([[7, 250, 3, 41, 12]])
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)[None, None]
    with torch.no_grad():
        logits = model(tokens, torch.arange(5)[None], attention_mask=mask)
    torch.testing.assert_close(logits[..., :300], hf_model(tokens).logits, atol=1e-4, rtol=0)  # fp32


@pytest.mark.parametrize("model_type", ["qwen3", "glm4"])  # glm4: interleaved partial RoPE on THD rows
def test_response_log_probs_from_packed_logits_match_hf(model_type, tiny_hf, megatron_cpu_world):
    """A packed THD row (two samples) → response log-probs at temperature 0.8 vs HF run on each sample alone."""
    hf_model, hf_dir = tiny_hf(model_type)
    model, model_args = _build(hf_dir)
    samples = [torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11, 12, 13, 14])]
    packed = pack_thd(samples, [2, 3])
    # The local spec's default core attention (slime's packed attention) takes the THD row as the backend passes it.
    from megatron.core.packed_seq_params import PackedSeqParams

    cu, longest = packed.cu_seqlens, packed.max_seqlen
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                             cu_seqlens_kv_padded=cu, max_seqlen_q=longest, max_seqlen_kv=longest)  # fmt: skip
    with torch.no_grad():
        logits = model(packed.tokens, packed.position_ids, attention_mask=None, packed_seq_params=params)[0]
    lp, _ = vocab_parallel_log_probs(
        logits[packed.logit_index], packed.targets, temperature=0.8, vocab_size=model_args.vocab_size
    )
    expected = []
    for t, r in zip(samples, [2, 3], strict=True):
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(t[None]).logits[0].double() / 0.8, -1)
        expected.append(ref[len(t) - r - 1 : len(t) - 1].gather(1, t[len(t) - r :, None])[:, 0])
    # fp32 model vs fp64 softmax of HF fp32 logits: 1e-4.
    torch.testing.assert_close(lp.double(), torch.cat(expected), atol=1e-4, rtol=0)


def test_megatron_flags_reach_the_transformer_config(tiny_hf):
    from slime_train_megatron.model import build_transformer_config

    _, hf_dir = tiny_hf("qwen3_moe")
    model_args = ModelArgs.from_hf_dir(hf_dir)
    base = dict(fp32=True, transformer_impl="local", moe_token_dispatcher_type="allgather")
    config = build_transformer_config(model_args, MegatronSettings(**base), cpu=True)
    assert config.moe_aux_loss_coeff == model_args.moe_aux_loss_coeff  # no flag: config.json's value
    assert config.moe_router_dtype is None and not config.attention_softmax_in_fp32
    flags = dict(moe_aux_loss_coeff=0.0, moe_router_dtype="fp32", moe_permute_fusion=True,
                 attention_softmax_in_fp32=True, moe_router_load_balancing_type="seq_aux_loss")  # fmt: skip
    flagged = MegatronSettings(**base, **flags)
    config = build_transformer_config(model_args, flagged, cpu=True)
    assert config.moe_aux_loss_coeff == 0.0  # the original scripts' --moe-aux-loss-coeff 0 wins
    assert (config.moe_router_dtype, config.moe_router_load_balancing_type) == ("fp32", "seq_aux_loss")
    assert config.attention_softmax_in_fp32
    assert not config.moe_permute_fusion  # a Transformer Engine kernel: not on the local spec (logged)
