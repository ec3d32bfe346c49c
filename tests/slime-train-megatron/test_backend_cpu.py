"""`MegatronTrainBackend` end to end on CPU (world of 1, local spec, fp32).

megatron-core's optimizer, pipeline schedule and checkpoint writer hard-code CUDA; the `cpu_backend_env` fixture
(conftest.py) replaces them with CPU stand-ins (plain Adam on the DDP grads, a no-pipelining loop that calls the
backend's forward step / loss function / finalize hook exactly as megatron-core does, a no-op synchronize). Everything
else is the backend's own code: HF loading through the convert tables, packing, vocab-parallel log-probs,
the loss from slime_core, metrics, checkpoints and HF export.
"""

import types

import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import PluginArgs, SlimeArgs

pytest.importorskip("megatron.core")


def _config(**fields) -> SlimeArgs:
    """A validated run config (one rollout of one sample: the batches below bring their own schedule)."""
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", **fields})


def _batch():
    tokens = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8, 9]), torch.tensor([10, 11, 12, 13, 14, 15])]
    return RolloutBatch(
        tokens=tokens,
        response_lengths=[2, 2, 3],
        loss_masks=[torch.ones(2), torch.ones(2), torch.tensor([1.0, 0.0, 1.0])],
        rewards=[1.0, -1.0, 0.5],
        raw_rewards=[1.0, 0.0, 1.0],
        loss_denominators=[2.0, 2.0, 2.0],
        micro_batches=[[[0, 1], [2]], [[0], [1, 2], []]],  # an empty slot: the dummy path
        step_sample_counts=[3, 3],
        step_token_counts=[5.0, 5.0],
    )


def test_init_logprobs_train_export_save_resume(cpu_backend_env, tiny_hf, tmp_path):
    hf_model, hf_dir = tiny_hf("qwen3")
    args = _config(
        hf_checkpoint=str(hf_dir),
        megatron_args=["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"],
        save=str(tmp_path / "save"),
        advantage_estimator="grpo",
        rollout_temperature=0.9,
        kl_coef=0.0,
        use_kl_loss=True,
        kl_loss_coef=0.01,
        kl_loss_type="low_var_kl",
        entropy_coef=0.0,
        eps_clip=0.2,
    )
    backend = cpu_backend_env.MegatronTrainBackend()
    assert backend.init(args, with_ref=True) == 0
    batch = _batch()

    lp = backend.compute_log_probs(batch)
    for t, r, got in zip(batch.tokens, batch.response_lengths, lp, strict=True):
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(t[None]).logits[0].double() / 0.9, -1)
        expected = ref[len(t) - r - 1 : len(t) - 1].gather(1, t[len(t) - r :, None])[:, 0]
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)  # fp32 vs fp64 softmax

    metrics = backend.train(0, batch)
    assert metrics["train/grad_norm"] > 0 and metrics["train/lr"] == pytest.approx(1e-3)
    assert {"train/loss", "train/pg_loss", "train/kl_loss", "train/pg_clipfrac"} <= metrics.keys()
    # Step 1 is on-policy with ref == actor: ratio 1, KL 0, so pg_loss = -mean advantage-weighted mask term.
    first = backend.step_metrics[0]
    assert first["train/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert first["train/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    lp_after = backend.compute_log_probs(batch)
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(lp, lp_after, strict=True))
    ref_lp = backend.compute_log_probs(batch, model="ref")
    for a, b in zip(lp, ref_lp, strict=True):
        assert torch.equal(a, b)  # the reference weights are the initial ones

    # Pushed weights == the trainer's parameters under HF names (padding stripped, fused tensors split).
    from slime_convert.mapping import mcore_to_hf

    pushed = [bucket for bucket in backend.named_hf_weights(20_000)]
    assert all(sum(t.numel() * t.element_size() for _, t in b) <= 20_000 or len(b) == 1 for b in pushed)
    flat = dict(kv for b in pushed for kv in b)
    expected = dict(
        kv for n, p in backend.module.named_parameters() for kv in mcore_to_hf(n, p.detach(), backend.model_args)
    )
    assert flat.keys() == expected.keys() == set(hf_model.state_dict().keys())
    for name, tensor in expected.items():
        assert torch.equal(flat[name], tensor), name
    assert not torch.equal(
        flat["model.layers.0.self_attn.q_proj.weight"], hf_model.state_dict()["model.layers.0.self_attn.q_proj.weight"]
    )

    # Written, then named in the tracker by `commit_save` (the driver writes its run state in between).
    backend.save(0, commit=False)
    assert (tmp_path / "save" / "iter_0000000").is_dir()
    assert not (tmp_path / "save" / "latest_checkpointed_iteration.txt").exists()
    backend.commit_save(0)
    assert (tmp_path / "save" / "latest_checkpointed_iteration.txt").read_text() == "0"
    resumed = cpu_backend_env.MegatronTrainBackend()
    args = args.model_copy(update={"megatron_args": [*args.megatron_args, "--load", str(tmp_path / "save")]})
    assert resumed.init(args, with_ref=False) == 1
    for a, b in zip(lp_after, resumed.compute_log_probs(batch), strict=True):
        assert torch.equal(a, b)


