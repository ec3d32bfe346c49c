"""CPU checks of the Megatron model path: build from HF config, direct HF load, HF export, THD log-probs."""

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
    # allgather dispatcher: alltoall creates CUDA streams.
    settings = MegatronSettings(fp32=True, transformer_impl="local", moe_token_dispatcher_type="allgather")
    model = build_gpt_model(model_args, settings, build_transformer_config(model_args, settings, cpu=True)).eval()
    load_hf_weights(model, str(hf_dir), model_args, settings)
    return model, model_args


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "qwen3_moe"])
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


def test_response_log_probs_from_packed_logits_match_hf(tiny_hf, megatron_cpu_world):
    """A packed THD row (two samples) → response log-probs at temperature 0.8 vs HF run on each sample alone."""
    hf_model, hf_dir = tiny_hf("qwen3")
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
