"""The `fused` head (the CUDA default) on every path of the response forward, against the exact `fp32` head.

A tiny Qwen3 runs the installed response forward (`slime_train_fsdp.packing`) with `ForwardOptions(head="fused")`
and `ForwardOptions(head="fp32")`: untied and tied embeddings, peft LoRA on attention and on `lm_head`, entropy on
and off, chunk sizes that split the rows unevenly, and the no-grad forward of the ref/OPD-teacher log-probs.
Context parallelism runs in `test_context_parallel.py`, vision-language models in `test_vlm.py`.
Tolerances as `test_fused_head.py`: 1e-6 absolute on log-probs and entropies (same fp32 logits, other summation
order), 1e-5 absolute on fp32 gradients (O(1) values).
"""

from __future__ import annotations

import logging

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from transformers import AutoModelForCausalLM, Qwen3Config

from slime_core.algorithms import KeptTokens
from slime_train_fsdp import logprob_head
from slime_train_fsdp.logprob_head import default_head
from slime_train_fsdp.packing import (
    ForwardOptions,
    install_response_forward,
    output_weight,
    pack_micro_batch,
    response_log_probs,
)

V, T = 96, 0.7


def _model(*, tied: bool, lora_targets: list[str] | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied)  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    if lora_targets:
        lora = LoraConfig(r=4, lora_alpha=8.0, target_modules=lora_targets, lora_dropout=0.0)
        model = inject_adapter_in_model(lora, model)
        for name, param in model.named_parameters():
            if ".lora_B." in name:  # peft starts B at 0; a non-zero B makes the adapters change the values
                torch.nn.init.normal_(param, std=0.5)
            param.requires_grad_(".lora_" in name)
    return model.train()


def _micro_batch():
    g = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, V, (n,), generator=g) for n in (9, 14, 6)]
    return pack_micro_batch(tokens, [4, 7, 3], [0, 1, 2], torch.device("cpu"))


def _run(model, head: str, mb, *, chunk_size: int, with_entropy: bool, grad: bool = True):
    """Log-probs, entropies and the gradients of `Σ a·logp + Σ b·H` (by parameter name) through `head`."""
    install_response_forward(model, ForwardOptions(head=head))
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad):
        logp, ent, anchor = response_log_probs(model, mb, temperature=T, chunk_size=chunk_size,
                                               with_entropy=with_entropy)  # fmt: skip
    grads = {}
    if grad:
        g = torch.Generator().manual_seed(2)
        a, b = torch.randn(logp.shape, generator=g), torch.randn(logp.shape, generator=g)
        loss = (logp * a).sum() + anchor + ((ent * b).sum() if with_entropy else 0.0)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


def _err(x, y) -> float:
    assert x.shape == y.shape, (x.shape, y.shape)
    return float((x - y).abs().max()) if x.numel() else 0.0


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("lora_targets", [None, ["q_proj", "v_proj"], ["q_proj", "lm_head"]])
@pytest.mark.parametrize(("chunk_size", "with_entropy"), [(5, True), (1024, True), (3, False)])
def test_fused_matches_fp32_on_the_models_paths(tied, lora_targets, chunk_size, with_entropy):
    model, mb = _model(tied=tied, lora_targets=lora_targets), _micro_batch()
    got = _run(model, "fused", mb, chunk_size=chunk_size, with_entropy=with_entropy)
    ref = _run(model, "fp32", mb, chunk_size=chunk_size, with_entropy=with_entropy)
    assert mb.targets.numel() == 14 and got[0].shape == (14,)
    assert _err(got[0], ref[0]) <= 1e-6 and _err(got[1], ref[1]) <= 1e-6
    assert got[2].keys() == ref[2].keys() and got[2]  # the same parameters get a gradient
    if lora_targets:
        assert all(".lora_" in n for n in got[2])
    if lora_targets and "lm_head" in lora_targets:  # the output layer's adapter trains
        assert any("lm_head.lora_A" in n for n in got[2]) and any("lm_head.lora_B" in n for n in got[2])
    for name, expected in ref[2].items():
        assert _err(got[2][name], expected) <= 1e-5, name
    assert max(float(g.abs().max()) for g in ref[2].values()) > 1e-3  # a real gradient


