"""`--log-probs-head fused` on the Megatron backend (output_head.py) against the default `logits` head, on CPU.

fp32 everywhere, so both heads compute the same logits up to summation order: log-probs, per-step losses, grad norms
and the first step's gradients agree (1e-5 absolute on log-probs and metrics, relative 1e-4 on grad norms, 1e-6
absolute + 1e-4 relative per gradient element).
The tiny vocabulary (300) is padded to 384 rows by megatron-core: the fused head must leave the padding rows out
of its softmax, as the logits head masks their columns.
"""

import re

import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")


def _config(hf_dir, **fields) -> SlimeArgs:
    return SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"],
        "advantage_estimator": "grpo", "rollout_temperature": 0.8, "kl_coef": 0.0, "use_kl_loss": False,
        "entropy_coef": 0.01, "eps_clip": 0.2, **fields,
    })  # fmt: skip


def _batch():
    tokens = [torch.tensor([1, 2, 3, 4, 5, 290]), torch.tensor([6, 7, 8, 9]), torch.tensor([10, 11, 12, 13, 14, 15])]
    return RolloutBatch(
        tokens=tokens,
        response_lengths=[3, 2, 3],
        loss_masks=[torch.ones(3), torch.ones(2), torch.tensor([1.0, 0.0, 1.0])],
        rewards=[1.0, -1.0, 0.5],
        raw_rewards=[1.0, 0.0, 1.0],
        loss_denominators=[3.0, 2.0, 2.0],
        micro_batches=[[[0, 1], [2]], [[0], [1, 2], []]],  # an empty slot: the dummy micro-batch
        step_sample_counts=[3, 3],
        step_token_counts=[7.0, 7.0],
    )


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])  # untied output layer; tied embedding
def test_fused_head_gives_the_logits_heads_log_probs_losses_and_grads(cpu_backend_env, tiny_hf, family):
    _, hf_dir = tiny_hf(family)
    backends = {}
    for head in (None, "fused"):
        backend = cpu_backend_env.MegatronTrainBackend()
        backend.init(_config(hf_dir, log_probs_head=head, log_probs_chunk_size=2), with_ref=False)
        backends[head] = backend
    default, fused = backends[None], backends["fused"]
    assert (default.head, fused.head) == ("logits", "fused")
    assert fused.module.output_layer.__class__.__name__ == "_HiddenStatesOutputLayer"
    assert fused.module.shared_embedding_or_output_weight().shape[0] == 384  # 300 real rows + Megatron's padding
    batch = _batch()

    lp_default, lp_fused = default.compute_log_probs(batch), fused.compute_log_probs(batch)
    for a, b in zip(lp_default, lp_fused, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)

    first_grads = {}
    for head, backend in backends.items():
        _capture_first_grads(backend, first_grads.setdefault(head, {}))
    default.train(0, batch)
    fused.train(0, batch)
    for step_default, step_fused in zip(default.step_metrics, fused.step_metrics, strict=True):
        for key in ("train/loss", "train/pg_loss", "train/entropy_loss"):
            assert step_fused[key] == pytest.approx(step_default[key], abs=1e-5), key
        assert step_fused["train/grad_norm"] == pytest.approx(step_default["train/grad_norm"], rel=1e-4)
        assert step_default["train/grad_norm"] > 0
    # Step 0's gradients, parameter by parameter (later weights differ by Adam's ±lr on near-zero gradients).
    assert first_grads[None].keys() == first_grads["fused"].keys()
    for name, grad in first_grads["fused"].items():
        torch.testing.assert_close(grad, first_grads[None][name], atol=1e-6, rtol=1e-4, msg=name)
    assert (
        first_grads["fused"]["output_layer.weight" if family == "qwen3" else "embedding.word_embeddings.weight"][300:]
        .abs()
        .max()
        == 0
    )  # no gradient reaches the padding rows


def _capture_first_grads(backend, into: dict) -> None:
    """Copies every parameter's accumulated gradient (DDP's `main_grad`) when the first optimizer step starts."""
    step = backend.optimizer.step

    def wrapped():
        if not into:
            into.update({n: p.main_grad.detach().clone() for n, p in backend.module.named_parameters()})
        return step()

    backend.optimizer.step = wrapped