# With the original GLM-4.7 script's `--make-vocab-size-divisible-by 64` and a vocabulary 8 rows past a multiple of
# 128: the embedding holds 152000 rows (64 × 2375; 128 would pad to 152064), none of the padding reaches the engine.
@pytest.mark.parametrize(("divisor", "vocab_size", "rows"), [(None, 151936, 151936), ("64", 151944, 152000)])
def test_weights_pushed_to_an_engine_after_a_step_are_the_trainers(
    cpu_backend_env, make_tiny_qwen3, tmp_path, divisor, vocab_size, rows
):
    """Megatron step → `named_hf_weights` → tensor weight update → the (reference) engine now computes exactly
    what an HF model holding the trainer's weights computes."""
    pytest.importorskip("slime_rollout")
    import asyncio
    import os
    import random

    from transformers import AutoModelForCausalLM

    from slime_convert.mapping import mcore_to_hf
    from slime_rollout.engines.client import RolloutClient
    from slime_rollout.engines.launch import launch_engines
    from slime_rollout.weight_sync.updaters import TensorWeightUpdater

    # The full Qwen3 vocab: the engine's health check generates from real token ids.
    hf_dir = make_tiny_qwen3(tmp_path / "hf", vocab_size=vocab_size)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    padding = ["--make-vocab-size-divisible-by", divisor] if divisor else []
    args = _config(
        hf_checkpoint=str(hf_dir),
        megatron_args=["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-2",
                       *padding],  # fmt: skip
        advantage_estimator="grpo", rollout_temperature=1.0, kl_coef=0.0, use_kl_loss=False, entropy_coef=0.0,
        eps_clip=0.2, rollout_engine="reference", seed=1, sglang_args={"num_threads": "1"},
    )  # fmt: skip
    # The engine launcher's base port is no config field: the plugin view carries it as an extra attribute.
    engine_args = PluginArgs.from_config(args)
    engine_args.sglang_base_port = random.Random(os.getpid() + 7).randrange(20000, 40000, 100)
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    assert backend.module.embedding.word_embeddings.weight.shape[0] == rows
    backend.train(0, _batch())
    trained = dict(
        kv for n, p in backend.module.named_parameters() for kv in mcore_to_hf(n, p.detach(), backend.model_args)
    )
    assert not torch.equal(trained["model.norm.weight"], hf_model.state_dict()["model.norm.weight"])

    prompt = [785, 4226, 374, 220, 17, 10, 17, 28]

    async def engine_logprobs(url):
        client = RolloutClient([url])
        out = await client.generate(
            {
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True},
            }  # fmt: skip
        )
        await client.aclose()
        return out["output_ids"], torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])

    with launch_engines(engine_args, num_engines=1, gpus_per_engine=1, startup_timeout_s=300) as group:
        url = group.urls[0]
        TensorWeightUpdater(args, RolloutClient([url]), load_format=None).update(backend.named_hf_weights(1 << 20), "1")
        ids, got = asyncio.run(engine_logprobs(url))
    result = hf_model.load_state_dict(trained, strict=False)  # tied: lm_head.weight is embed_tokens.weight
    assert set(result.missing_keys) <= {"lm_head.weight"} and not result.unexpected_keys
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].double()
    expected = torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=0)  # fp32 engine vs fp32 HF


def _custom_loss(args, batch, logits, sum_of_sample_mean):
    """`--custom-loss-function-path` plugin: twice the SFT loss; records what it was given."""
    _custom_loss.seen.append((batch["advantages"] is None, all(e.requires_grad for e in logits["entropy"])))
    nll = -sum_of_sample_mean(torch.cat(logits["log_probs"]))
    return 2.0 * nll, {"nll": nll}