def test_no_grad_log_probs_of_ref_and_teacher_match_fp32():
    # `compute_log_probs(model="ref"/"teacher")` runs the same forward under no_grad with other weights.
    model, mb = _model(tied=False), _micro_batch()
    got = _run(model, "fused", mb, chunk_size=4, with_entropy=False, grad=False)
    ref = _run(model, "fp32", mb, chunk_size=4, with_entropy=False, grad=False)
    assert not got[0].requires_grad and _err(got[0], ref[0]) <= 1e-6


@pytest.mark.parametrize("head", ["fused", "fp32"])
def test_a_lora_adapted_lm_head_is_applied_as_the_hf_forward_applies_it(head):
    # Reference: transformers' own forward through the peft-wrapped lm_head, log-softmax of logits / T.
    # Before `output_weight`, every head read `lm_head.weight` (the frozen base) and ignored the adapter.
    model, mb = _model(tied=False, lora_targets=["lm_head"]), _micro_batch()
    logp, _, _ = _run(model, head, mb, chunk_size=5, with_entropy=False, grad=False)
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits[0]
    expected = torch.log_softmax(logits[mb.predict_index] / T, -1).gather(-1, mb.targets[:, None])[:, 0]
    assert _err(logp, expected) <= 1e-5
    base = model.get_output_embeddings().base_layer.weight
    assert float((output_weight(model) - base).abs().max()) > 1e-2  # the adapter does change the weight


def test_the_cuda_default_is_fused_and_the_cpu_default_exact():
    assert default_head(torch.device("cuda")) == "fused"
    assert default_head(torch.device("cpu")) == "fp32"


def test_top_p_replay_falls_back_to_fp32out_and_says_so(caplog):
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(6, 8, generator=g), torch.randn(20, 8, generator=g)
    targets = torch.randint(0, 20, (6,), generator=g)
    kept = KeptTokens(rows=torch.arange(6).repeat_interleave(4), ids=torch.randint(0, 20, (24,), generator=g),
                      num_rows=6)  # fmt: skip
    logprob_head._log_top_p_fallback.cache_clear()
    with caplog.at_level(logging.INFO, logger="slime_train_fsdp.logprob_head"):
        got = logprob_head.head_log_probs(hidden, weight, targets, temperature=T, chunk_size=4, with_entropy=False,
                                          head="fused", kept=kept)  # fmt: skip
        logprob_head.head_log_probs(hidden, weight, targets, temperature=T, chunk_size=4, with_entropy=False,
                                    head="fused", kept=kept)  # fmt: skip
    ref = logprob_head.head_log_probs(hidden, weight, targets, temperature=T, chunk_size=4, with_entropy=False,
                                      head="fp32out", kept=kept)  # fmt: skip
    assert torch.equal(got[0], ref[0])
    assert caplog.text.count("top-p replay") == 1  # once per process, not per call


def test_two_models_in_one_process_keep_their_own_compile_setting(monkeypatch):
    # The actor compiles its head with its layers; a second model (critic, teacher) built without compiled
    # layers must not switch it off, nor the reverse (formerly one module-level switch, set by the last build).
    seen = []

    def spy(*args, compiled=False, **kwargs):
        seen.append(compiled)
        return real(*args, **kwargs)

    real = logprob_head.fused_log_probs
    monkeypatch.setattr(logprob_head, "fused_log_probs", spy)
    actor, other, mb = _model(tied=False), _model(tied=True), _micro_batch()
    install_response_forward(actor, ForwardOptions(head="fused", compile_head=True))
    install_response_forward(other, ForwardOptions(head="fused", compile_head=False))
    for model in (actor, other, actor):
        with torch.no_grad():
            response_log_probs(model, mb, temperature=T, chunk_size=4)
    assert seen == [True, False, True]