def test_the_head_switches_back_and_forth_on_one_model(cpu_backend_env, tiny_hf):
    """`set_log_probs_head` (the benchmark's in-process A/B) changes the model's output and keeps the numbers."""
    _, hf_dir = tiny_hf("qwen3")
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(_config(hf_dir), with_ref=False)
    batch = _batch()
    before = backend.compute_log_probs(batch)
    backend.set_log_probs_head("fused")
    fused = backend.compute_log_probs(batch)
    backend.set_log_probs_head("logits")
    after = backend.compute_log_probs(batch)
    for a, b, c in zip(before, fused, after, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
        assert torch.equal(c, a)
    assert backend.module.output_layer.__class__.__name__ == "ColumnParallelLinear"


def test_head_flag_errors_name_the_flag():
    from slime_train_megatron.settings import head_kind

    assert head_kind(None, 2) == "logits" and head_kind("fused", 1) == "fused"
    # Unset: the fused head on GPUs at TP 1 (the FSDP backend's GPU default), megatron-core's logits elsewhere.
    assert [head_kind(None, 1, cuda=True), head_kind(None, 2, cuda=True), head_kind(None, 1)] == [
        "fused", "logits", "logits"
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"--log-probs-head fp32 is an FSDP head"):
        head_kind("fp32", 1)
    with pytest.raises(ValueError, match=r"--log-probs-head fused needs --tensor-model-parallel-size 1 \(got 2\)"):
        head_kind("fused", 2)


@pytest.mark.parametrize(
    "head, tp, message",
    [
        ("fused", "1", None),
        (None, "2", None),
        ("fp32out", "1", "--log-probs-head fp32out is an FSDP head"),
        ("fused", "2", r"--log-probs-head fused needs --tensor-model-parallel-size 1 \(got 2\)"),
        # "+2" is TP 2 to the config and to Megatron's argparse (int("+2")); preflight once read it as 1
        ("fused", "+2", r"--log-probs-head fused needs --tensor-model-parallel-size 1 \(got 2\)"),
    ],
)
def test_preflight_names_a_head_the_backend_cannot_run(head, tp, message):
    """Before the run starts (`--dry-run` included), not at the trainer's init on the GPU."""
    from slime_train_megatron.spec import preflight

    cfg = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "log_probs_head": head,
        "megatron_args": ["--tensor-model-parallel-size", tp],
    })  # fmt: skip
    problems = preflight(cfg)
    if message is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].severity == "error"
        assert re.search(message, problems[0].message)


@pytest.mark.parametrize("top_p", [False, True])
def test_hidden_log_probs_equal_the_logits_heads_on_a_padded_vocabulary(top_p):
    """`hidden_log_probs(h, W)` = `vocab_parallel_log_probs(h Wᵀ)` with 2 padding rows in W (large, so that a
    padding column in the softmax would show), values and gradients, fp32 (1e-5 / 1e-4 absolute)."""
    from slime_core.algorithms import KeptTokens
    from slime_train_megatron.logprobs import vocab_parallel_log_probs
    from slime_train_megatron.output_head import hidden_log_probs

    g = torch.Generator().manual_seed(5)
    hidden, weight = torch.randn(4, 8, generator=g), torch.randn(12, 8, generator=g)
    weight[10:] = 5.0  # Megatron's padding rows (ids 10, 11)
    targets = torch.tensor([1, 7, 9, 5])
    kept = KeptTokens.from_offsets([[1, 3, 7, 0, 5, 9]], [[0, 2, 2, 3, 6]]) if top_p else None
    results = []
    for fused in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if fused:
            lp, ent = hidden_log_probs(h, w, targets, temperature=0.7, vocab_size=10, chunk_size=3,
                                       with_entropy=True, kept=kept)  # fmt: skip
        else:
            lp, ent = vocab_parallel_log_probs(h @ w.t(), targets, temperature=0.7, vocab_size=10, with_entropy=True,
                                               kept=kept)  # fmt: skip
        (lp.sum() + 0.3 * ent.sum()).backward()
        results.append((lp, ent, h.grad, w.grad))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4 if got.dim() == 2 else 1e-5, rtol=0)
    assert results[1][3][10:].abs().max() == 0  # the padding rows get no gradient
    _, no_entropy = hidden_log_probs(hidden, weight, targets, temperature=0.7, vocab_size=10, chunk_size=3,
                                     with_entropy=False)  # fmt: skip
    assert no_entropy is None


def test_logits_head_honours_log_probs_chunk_size(cpu_backend_env, tiny_hf, monkeypatch):
    """`--log-probs-chunk-size 2` on the default head: every log-softmax pass sees at most 2 rows, same log-probs.

    Before the fix the flag reached only the fused head; the default head built all rows' fp32 [R, V] at once.
    """
    from slime_train_megatron import logprobs

    _, hf_dir = tiny_hf("qwen3")
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(_config(hf_dir, log_probs_chunk_size=2), with_ref=False)
    assert backend.head == "logits"
    batch = _batch()
    rows = []
    inner = logprobs.vocab_parallel_log_probs

    def spy(logits, *args, **kwargs):
        rows.append(logits.shape[0])
        return inner(logits, *args, **kwargs)

    monkeypatch.setattr(logprobs, "vocab_parallel_log_probs", spy)  # the chunks' (recursive) calls
    chunked = backend.compute_log_probs(batch)
    assert rows and max(rows) == 2  # micro-batch [0, 1] has 3 + 2 response rows: chunks of 2, 2, 1
    rows.clear()
    backend.cfg = backend.cfg.model_copy(update={"log_probs_chunk_size": -1})
    whole = backend.compute_log_probs(batch)
    assert rows == []  # -1: one pass per micro-batch, no chunk calls
    for a, b in zip(whole, chunked, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)  # same fp32 ops on fewer rows