_custom_loss.seen = []


def test_sft_and_custom_loss_types(cpu_backend_env, tiny_hf, monkeypatch):
    """--loss-type sft_loss / custom_loss with --disable-compute-advantages-and-returns really change the loss:
    step 0 is the masked NLL by hand (custom: twice it), and SFT raises every sample's likelihood."""
    import sys

    _, hf_dir = tiny_hf("qwen3")
    plugin = types.ModuleType("slime_megatron_test_custom_loss")
    plugin.loss = _custom_loss
    monkeypatch.setitem(sys.modules, plugin.__name__, plugin)

    def make(**kw):
        return _config(
            hf_checkpoint=str(hf_dir),
            megatron_args=["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"],
            advantage_estimator="grpo", rollout_temperature=1.0, kl_coef=0.0, use_kl_loss=False, entropy_coef=0.0,
            eps_clip=0.2, disable_compute_advantages_and_returns=True, **kw,
        )  # fmt: skip

    batch = _batch()
    sft = cpu_backend_env.MegatronTrainBackend()
    sft.init(make(loss_type="sft_loss"), with_ref=False)
    before = sft.compute_log_probs(batch)
    sft.train(0, batch)
    expected = -sum(float((lp * m).sum()) / 2.0 for lp, m in zip(before, batch.loss_masks, strict=True)) / 3
    assert sft.step_metrics[0]["train/loss"] == pytest.approx(expected, abs=1e-5)
    assert "train/pg_loss" not in sft.step_metrics[0]
    after = sft.compute_log_probs(batch)
    for a, b, m in zip(after, before, batch.loss_masks, strict=True):
        assert float((a * m).sum()) > float((b * m).sum())  # also for the reward -1 sample

    custom = cpu_backend_env.MegatronTrainBackend()
    custom.init(make(loss_type="custom_loss", custom_loss_function_path=f"{plugin.__name__}.loss"), with_ref=False)
    custom.train(0, batch)
    assert custom.step_metrics[0]["train/loss"] == pytest.approx(2 * expected, abs=1e-5)
    assert custom.step_metrics[0]["train/nll"] == pytest.approx(expected, abs=1e-5)
    assert _custom_loss.seen and all(adv_none and ent_grad for adv_none, ent_grad in _custom_loss.seen)


def test_sft_loss_per_token_is_the_steps_token_mean_over_its_micro_batches(cpu_backend_env, tiny_hf):
    """--loss-type sft_loss --calculate-per-token-loss (the original's SFT recipe): step 0 (micro-batches [0, 1] and
    [2], 5 trainable tokens) reports the NLL summed over the step's tokens over 5, as the original's `loss_function`
    (the summed loss, `num_tokens` as Megatron's divisor), not a mean of per-micro-batch or per-sample means."""
    _, hf_dir = tiny_hf("qwen3")
    args = _config(
        hf_checkpoint=str(hf_dir),
        megatron_args=["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"],
        rollout_temperature=1.0, kl_coef=0.0, use_kl_loss=False, entropy_coef=0.0, loss_type="sft_loss",
        disable_compute_advantages_and_returns=True, calculate_per_token_loss=True,
    )  # fmt: skip
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    batch = _batch()
    before = backend.compute_log_probs(batch)
    backend.train(0, batch)
    nll = [-float((lp * m).sum()) for lp, m in zip(before, batch.loss_masks, strict=True)]
    assert backend.step_metrics[0]["train/loss"] == pytest.approx(sum(nll) / 5, abs=1e-5)
    per_sample = (nll[0] / 2 + nll[1] / 2 + nll[2] / 2) / 3
    assert abs(sum(nll) / 5 - per_sample) > 1e-3  # the batch tells the two normalizations apart


def test_freeze_and_only_train_param_lists(cpu_backend_env, tiny_hf):
    """Matching megatron-core parameters stay bit-identical through a training rollout; the others move."""
    _, hf_dir = tiny_hf("qwen3")
    for flags, frozen_if in (
        ({"freeze_params_name_list": [r"\.mlp\.", "embedding"]}, lambda n: ".mlp." in n or "embedding" in n),
        ({"only_train_params_name_list": ["output_layer"]}, lambda n: "output_layer" not in n),
    ):
        args = _config(
            hf_checkpoint=str(hf_dir),
            megatron_args=["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-2"],
            advantage_estimator="grpo", rollout_temperature=1.0, kl_coef=0.0, use_kl_loss=False, entropy_coef=0.0,
            eps_clip=0.2, **flags,
        )  # fmt: skip
        backend = cpu_backend_env.MegatronTrainBackend()
        backend.init(args, with_ref=False)
        before = {n: p.detach().clone() for n, p in backend.module.named_parameters()}
        backend.train(0, _batch())
        for name, param in backend.module.named_parameters():
            assert torch.equal(param, before[name]) == frozen_if(name), (flags, name)


