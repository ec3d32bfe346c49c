"""`--true-on-policy-mode` on CPU: the mirrored Qwen3 forward, its attention backward, the sampler's log-softmax.

Bit-exactness against SGLang is a GPU property (tests/gpu/test_true_on_policy_gpu.py); here the CPU fallback of
the same op order is checked against independent references: the HF forward in fp32 (tolerance 1e-5 on
log-probs: only summation order differs), SDPA's gradients (1e-5), and the sampler formula written out below.
"""

import math

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from slime_train_fsdp.packing import ForwardOptions, install_response_forward, pack_micro_batch, response_log_probs
from slime_train_fsdp.true_on_policy import install_mirrored_qwen3, qwen3
from slime_train_fsdp.true_on_policy.attention import MirroredAttention, plan_attention
from slime_train_fsdp.true_on_policy.ops import sampler_log_probs

CPU = torch.device("cpu")


def _tiny_qwen3(seed=0):
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
        architectures=["Qwen3ForCausalLM"], attn_implementation="sdpa",
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).float().eval()
    with torch.no_grad():  # non-trivial norm weights, so a wrong weight mapping shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    return model


def _hf_log_probs(model, seqs, response_lengths, temperature):
    out = []
    for tokens, r in zip(seqs, response_lengths, strict=True):
        logits = model(input_ids=tokens[None]).logits[0].float()  # [T, V]
        logp = torch.log_softmax(logits / temperature, dim=-1)
        t = tokens.numel()
        out.append(logp[t - r - 1 : t - 1].gather(-1, tokens[t - r :, None]).squeeze(-1))
    return torch.cat(out)


def test_mirrored_forward_equals_the_hf_forward_in_fp32():
    model = _tiny_qwen3()
    seqs = [torch.randint(0, 97, (11,)), torch.randint(0, 97, (7,))]
    response_lengths = [4, 3]
    expected = _hf_log_probs(model, seqs, response_lengths, temperature=0.7)
    install_response_forward(model, ForwardOptions(head="fp32", true_on_policy=True))
    install_mirrored_qwen3(model, CPU)
    mb = pack_micro_batch(seqs, response_lengths, [0, 1], CPU)
    with torch.no_grad():
        logp, _, _ = response_log_probs(model, mb, temperature=0.7, chunk_size=4)
    torch.testing.assert_close(logp, expected, atol=1e-5, rtol=1e-5)


def test_mode_routes_the_response_forward_through_the_mirror(monkeypatch):
    model = _tiny_qwen3()
    install_response_forward(model, ForwardOptions(head="fp32", true_on_policy=True))
    install_mirrored_qwen3(model, CPU)
    calls = []
    original = qwen3._layer_forward
    monkeypatch.setattr(qwen3, "_layer_forward", lambda *a: calls.append(1) or original(*a))
    install_mirrored_qwen3(model, CPU)  # re-binds the layers to the counting wrapper
    mb = pack_micro_batch([torch.tensor([3, 4, 5, 6])], [2], [0], CPU)
    response_log_probs(model, mb, temperature=1.0, chunk_size=4)
    assert len(calls) == 2  # both decoder layers, through the mirrored method


def test_other_architectures_are_refused():
    model = _tiny_qwen3()
    model.config.architectures = ["Qwen3MoeForCausalLM"]
    with pytest.raises(ValueError, match="Qwen3MoeForCausalLM is not a dense Qwen3"):
        install_mirrored_qwen3(model, CPU)


def test_attention_plan_splits_prompt_and_response_positions():
    plan = plan_attention([4, 3], [2, 3], CPU, split_tile_size=2)
    assert plan.extend_index.tolist() == [0, 1, 4, 5, 6]
    assert plan.extend_indptr.tolist() == [0, 2, 5]
    assert plan.decode_index.tolist() == [2, 3]  # the second sequence generated nothing after its prompt
    assert plan.decode_kv_indptr.tolist() == [0, 3, 7]
    assert plan.decode_kv_indices.tolist() == [0, 1, 2, 0, 1, 2, 3]
    assert plan.num_kv_splits.tolist() == [2, 2]  # ceil(3/2), ceil(4/2)
    with pytest.raises(ValueError, match="sequence 0: prompt length 0 outside"):
        plan_attention([4], [0], CPU)


