"""Megatron Qwen3-MoE on CPU against Hugging Face: the MoE flags as a run passes them, no megatron-core piece mocked.

The routers are scaled up (std 0.5) so every token's top-2 is decisive: a routing difference moves log-probs by
about 0.05 here, far above the fp32 tolerance.
"""

import json
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

from slime_convert import ModelArgs
from slime_train_megatron.logprobs import vocab_parallel_log_probs
from slime_train_megatron.packing import pack_thd
from slime_train_megatron.settings import MegatronSettings

pytest.importorskip("megatron.core")

_SAMPLES = [torch.tensor([5, 6, 7, 8, 40, 41, 42]), torch.tensor([9, 10, 11, 12, 13, 14, 200, 201, 202])]
_RESPONSE_LENGTHS = [4, 5]


@pytest.fixture(scope="module")
def moe_hf(tmp_path_factory):
    """Factory: `moe_hf(norm_topk_prob) -> (fp32 HF Qwen3-MoE, dir)`: 2 layers, 4 experts, top-2."""
    transformers = pytest.importorskip("transformers")
    cache: dict[bool, tuple] = {}

    def make(norm_topk_prob: bool):
        if norm_topk_prob not in cache:
            config = transformers.AutoConfig.for_model(
                "qwen3_moe", hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=256, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=norm_topk_prob,
            )  # fmt: skip
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "norm" in name:
                        p.normal_(1.0, 0.1)
                    elif name.endswith("mlp.gate.weight"):
                        p.normal_(0.0, 0.5)
            out = tmp_path_factory.mktemp(f"qwen3-moe-norm-{norm_topk_prob}")
            model.save_pretrained(out)
            cache[norm_topk_prob] = (model, out)
        return cache[norm_topk_prob]

    return make


def _megatron_log_probs(hf_dir, train: bool = False, **flags):
    """Response log-probs (temperature 1) of the packed samples, and the transformer config, as the backend builds."""
    from megatron.core.packed_seq_params import PackedSeqParams

    from slime_train_megatron.model import build_gpt_model, build_transformer_config, load_hf_weights

    model_args = ModelArgs.from_hf_dir(hf_dir)
    settings = MegatronSettings(transformer_impl="local", **{"fp32": True, **flags})
    config = build_transformer_config(model_args, settings, cpu=True)
    model = build_gpt_model(model_args, settings, config).train(train)
    load_hf_weights(model, str(hf_dir), model_args, settings)
    packed = pack_thd(_SAMPLES, _RESPONSE_LENGTHS)
    cu, longest = packed.cu_seqlens, packed.max_seqlen
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                             cu_seqlens_kv_padded=cu, max_seqlen_q=longest, max_seqlen_kv=longest)  # fmt: skip
    with torch.set_grad_enabled(train):
        logits = model(packed.tokens, packed.position_ids, attention_mask=None, packed_seq_params=params)[0]
    lp, _ = vocab_parallel_log_probs(
        logits[packed.logit_index].float(), packed.targets, temperature=1.0, vocab_size=model_args.vocab_size
    )
    return lp.detach().double(), config, model