def test_save_hf_exports_the_trainers_weights(cpu_backend_env, tiny_hf, tmp_path):
    """`--save-hf` on Megatron: after a step, the HF export holds exactly the trainer's weights under HF names,
    with the source config files, and `from_pretrained` loads it (fp32 everywhere: exact equality)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from slime_convert.mapping import mcore_to_hf
    from slime_core.protocols import TrainBackend
    from slime_core.train_step import StepBackend

    _, hf_dir = tiny_hf("qwen2")  # tied embeddings: the export has no lm_head.weight, as HF writes it
    backend = cpu_backend_env.MegatronTrainBackend()
    assert isinstance(backend, TrainBackend) and isinstance(backend, StepBackend)
    backend.init(
        _config(
            hf_checkpoint=str(hf_dir),
            megatron_args=["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-2"],
        ),
        with_ref=False,
    )
    backend.train(0, _batch())
    expected = dict(
        kv for n, p in backend.module.named_parameters() for kv in mcore_to_hf(n, p.detach(), backend.model_args)
    )
    out = tmp_path / "export"
    (out.parent / "export.tmp").mkdir()  # a stale partial export from a killed run is replaced
    backend.save_hf(out)
    assert not (tmp_path / "export.tmp").exists()
    # One shard: `model.safetensors` without an index, as `save_pretrained` writes it (slime_core.hf_checkpoint).
    assert {"config.json", "generation_config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    exported = {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    assert exported.keys() == expected.keys() and "lm_head.weight" not in exported
    for name, tensor in expected.items():
        assert torch.equal(exported[name], tensor), name
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name
    assert torch.equal(loaded["lm_head.weight"], expected["model.embed_tokens.weight"])  # tied on load


_LOCAL_FP32 = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]


def _mlp_calls_in_a_step(env, hf_dir, extra):
    """Calls of layer 0's MLP during one `train` (after the log-probs), its grad norm and the log-probs after it."""
    args = _config(
        hf_checkpoint=str(hf_dir),
        megatron_args=[*_LOCAL_FP32, *extra],
        advantage_estimator="grpo",
    )
    backend = env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    batch = _batch()
    backend.compute_log_probs(batch)
    calls = []
    layer = backend.module.decoder.layers[0]
    handle = layer.mlp.register_forward_hook(lambda *_: calls.append(1))
    metrics = backend.train(0, batch)
    handle.remove()
    return len(calls), metrics["train/grad_norm"], backend.compute_log_probs(batch)


def test_megatron_recompute_flags_reach_the_layers(cpu_backend_env, tiny_hf, monkeypatch):
    # The original scripts' --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 is
    # forwarded to megatron-core: each layer runs its forward again in the backward pass (memory for compute), and
    # the step is the same one.
    from megatron.core.tensor_parallel import random as mcore_random

    # megatron-core's checkpoint saves and restores the CUDA RNG too; on CPU only torch's own RNG exists.
    monkeypatch.setattr(mcore_random, "_get_all_rng_states", lambda: (torch.get_rng_state(), None, None))
    monkeypatch.setattr(mcore_random, "_set_all_rng_states", lambda cpu, *_: torch.set_rng_state(cpu))
    _, hf_dir = tiny_hf("qwen3")
    plain, norm, lp = _mlp_calls_in_a_step(cpu_backend_env, hf_dir, [])
    recompute = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    again, norm_r, lp_r = _mlp_calls_in_a_step(cpu_backend_env, hf_dir, recompute)
    # The step's five micro-batch slots (two steps: 2 + 3, the empty one's dummy row included) run their layer
    # forward once more in the backward pass; the no-grad forwards of the step are not recomputed.
    assert again - plain == 5
    assert norm_r == pytest.approx(norm, rel=1e-5)
    for a, b in zip(lp, lp_r, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)  # fp32, same math in another order of saves