def test_prompt_lengths_from_predict_positions():
    predict = torch.tensor([1, 2, 3, 6])  # seq 0 (T=5) predicts 3 tokens, seq 1 (T=3) one
    assert qwen3.prompt_lengths([5, 3], predict) == [2, 2]


def test_attention_backward_equals_sdpa_gradients():
    torch.manual_seed(1)
    lengths = [5, 3]
    q = torch.randn(8, 4, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(8, 2, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(8, 2, 16, dtype=torch.float64, requires_grad=True)
    plan = plan_attention(lengths, [2, 1], CPU)
    grad = torch.randn(8, 4, 16, dtype=torch.float64)
    MirroredAttention.apply(q, k, v, plan, 0.25, None).backward(grad)
    ours = [t.grad.clone() for t in (q, k, v)]
    # Reference: dense causal attention per sequence, heads repeated for GQA, written out.
    refs = []
    for t in (q, k, v):
        t.grad = None
    outs = []
    for qs, ks, vs in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
        ks, vs = ks.repeat_interleave(2, dim=1), vs.repeat_interleave(2, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * 0.25
        mask = torch.ones(len(qs), len(qs), dtype=torch.bool).tril()
        probs = scores.masked_fill(~mask, -math.inf).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, vs))
    torch.cat(outs).backward(grad)
    refs = [t.grad for t in (q, k, v)]
    for a, b in zip(ours, refs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_sampler_log_probs_match_the_formula_written_out():
    torch.manual_seed(2)
    logits = (torch.randn(3, 11) * 4).bfloat16()
    targets = torch.tensor([0, 5, 10])
    logp, entropy = sampler_log_probs(logits, targets, 0.6, with_entropy=True)
    # SGLang: fp32 division of the bf16 logits, rounded to bf16, log-softmax in bf16 (bf16 result).
    scaled = (logits.float() / torch.tensor(0.6, dtype=torch.float32)).bfloat16()
    expected = torch.log_softmax(scaled, dim=-1)[torch.arange(3), targets].float()
    assert logp.dtype == torch.float32
    assert torch.equal(logp, expected)
    assert torch.equal(logp, logp.bfloat16().float())  # bf16 values, like the engine's
    p = torch.log_softmax(scaled, dim=-1).float()
    torch.testing.assert_close(entropy, -(p.exp() * p).sum(-1))


def test_mirrored_forward_gradients_equal_the_hf_gradients():
    model = _tiny_qwen3(seed=3)
    seqs, response_lengths = [torch.randint(0, 97, (9,)), torch.randint(0, 97, (6,))], [3, 2]
    _hf_log_probs(model, seqs, response_lengths, temperature=1.0).sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    install_response_forward(model, ForwardOptions(head="fp32", true_on_policy=True))
    install_mirrored_qwen3(model, CPU)
    mb = pack_micro_batch(seqs, response_lengths, [0, 1], CPU)
    logp, entropy, anchor = response_log_probs(model, mb, temperature=1.0, chunk_size=4, with_entropy=True)
    assert entropy.shape == (5,)
    (logp.sum() + anchor).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-5, rtol=1e-4, msg=name)


def test_cpu_says_exactness_is_a_gpu_property(caplog):
    from slime_train_fsdp.true_on_policy import kernels

    kernels._STATE.pop("cpu_warned", None)
    with caplog.at_level("WARNING", logger=kernels.__name__):
        assert kernels.enable_batch_invariant_ops(CPU) is False
    assert "bit for bit only on CUDA with SGLang's kernels" in caplog.text
    assert kernels.load_kernels(CPU) is None


def test_kernels_import_from_the_staged_sglang_site_dir(tmp_path, monkeypatch):
    import sys

    from slime_train_fsdp.true_on_policy import kernels

    pkg = tmp_path / "fake_sgl_top"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def kernel():\n    return 7\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("SLIME_SGLANG_PYTHONPATH", str(tmp_path))
    assert kernels._import("fake_sgl_top", "kernel")() == 7
    assert sys.path[-1] == str(tmp_path)  # appended last: the trainer's packages keep precedence
    monkeypatch.setenv("SLIME_SGLANG_PYTHONPATH", "")
    with pytest.raises(RuntimeError, match="needs no_such_sgl_mod.x"):
        kernels._import("no_such_sgl_mod", "x")


def test_sglang_config_registrations_do_not_clash_with_the_trainers_transformers(tmp_path, monkeypatch):
    """SGLang 0.5.16's `sglang.srt.configs` registers `qwen3_asr`, which transformers 5.x already has: on the H200
    the import raised `ValueError: 'qwen3_asr' is already used` and the mode could not start."""
    import sys

    from transformers import AutoConfig, PretrainedConfig, Qwen3Config
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from slime_train_fsdp.true_on_policy import kernels

    pkg = tmp_path / "fake_sgl_configs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from transformers import AutoConfig, PretrainedConfig\n"
        "class ShadowQwen3(PretrainedConfig):\n    model_type = 'qwen3'\n"
        "class BrandNew(PretrainedConfig):\n    model_type = 'slime_brand_new_test_type'\n"
        "AutoConfig.register('qwen3', ShadowQwen3)\n"
        "AutoConfig.register('slime_brand_new_test_type', BrandNew)\n"
        "def kernel():\n    return 11\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_sgl_configs", raising=False)
    assert kernels._import("fake_sgl_configs", "kernel")() == 11
    assert CONFIG_MAPPING["qwen3"] is Qwen3Config  # the trainer's own config class is kept
    assert CONFIG_MAPPING["slime_brand_new_test_type"].__name__ == "BrandNew"  # new types still register
    # Restored: outside the import a clash raises again, as transformers intends.

    class Clash(PretrainedConfig):
        model_type = "qwen3"

    with pytest.raises(ValueError, match="already used"):
        AutoConfig.register("qwen3", Clash)