def _hf_log_probs(hf_model):
    out = []
    with torch.no_grad():
        for ids, r in zip(_SAMPLES, _RESPONSE_LENGTHS, strict=True):
            lp = torch.log_softmax(hf_model(ids[None]).logits[0].double(), -1)
            out.append(lp[len(ids) - r - 1 : -1].gather(1, ids[-r:, None])[:, 0])
    return torch.cat(out)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize(
    "flags",
    [
        {},  # slime's default dispatcher (alltoall): megatron-core's built a CUDA stream, AcceleratorError on CPU
        {"moe_grouped_gemm": True},  # the original's Qwen3-MoE scripts: AssertionError (no grouped_gemm) before
        {"moe_token_dispatcher_type": "allgather", "moe_router_dtype": "fp32"},
        {"moe_router_dtype": "fp64", "moe_router_load_balancing_type": "seq_aux_loss", "moe_z_loss_coeff": 0.01},
    ],
    ids=["default", "grouped-gemm", "allgather-router-fp32", "router-fp64-seq-aux-z-loss"],
)
def test_moe_response_log_probs_match_hf_fp32(norm_topk_prob, flags, moe_hf, megatron_cpu_world):
    """fp32 Megatron vs HF fp32 (fp64 softmax), eval and train mode: 1e-5. norm_topk_prob=False is Megatron's
    pre-softmax top-k, True its top-k softmax; the router losses only add gradients, never change the forward."""
    hf_model, hf_dir = moe_hf(norm_topk_prob)
    expected = _hf_log_probs(hf_model)
    lp, config, model = _megatron_log_probs(hf_dir, **flags)
    torch.testing.assert_close(lp, expected, atol=1e-5, rtol=0)
    assert config.moe_router_pre_softmax is not norm_topk_prob
    # On CPU the dispatcher is allgather and the experts run one by one (the names the HF tables map).
    assert config.moe_token_dispatcher_type == "allgather" and not config.moe_grouped_gemm
    experts = model.decoder.layers[0].mlp.experts
    assert type(experts).__name__ == "SequentialMLP" and len(experts.local_experts) == 4
    train_lp, _, _ = _megatron_log_probs(hf_dir, train=True, **flags)
    torch.testing.assert_close(train_lp, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_moe_bf16_response_log_probs_are_as_close_to_hf_fp32_as_hf_bf16(norm_topk_prob, moe_hf, megatron_cpu_world):
    """bf16 Megatron (router in fp32, as the original's scripts) vs HF fp32: within 2× HF bf16's own gap + 0.01."""
    transformers = pytest.importorskip("transformers")
    hf_model, hf_dir = moe_hf(norm_topk_prob)
    expected = _hf_log_probs(hf_model)
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16).eval()
    hf16_gap = float((_hf_log_probs(hf16) - expected).abs().max())
    lp, config, _ = _megatron_log_probs(hf_dir, fp32=False, bf16=True, moe_router_dtype="fp32")
    assert config.params_dtype == torch.bfloat16
    gap = float((lp - expected).abs().max())
    assert 0 < gap <= 2 * hf16_gap + 0.01, (gap, hf16_gap)


def test_flex_dispatcher_without_deep_ep_is_refused_in_one_line(moe_hf):
    """megatron-core raised an ImportError while building the first MoE layer; now the flag is named first."""
    from slime_train_megatron.model import moe_token_dispatcher

    _, hf_dir = moe_hf(True)
    settings = MegatronSettings(expert_model_parallel_size=2, moe_token_dispatcher_type="flex", moe_enable_deepep=True)
    with pytest.raises(ValueError, match="^--moe-token-dispatcher-type flex needs DeepEP"):
        moe_token_dispatcher(settings, ModelArgs.from_hf_dir(hf_dir), cpu=False)


