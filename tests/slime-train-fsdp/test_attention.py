"""Tests of the packed-row attention implementations (`slime_varlen`, `slime_flex`) on CPU.

On CPU both run the exact fallback (one causal SDPA per packed sequence); the reference is transformers' own
`sdpa` path, which builds the dense block-causal mask from the restarting `position_ids`. Tolerance: 1e-5
absolute on outputs and gradients (fp32; the two differ only in summation order). The flex `BlockMask` is
checked against `create_block_mask` (exact) and eager `flex_attention` against per-sequence SDPA (1e-5).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask
from transformers import AutoModelForCausalLM, Qwen3Config

from slime_train_fsdp.attention import (
    SLIME_FLEX,
    SLIME_VARLEN,
    document_block_mask,
    flex_core,
    packed_attention_kwargs,
    register_attention,
    sdpa_per_sequence,
    slime_attention_forward,
)

TOL = 1e-5
LENGTHS = [5, 9, 1, 3, 7]  # one sequence of a single token: attends only to itself


def _models(implementation: str):
    register_attention()
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    new = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=implementation)
    new.load_state_dict(ref.state_dict())
    return ref, new


def _row(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (1, sum(lengths)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids, pos


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("implementation", [SLIME_VARLEN, SLIME_FLEX])
def test_matches_dense_mask_sdpa_outputs_and_grads(implementation):
    ref, new = _models(implementation)
    ids, pos = _row(LENGTHS)
    weights = torch.randn(1, ids.shape[1], 64, generator=torch.Generator().manual_seed(2))
    out_ref = ref(input_ids=ids, position_ids=pos).logits
    (out_ref * weights).sum().backward()
    # Row layout passed once per micro-batch, as `response_log_probs` does.
    kwargs = packed_attention_kwargs(LENGTHS, ids.device, implementation)
    hidden = new.model(input_ids=ids, position_ids=pos, **kwargs).last_hidden_state
    out_new = new.lm_head(hidden)
    (out_new * weights).sum().backward()
    assert float((out_new - out_ref).detach().abs().max()) <= TOL
    g_ref, g_new = _grads(ref), _grads(new)
    assert max(float((g_new[n] - g_ref[n]).abs().max()) for n in g_ref) <= TOL
    # A plain HF forward (lengths derived from position_ids inside the attention call) gives the same.
    plain = new(input_ids=ids, position_ids=pos).logits
    assert float((plain - out_ref).detach().abs().max()) <= TOL


def test_packed_kwargs_are_computed_once_per_row():
    kwargs = packed_attention_kwargs([3, 4, 2], torch.device("cpu"), SLIME_VARLEN)
    assert kwargs["cu_seq_lens_q"].tolist() == [0, 3, 7, 9] and kwargs["cu_seq_lens_q"].dtype == torch.int32
    assert kwargs["max_length_q"] == 4
    # Only tensors and one int: no Python value whose structure depends on the sequence count (compile guards).
    assert sorted(kwargs) == ["cu_seq_lens_k", "cu_seq_lens_q", "max_length_k", "max_length_q"]
    assert packed_attention_kwargs([3, 4], torch.device("cpu"), "sdpa") == {}


def test_document_block_mask_matches_create_block_mask():
    lengths = [300, 20, 1, 290, 40]  # whole blocks inside one document (full tiles), boundaries inside blocks
    total = sum(lengths)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def mask_mod(b, h, q, k):
        return (doc[q] == doc[k]) & (q >= k)

    expected = create_block_mask(mask_mod, None, None, total, total, device="cpu")
    got = document_block_mask(lengths, torch.device("cpu"))
    assert torch.equal(got.to_dense(), expected.to_dense())
    assert torch.equal(got.full_kv_num_blocks, expected.full_kv_num_blocks)
    assert int(got.full_kv_num_blocks.sum()) > 0  # the full-tile path is exercised


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_core_with_document_mask_equals_per_sequence_sdpa():
    lengths = [130, 5, 200, 40]  # 375: not a multiple of the 128 block
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, h, sum(lengths), 16, generator=g) for h in (4, 2, 2))  # GQA: 4 query, 2 kv heads
    expected = sdpa_per_sequence(q, k, v, tuple(lengths), None)
    got = flex_core(q, k, v, document_block_mask(lengths, q.device), None, compiled=False)
    assert got.shape == (1, sum(lengths), 4, 16)
    assert float((got - expected).abs().max()) <= TOL


def test_rejects_what_it_does_not_implement():
    q = k = v = torch.zeros(1, 2, 4, 8)
    row = packed_attention_kwargs([4], torch.device("cpu"), SLIME_VARLEN)
    with pytest.raises(ValueError, match="attention_mask=None"):
        slime_attention_forward(None, q, k, v, torch.ones(1, 1, 4, 4), **row)
    with pytest.raises(ValueError, match="dropout"):
        slime_attention_forward(None, q, k, v, None, dropout=0.1, **row)
    with pytest.raises(ValueError, match="sliding-window"):
        slime_attention_forward(None, q, k, v, None, sliding_window=2, **row)


def test_the_cpu_fallback_and_its_backward_stay_inside_one_compiled_graph(monkeypatch, tmp_path):
    """Traced as plain code, the backward's `.tolist()` broke a compiled layer's graph on CPU (inductor cannot lower
    `aten._local_scalar_dense`); as an opaque op, like flash varlen on CUDA, it keeps one graph, exact grads."""
    from torch._dynamo.utils import counters

    from slime_train_fsdp.attention import packed_sdpa

    def layer(q, k, v, cu):
        return (packed_sdpa(q * 2.0, k, v, cu, None) * 3.0).sum()

    # A fresh cache: AOT autograd's key does not cover a custom op's Python backward, so an entry made with another
    # backward would be reused.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(0)
    # `[1, H, S, D]` views of `[1, S, H, D]` tensors, as in the layer (the gradients must still be contiguous).
    inputs = [torch.randn(1, 10, h, 8, generator=g).transpose(1, 2).requires_grad_(True) for h in (4, 2, 2)]
    cu = torch.tensor([0, 6, 10], dtype=torch.int32)
    # No SIMD probe builds (~20 s here). `config.patch`, not monkeypatch: monkeypatch's undo hid the option from
    # inductor's config copy, and a later compile in the same process failed ("cpp.vec_isa_ok does not exist").
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        torch.compile(layer, backend="inductor", dynamic=True)(*inputs, cu).backward()
    assert not counters["graph_break"] and counters["stats"]["unique_graphs"] == 1
    compiled_grads = [t.grad.clone() for t in inputs]
    ref = [t.detach().clone().requires_grad_(True) for t in inputs]
    outs = [F.scaled_dot_product_attention(ref[0][:, :, a:b] * 2.0, ref[1][:, :, a:b], ref[2][:, :, a:b],
                                           is_causal=True, enable_gqa=True) for a, b in ((0, 6), (6, 10))]  # fmt: skip
    (torch.cat(outs, dim=2) * 3.0).sum().backward()
    for got, want in zip(compiled_grads, (t.grad for t in ref), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)  # fp32 math in both