def test_multi_turn_samples_are_refused_by_name():
    from slime_train_fsdp.true_on_policy import check_single_turn

    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0, 1.0])]
    check_single_turn(masks, [0])  # a trailing masked run is fine: nothing was generated after it
    with pytest.raises(ValueError, match="sample 1 has trained tokens after masked ones"):
        check_single_turn(masks, [0, 1])


def test_fsdp_keeps_the_fp32_residual_stream_uncast_in_the_mode():
    pytest.importorskip("slime_rollout", reason="validating the mode reads the engine's record (slime-rollout)")
    from slime_core.config import SlimeArgs
    from slime_train_fsdp.model_loading import compiles_layers, mixed_precision_policy

    base = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp"}
    on, off = SlimeArgs.from_dict({**base, "true_on_policy_mode": True}), SlimeArgs.from_dict(base)
    assert mixed_precision_policy(on).cast_forward_inputs is False
    assert mixed_precision_policy(off).cast_forward_inputs is True
    assert mixed_precision_policy(on).param_dtype == torch.bfloat16
    assert compiles_layers(on, torch.device("cuda")) is False  # compiled layers would round differently


def test_pushes_are_bf16_on_cuda_in_the_mode():
    import types as pytypes

    from slime_train_fsdp.backend import FSDPTrainBackend

    # In the mode on CUDA the pushes are bf16 whatever the checkpoint declares: the engine's fp32 embeddings/norms
    # must hold the bf16 casts this trainer computes with, not the unrounded masters.
    def stub(mode, device):
        cfg = pytypes.SimpleNamespace(true_on_policy_mode=mode)
        return pytypes.SimpleNamespace(cfg=cfg, device=torch.device(device), _hf_dtype=torch.float32)

    assert FSDPTrainBackend._checkpoint_dtype(stub(True, "cuda")) == torch.bfloat16
    assert FSDPTrainBackend._checkpoint_dtype(stub(False, "cuda")) == torch.float32
    assert FSDPTrainBackend._checkpoint_dtype(stub(True, "cpu")) == torch.float32


def test_linear_backward_runs_bmm_not_mm():
    from torch.profiler import profile

    from slime_train_fsdp.true_on_policy.ops import Linear

    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = Linear.apply(x, w, b)
    torch.testing.assert_close(y, x @ w.T + b, atol=1e-12, rtol=0)
    g = torch.randn(5, 4, dtype=torch.float64)
    with profile() as prof:
        y.backward(g)
    ops = {e.name for e in prof.events()}
    assert "aten::bmm" in ops and "aten::mm" not in ops  # the batch-invariant override (aten::mm) is left alone
    torch.testing.assert_close(x.grad, g @ w, atol=1e-12, rtol=0)
    torch.testing.assert_close(w.grad, g.T @ x, atol=1e-12, rtol=0)
    torch.testing.assert_close(b.grad, g.sum(0), atol=1e-12, rtol=0)