@pytest.mark.slow
def test_expert_parallel_two_ranks_export_logits_and_torch_dist(moe_hf, tmp_path):
    """EP 2 on two gloo ranks (2 experts each): HF export bit for bit, logits vs HF fp32 (1e-5), torch_dist saved at
    EP 2 and slime-convert's (written without parallelism) both load back bit for bit; router-loss metrics averaged
    over the two DP ranks.

    The same two ranks first build TP 2 × EP 2 (what `test_settings.py`'s
    `test_megatron_core_builds_tp2_ep2_on_two_ranks_from_these_kwargs` checked in a spawn of its own): the settings'
    `parallel_state_kwargs` give the experts ETP 1 × EP 2, while the call without `expert_tensor_parallel_size` (as
    before) makes ETP the TP size and needs TP 2 × EP 2 = 4 ranks.
    """
    pytest.importorskip("megatron.core")
    _, hf_dir = moe_hf(True)
    worker = pathlib.Path(__file__).with_name("_moe_ep2_worker.py")
    tp2_ep2 = MegatronSettings(tensor_model_parallel_size=2, expert_model_parallel_size=2).parallel_state_kwargs()
    before = {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run([sys.executable, str(worker), str(port), str(hf_dir), str(tmp_path),
                           json.dumps([tp2_ep2, before])], capture_output=True, text=True, timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    for r in ranks:
        ours, was = r["layouts"]
        assert ours == [1, 2], r
        assert "is not divisible by expert_tensor_model_pipeline_parallel size (4)" in was, r
    assert [r["local_experts"] for r in ranks] == [[0, 1], [2, 3]]
    for r in ranks:
        # Over r = 0, 1 (DP mean) and 2 layers: (4 + 2r) -> 5 / 2 and (30 + 4r) -> 32 / 2, on both ranks.
        assert r["router_metrics"] == {"train/load_balancing_loss": 2.5, "train/z_loss": 16.0}, r
        assert r["export_differs"] == [] and r["roundtrip_differs"] == [] and r["converted_differs"] == [], r
        assert r["fresh_model_differs"] and r["logits_max_diff"] < 1e-5, r


_ORIGINAL_QWEN3_MOE_FLAGS = [  # scripts/models/qwen3-30B-A3B.sh's MoE training flags (the architecture ones come from
    # config.json), as a run passes them
    "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm", "--moe-token-drop-policy", "probs",
    "--moe-router-dtype", "fp32", "--moe-permute-fusion", "--moe-aux-loss-coeff", "0",
]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [
        ["--moe-aux-loss-coeff", "0.01"],
        ["--moe-router-dtype", "fp64", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"],
        ["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.01"],
        [],
    ],
    ids=["aux", "fp64-aux-z", "seq-aux", "original"],
)
def test_bf16_train_step_with_the_original_qwen3_moe_flags(cpu_backend_env, moe_hf, extra):
    """The backend's bf16 RL step (old log-probs, one optimizer step) runs with the original's MoE flags; its old
    log-probs are HF fp32's within bf16 noise (0.01), and the router gets a finite gradient only from the policy
    loss or also from the router losses."""
    from slime_core.batch import RolloutBatch
    from slime_core.config import SlimeArgs

    hf_model, hf_dir = moe_hf(True)
    flags = ["--bf16", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3",
             *_ORIGINAL_QWEN3_MOE_FLAGS, *extra]  # fmt: skip
    run = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "advantage_estimator": "grpo",
           "n_samples_per_prompt": 2}  # fmt: skip
    args = SlimeArgs.from_dict({**run, "hf_checkpoint": str(hf_dir), "megatron_args": flags})
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    assert backend.module.config.moe_router_dtype == ("fp64" if "fp64" in extra else "fp32")
    batch = RolloutBatch(
        tokens=list(_SAMPLES), response_lengths=_RESPONSE_LENGTHS,
        loss_masks=[torch.ones(r) for r in _RESPONSE_LENGTHS],
        rewards=[1.0, -1.0], raw_rewards=[1.0, 0.0], loss_denominators=[float(r) for r in _RESPONSE_LENGTHS],
        micro_batches=[[[0], [1]]], step_sample_counts=[2], step_token_counts=[float(sum(_RESPONSE_LENGTHS))],
    )  # fmt: skip
    old = torch.cat(backend.compute_log_probs(batch)).double()
    torch.testing.assert_close(old, _hf_log_probs(hf_model), atol=0.01, rtol=0)  # measured 0.0014
    seen = {}
    step = backend.optimizer_step

    def capture():
        seen.update({n: p.main_grad.detach().clone() for n, p in backend.module.named_parameters() if "router" in n})
        return step()

    backend.optimizer_step = capture
    metrics = backend.train(0, batch)
    assert all(torch.isfinite(torch.tensor(float(v))) for v in metrics.values()), metrics
    assert seen and all(bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0 for g in seen.values())


def _hf_router_losses(hf_model, top_k: int = 2) -> dict[str, float]:
    """Switch load-balancing loss E·Σ_e f_e·P_e and z-loss mean(logsumexp²) per layer and sample, from HF's router
    logits (Fedus et al. 2021, eq. 4; Zoph et al. 2022, eq. 5), averaged as megatron-core's tracker is logged."""
    logits: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: logits.append(o[0].double()))
             for layer in hf_model.model.layers]  # fmt: skip
    with torch.no_grad():
        for ids in _SAMPLES:
            hf_model(ids[None])
    for h in hooks:
        h.remove()
    lb, z = [], []
    for lg in logits:  # [T, E] per (sample, layer)
        probs = torch.softmax(lg, -1)
        routed = torch.zeros_like(probs).scatter(1, probs.topk(top_k, -1).indices, 1.0)
        f, p = routed.sum(0) / (lg.shape[0] * top_k), probs.mean(0)
        lb.append(float(lg.shape[1] * (f * p).sum()))
        z.append(float((torch.logsumexp(lg, -1) ** 2).mean()))
    return {"train/load_balancing_loss": sum(lb) / len(lb), "train/z_loss": sum(z) / len(z)}


def test_router_loss_metrics_are_megatron_cores_tracked_losses(cpu_backend_env, moe_hf):
    """`train/load_balancing_loss` and `train/z_loss` (megatron-core's names; the original logs none): the mean over
    the rollout's micro-batches and MoE layers of the un-weighted losses, vs the same losses from HF's router logits
    (fp32 training forward vs fp64 reference: 1e-5). With the router losses off, no such metric."""
    from slime_core.batch import RolloutBatch
    from slime_core.config import SlimeArgs

    hf_model, hf_dir = moe_hf(True)
    run = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "advantage_estimator": "grpo",
           "n_samples_per_prompt": 2, "hf_checkpoint": str(hf_dir)}  # fmt: skip
    base = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]
    batch = RolloutBatch(
        tokens=list(_SAMPLES), response_lengths=_RESPONSE_LENGTHS,
        loss_masks=[torch.ones(r) for r in _RESPONSE_LENGTHS], rewards=[1.0, -1.0], raw_rewards=[1.0, 0.0],
        loss_denominators=[float(r) for r in _RESPONSE_LENGTHS], micro_batches=[[[0], [1]]], step_sample_counts=[2],
        step_token_counts=[float(sum(_RESPONSE_LENGTHS))],
    )  # fmt: skip
    metrics = {}
    for coeffs in (["--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"], ["--moe-aux-loss-coeff", "0"]):
        backend = cpu_backend_env.MegatronTrainBackend()
        backend.init(SlimeArgs.from_dict({**run, "megatron_args": [*base, *coeffs]}), with_ref=False)
        metrics[coeffs[1]] = backend.train(0, batch)
    expected = _hf_router_losses(hf_model)
    on = {k: v for k, v in metrics["0.01"].items() if k in expected}
    assert on.keys() == expected.keys(), metrics["0.01"]
    for name, value in expected.items():
        assert abs(on[name] - value) <= 1e-5, (name, on[name], value)
    assert not {"train/load_balancing_loss", "train/z_loss"} & metrics["0"].keys()


def test_an_empty_schedule_slot_adds_no_router_loss_gradient_and_no_router_metric(cpu_backend_env, moe_hf):
    """Reproducer: the 2-token dummy that fills an empty schedule slot ran the routers in training mode, so
    megatron-core attached its load-balancing and z-loss to it (gradient through the MoEAuxLossAutoScaler, which
    ignores the dummy's zero loss), tracked them for `train/*`, and counted it in the micro-batches that divide
    the real ones' router-loss gradient. Every parameter's gradient and the router metrics with a dummy slot are
    now those without it (fp32, same micro-batches in the same order: 1e-6 relative)."""
    from slime_core.batch import RolloutBatch
    from slime_core.config import SlimeArgs

    _, hf_dir = moe_hf(True)
    run = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "advantage_estimator": "grpo",
           "n_samples_per_prompt": 2, "hf_checkpoint": str(hf_dir)}  # fmt: skip
    flags = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3",
             "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001"]  # fmt: skip
    grads, metrics = {}, {}
    for slots in ([[0], [1]], [[0], [], [1]]):
        batch = RolloutBatch(
            tokens=list(_SAMPLES), response_lengths=_RESPONSE_LENGTHS,
            loss_masks=[torch.ones(r) for r in _RESPONSE_LENGTHS], rewards=[1.0, -1.0], raw_rewards=[1.0, 0.0],
            loss_denominators=[float(r) for r in _RESPONSE_LENGTHS], micro_batches=[slots], step_sample_counts=[2],
            step_token_counts=[float(sum(_RESPONSE_LENGTHS))],
        )  # fmt: skip
        backend = cpu_backend_env.MegatronTrainBackend()
        backend.init(SlimeArgs.from_dict({**run, "megatron_args": flags}), with_ref=False)
        step, seen = backend.optimizer_step, {}

        def capture(step=step, seen=seen, backend=backend):
            seen.update({n: p.main_grad.detach().clone() for n, p in backend.module.named_parameters()})
            return step()

        backend.optimizer_step = capture
        metrics[len(slots)] = backend.train(0, batch)
        grads[len(slots)] = seen
    with_dummy, without = grads[3], grads[2]
    routers = [n for n in without if "router" in n]
    assert routers and all(float(without[n].abs().max()) > 0 for n in routers)
    for name, grad in without.items():
        torch.testing.assert_close(with_dummy[name], grad, rtol=1e-6, atol=1e-9, msg=name)
    for name in ("train/load_balancing_loss", "train/z_loss"):
        assert abs(metrics[3][name] - metrics[2][name]) <= 1e-6 * abs(metrics[2][name]), (name, metrics)
