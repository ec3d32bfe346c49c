"""End-to-end tests of `FSDPTrainBackend` on CPU/gloo with a tiny Qwen3 built from config (fp32).

Each scenario `_workers.py` dispatches (kept in `_scenario_*.py` by concern) runs in fresh processes (world size 1
or 2, torchrun-style environment), writes its per-rank results, and the assertions below check them. Tolerances:
1e-5 absolute on log-probs and gradients (fp32 kernels differ only in summation order), 1e-5 relative on DP parameter
updates, exact where the computation is the same sequence of operations (ratio 1 on the first on-policy step, resume
on CPU).
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import shutil

import pytest
import torch

from slime_core import dir_swap

WORKER = pathlib.Path(__file__).with_name("_workers.py")
TOL = 1e-5


_LAUNCH = pathlib.Path(__file__).with_name("_launch.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch", _LAUNCH)
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(WORKER)
_load_workers = _ranks.workers
launch = _ranks.forked  # ranks forked from the forkserver, which has imported torch and transformers once
launch_subprocesses = _ranks.subprocesses
_common = _launch.load_module(pathlib.Path(__file__).with_name("_worker_common.py"))


def _tiny_qwen3(path: pathlib.Path, tokenizer_dir: pathlib.Path, *, tied: bool) -> pathlib.Path:
    """A 2-layer Qwen3 (vocab 64, hidden 32) saved as an HF checkpoint with the real tokenizer files."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    for f in tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, path / f.name)
    _load_workers()  # the worker module's import errors show here, not in a rank
    return path


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, qwen3_tokenizer_dir) -> pathlib.Path:
    """Untied tiny Qwen3."""
    return _tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"), qwen3_tokenizer_dir, tied=False)


@pytest.fixture(scope="module")
def single(tiny_ckpt, tmp_path_factory) -> dict:
    return launch("single", 1, tmp_path_factory.mktemp("single"), tiny_ckpt)[0]


@pytest.fixture(scope="module")
def dp_runs(tiny_ckpt, tmp_path_factory) -> tuple[list[dict], list[dict]]:
    work = tmp_path_factory.mktemp("dp")
    first = launch("dp", 2, work, tiny_ckpt)
    # A save killed half-way leaves only a (marked) .tmp directory; it must be ignored by the resume below.
    (work / "ckpt" / "iter_0000002.tmp" / "model_and_optim").mkdir(parents=True)
    dir_swap.mark(work / "ckpt" / "iter_0000002.tmp")
    resumed = launch("resume", 2, work, tiny_ckpt)  # new processes: the "killed" run restarts from disk
    resumed_one = launch("resume1", 1, work, tiny_ckpt)
    return first, resumed + resumed_one


def test_log_probs_match_plain_transformers(single):
    assert single["hf_diff"] <= TOL


def test_packed_equals_one_sequence_at_a_time(single):
    p = single["packed"]
    assert p["lp_diff"] <= TOL
    assert p["grad_scale"] > 1e-2  # the gradients compared are not trivially zero
    assert p["grad_diff"] <= TOL


def test_top_p_replay_log_probs_match_a_dense_reference(single):
    # Issue 17: with --rollout-top-p < 1 the trainer scores the engine's kept ids (+ the target) only.
    assert single["topp_diff"] <= TOL
    assert single["topp_changes_values"] > 1e-2  # the restricted distribution really differs from the full one


def test_first_on_policy_step_has_unit_ratio(single):
    first = single["onpolicy_steps"][0]
    assert first["train/ppo_kl"] == 0.0
    assert first["train/pg_clipfrac"] == 0.0
    assert first["train/train_rollout_logprob_abs_diff"] == 0.0
    # The second step runs after an update: the ratio moves away from 1.
    assert single["onpolicy_steps"][1]["train/ppo_kl"] != 0.0


def test_metric_names_and_lr(single):
    keys = set(single["dp_steps"][0])
    assert {
        "train/loss",
        "train/pg_loss",
        "train/pg_clipfrac",
        "train/ppo_kl",
        "train/entropy_loss",
        "train/grad_norm",
        "train/lr",
    } <= keys
    assert single["dp_steps"][0]["train/lr"] == pytest.approx(1e-3)
    assert single["dp_steps"][0]["train/grad_norm"] > 0


def test_reference_model_kl(single):
    assert single["ref_init_diff"] == 0.0
    assert single["kl_steps"][0]["train/kl_loss"] == 0.0  # ref == actor before the first update
    assert single["kl_steps"][1]["train/kl_loss"] > 0.0
    assert single["ref_after_diff"] == 0.0  # the reference weights did not move
    assert single["actor_after_diff"] > 1e-3  # the actor did
    assert single["ref_updated_diff"] == 0.0  # --ref-update-interval 2 after rollout 1


def test_the_reference_that_follows_the_actor_resumes_with_it(single):
    # Issue 27 pass 27: with --ref-update-interval the resumed reference was rebuilt from --hf-checkpoint, so the KL
    # term ran against the initial weights until the next update; an uninterrupted run had rollout 1's actor there.
    assert single["ref_resume_start"] == 3
    assert single["ref_resumed_diff"] == 0.0  # exact: the saved shards, same kernels
    assert "ref" in single["ref_ckpt_files"]
    assert single["ref_resumed_initial_diff"] > 1e-3  # and the initial weights are not it
    assert single["ref_resumed_actor_diff"] == 0.0  # the trained weights are the checkpoint's, not the reference's


def test_load_naming_an_iteration_folder_resumes_neither_actor_nor_reference(single):
    # FSDP resumes a --save root only (the app refuses an iteration folder as --load before the trainer starts); with
    # --start-rollout-id past an update the reference stays the initial weights, as the actor does.
    assert single["ref_folder_start"] == 3
    assert single["ref_folder_actor_diff"] == 0.0
    assert single["ref_folder_initial_diff"] == 0.0


def test_a_checkpoint_without_ref_update_interval_holds_no_reference(dp_runs):
    first, _ = dp_runs
    assert "ref" not in {p.name for p in (pathlib.Path(first[0]["ckpt_dir"]) / "iter_0000001").iterdir()}


def test_ref_load_from_other_weights(single):
    assert single["ref_load_diff"] <= TOL  # ref weights are the exported trained model
    assert single["ref_load_actor_diff"] == 0.0  # the actor still starts from --hf-checkpoint
    assert single["ref_load_kl_steps"][0]["train/kl_loss"] > 1e-6


def test_protocol_conformance():
    from slime_core.protocols import TrainBackend
    from slime_train_fsdp import FSDPTrainBackend

    assert isinstance(FSDPTrainBackend(), TrainBackend)


def test_step_backend_conformance():
    from slime_core.train_step import StepBackend
    from slime_train_fsdp import FSDPTrainBackend

    assert isinstance(FSDPTrainBackend(), StepBackend)


def test_grpo_raises_positive_advantage_log_probs(single):
    g = single["grpo"]
    assert g["pos_after"] > g["pos_before"] + 0.05
    assert g["neg_after"] < g["neg_before"] - 0.05


def test_sleep_wake_up_and_gradient_checkpointing_keep_training_identical(single):
    assert "asleep" in single["asleep_error"]
    for name, t in single["dp_params"].items():
        assert torch.equal(t, single["sleep_params"][name]), name


def test_one_step_rollout_reuses_training_log_probs(single):
    for name, t in single["recompute_params"].items():
        assert torch.equal(t, single["reuse_params"][name]), name


def test_hf_export_loads_back(single):
    assert single["export_diff_single"] <= TOL
    assert single["export_diff_sharded"] <= TOL
    files = single["export_files"]
    assert "model.safetensors.index.json" in files and "config.json" in files and "tokenizer.json" in files


def test_named_hf_weights_buckets(single, tiny_ckpt):
    from safetensors.torch import load_file

    hf = load_file(str(tiny_ckpt / "model.safetensors"))
    seen = {}
    for bucket in single["buckets"]:
        total = sum(nbytes for _, _, nbytes in bucket)
        assert total <= 10_000 or len(bucket) == 1
        for name, shape, _ in bucket:
            assert name not in seen
            seen[name] = shape
    assert seen == {n: tuple(t.shape) for n, t in hf.items()}
    assert len(single["buckets"]) > 1


def test_one_rank_keeps_gathered_parameters_through_backward_only(single):
    # Inside the training block a layer stays gathered after its forward (no re-gather in backward, issue 26);
    # afterwards, and after a no-grad forward, every parameter is a shard again (swaps, saves, offloads read them).
    assert single["gathered"] == {"before": True, "after_forward": False, "after_block": True,
                                  "after_no_grad_forward": True}  # fmt: skip


def test_world_size_two_matches_one(single, dp_runs):
    first, _ = dp_runs
    init = single["init_params"]
    for rank in range(2):
        for name, ref in single["dp_params"].items():
            got = first[rank]["dp_params"][name]
            step = (ref - init[name]).abs().max()
            assert step > 0
            assert (got - ref).abs().max() <= TOL * step + 1e-7, name
        for s in range(2):
            for key, val in single["dp_steps"][s].items():
                assert first[rank]["dp_steps"][s][key] == pytest.approx(val, rel=TOL, abs=1e-7), key


def test_uneven_split_with_empty_micro_batch_per_token_loss(single, dp_runs):
    # 3 + 1 samples per rank, rank 1 with an empty micro-batch per step, --calculate-per-token-loss.
    first, _ = dp_runs
    init = single["init_params"]
    for rank in range(2):
        for name, ref in single["per_token_params"].items():
            got = first[rank]["uneven_params"][name]
            assert (got - ref).abs().max() <= TOL * (ref - init[name]).abs().max() + 1e-7, name
        for s in range(2):
            for key, val in single["per_token_steps"][s].items():
                assert first[rank]["uneven_steps"][s][key] == pytest.approx(val, rel=TOL, abs=1e-7), key


def test_checkpoint_layout(dp_runs):
    root = pathlib.Path(dp_runs[0][0]["ckpt_dir"])
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "1"
    names = {p.name for p in (root / "iter_0000001").iterdir()}
    assert {"model_and_optim", "meta.json", "scheduler.pt", "rng_0.pt", "rng_1.pt", dir_swap.MARKER} <= names


def test_resume_is_bitwise_identical(dp_runs):
    first, resumed = dp_runs
    for rank in range(2):
        assert resumed[rank]["start"] == 1
        assert resumed[rank]["global_step"] == 2
        exp, got = first[rank]["resume_params_expected"], resumed[rank]["resume_params"]
        for name in exp:
            assert torch.equal(exp[name], got[name]), name
        # Everything but the wall-clock timings (perf/*) is bitwise identical.
        untimed = [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in
                   (resumed[rank]["resume_metrics"], first[rank]["resume_metrics_expected"])]  # fmt: skip
        assert untimed[0] == untimed[1]


@pytest.mark.gpu
def test_gpu_smoke(tiny_ckpt, tmp_path):
    """On CUDA/NCCL (1 or 2 GPUs): bf16 compute near fp32, training, sleep frees memory, resume restores."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    world = min(2, torch.cuda.device_count())
    results = launch_subprocesses("gpu", world, tmp_path, tiny_ckpt)
    for res in results:
        assert res["lp_diff"] < 5e-2  # bf16 forward vs fp32 reference
        for m in res["metrics"]:
            assert all(math.isfinite(v) for v in m.values())
        before, after = res["mem_before_after_sleep"]
        assert after < before
        assert res["bucket_dtype_device"] == ("torch.float32", "cuda")
        assert res["start"] == 3
        assert res["resume_max_diff"] == 0.0
        # pinned host buffers: one per parameter shard and Adam moment, reused by the next sleep, and a
        # wake-up restores parameters and optimizer states bit for bit on the GPU
        n, pinned, nbytes = res["pinned_buffers"]
        assert pinned and n > 0 and nbytes > 0
        assert res["buffers_reused"]
        assert res["wake_params_equal"] and res["wake_states_equal"]
        assert res["states_device"] == ["cuda"]


def test_resume_on_a_different_world_size(dp_runs):
    first, resumed = dp_runs
    one = resumed[2]
    assert one["start"] == 1
    for name, t in first[0]["dp_params"].items():
        assert torch.equal(one["loaded_params"][name], t), name
    init = first[0]["dp_params"]
    for name, ref in first[0]["resume_params_expected"].items():
        step = (ref - init[name]).abs().max()
        # One fp32 ulp at the parameter's magnitude on top: 1 and 2 ranks sum gradients in different orders.
        ulp = torch.finfo(torch.float32).eps * ref.abs().max()
        assert (one["resume_params"][name] - ref).abs().max() <= TOL * step + ulp, name


def test_tied_embeddings_two_ranks(tmp_path, qwen3_tokenizer_dir):
    ckpt = _tiny_qwen3(tmp_path / "tied", qwen3_tokenizer_dir, tied=True)
    for res in launch("tied", 2, tmp_path, ckpt):
        assert res["hf_diff"] <= TOL
        assert res["tied_after_train"]
        assert res["export_diff"] <= TOL  # the export (without lm_head) reloads to the trained model
        assert "lm_head.weight" not in res["names"]


@pytest.fixture(scope="module")
def pipeline_runs(tiny_ckpt, tmp_path_factory) -> tuple[dict, list[dict]]:
    work = tmp_path_factory.mktemp("pipeline")
    return launch("pipeline", 1, work, tiny_ckpt)[0], launch("pipeline", 2, work, tiny_ckpt)


def test_real_train_data_pipeline_world_sizes_agree(pipeline_runs):
    """`build_rollout_batches` (GRPO group normalization, token-budget micro-batches) → train, DP 1 vs 2."""
    one, two = pipeline_runs
    assert len(one["steps"]) == 2
    assert sum(len(step) for step in one["micro_batches"]) > 2  # the 16-token budget splits the steps
    for res in two:
        for name, ref in one["params"].items():
            step = (ref - one["init"][name]).abs().max()
            assert step > 0
            assert (res["params"][name] - ref).abs().max() <= TOL * step + 1e-7, name
        for s, ref_step in enumerate(one["steps"]):
            for key, val in ref_step.items():
                assert res["steps"][s][key] == pytest.approx(val, rel=TOL, abs=1e-7), key


def test_real_train_data_pipeline_step_gradient_by_hand(pipeline_runs, tiny_ckpt):
    """Step 0's gradient, at 1 and 2 ranks, is the original's: on-policy GRPO (ratio 1, no clipping) gives
    `-(1/4) Σ_i A_i/D_i Σ_t m_it ∇ log p_it` over the step's 4 samples, computed with plain transformers here
    (A_i the group-normalized reward, D_i the sample's trainable tokens)."""
    from transformers import AutoModelForCausalLM

    from slime_core.train_data import postprocess_rewards

    args = _common.make_args(str(tiny_ckpt), reward_key=None, disable_rewards_normalization=False)
    samples = _load_workers()._inputs.pipeline_samples()
    _, advantages = postprocess_rewards(args, samples)
    model = AutoModelForCausalLM.from_pretrained(tiny_ckpt, dtype=torch.float32, attn_implementation="eager")
    loss = 0.0
    for sample, advantage in list(zip(samples, advantages, strict=True))[:4]:  # step 0: the first 4 rollouts
        tokens, r = torch.tensor(sample.tokens), sample.response_length
        mask = torch.tensor(sample.loss_mask, dtype=torch.float32)
        logits = model(tokens[None]).logits[0, -r - 1 : -1] / _common.TEMPERATURE
        logp = torch.log_softmax(logits, -1).gather(1, tokens[-r:, None])[:, 0]
        loss = loss - advantage * (logp * mask).sum() / mask.sum() / 4
    loss.backward()
    want = {name: p.grad for name, p in model.named_parameters()}
    scale = max(float(g.abs().max()) for g in want.values())
    one, two = pipeline_runs
    for res in (one, *two):
        got = {name.replace("_orig_mod.", ""): g for name, g in res["grad0"].items()}
        assert got.keys() == want.keys()
        for name, g in want.items():
            assert float((got[name] - g).abs().max()) <= TOL * scale, name


@pytest.fixture(scope="module")
def loss_types(tiny_ckpt, tmp_path_factory) -> dict:
    return launch("loss_types", 1, tmp_path_factory.mktemp("loss_types"), tiny_ckpt)[0]


def _masked_means(lps, batch) -> list[float]:
    return [float((lp * m).sum() / max(float(m.sum()), 1.0)) for lp, m in zip(lps, batch.loss_masks, strict=True)]


def test_sft_loss_trains_the_nll_of_every_sample(loss_types):
    """--loss-type sft_loss: step 0's loss is the masked NLL by hand (mean over the step's 4 samples of each
    sample's token mean), and training raises the likelihood of every sample, negative rewards included."""
    batch = _common.make_batch(0, 1)
    before = loss_types["before"]
    expected = -sum(float((before[i] * batch.loss_masks[i]).sum()) / batch.loss_denominators[i] for i in range(4)) / 4
    first = loss_types["sft_steps"][0]
    assert first["train/loss"] == pytest.approx(expected, abs=TOL)
    assert "train/pg_loss" not in first  # the policy loss did not run
    after = _masked_means(loss_types["sft_after"], batch)
    assert all(a > b for a, b in zip(after, _masked_means(before, batch), strict=True))


def test_custom_loss_plugin_drives_training(loss_types):
    """--loss-type custom_loss calls the plugin (2 x NLL here) with the original 4-argument signature."""
    sft, custom = loss_types["sft_steps"], loss_types["custom_steps"]
    # Same initial weights and batch: step 0 is exactly twice the SFT loss; the plugin's metric is reported.
    assert custom[0]["train/loss"] == pytest.approx(2 * sft[0]["train/loss"], abs=TOL)
    assert custom[0]["train/nll"] == pytest.approx(sft[0]["train/loss"], abs=TOL)
    seen = loss_types["custom_seen"]
    assert len(seen) == 4  # 2 steps x 2 micro-batches
    assert all(s["advantages_none"] and s["entropy_grad"] for s in seen)
    assert all(s["token_lengths"] == s["total_lengths"] for s in seen)


def test_policy_loss_without_advantages_fails_clearly(loss_types):
    assert "--disable-compute-advantages-and-returns" in loss_types["policy_error"]


def test_freeze_and_only_train_param_lists(loss_types):
    """--freeze-params-name-list keeps the matching weights bit-identical; --only-train-params-name-list trains
    only the matching ones (HF names, re.search)."""
    frozen = {n for n, changed in loss_types["freeze"].items() if not changed}
    assert frozen == {n for n in loss_types["freeze"] if ".mlp." in n or "embed_tokens" in n}
    trained = {n for n, changed in loss_types["only_train"].items() if changed}
    assert trained == {n for n in loss_types["only_train"] if "layers.1.self_attn." in n or "lm_head" in n}
    assert trained and len(trained) < len(loss_types["only_train"])


def _assert_compiled_once_per_grad_mode(res: dict, *, head_graphs: bool = False) -> None:
    # One graph for the no-grad forward and one for forward+backward, whatever the micro-batch's sequence count:
    # a guard on the count recompiled every layer for each new count (8 times, then eager), issue 26.
    # On CUDA the fused log-prob head's elementwise functions are compiled too (`fused_head`, CUDA only) and add
    # their graphs to dynamo's one global count: there the count is fixed after the first rollout, not 2.
    assert len(res["sequence_counts"]) >= 5
    if head_graphs:
        assert res["graphs"][0] >= 2 and res["graphs"] == [res["graphs"][0]] * len(res["graphs"]), res
    else:
        assert res["graphs"] == [2] * len(res["graphs"]), res
    assert res["frames"][-1] == res["frames"][0], res
    # The warm-up is reported where it happens (the first train() compiles the grad-mode graph), then never.
    assert res["compile_time"][0] > 0 and res["compile_time"][1:] == [None] * (len(res["compile_time"]) - 1)


def test_compiled_layers_do_not_recompile_for_new_sequence_counts(tiny_ckpt, tmp_path):
    _assert_compiled_once_per_grad_mode(launch("compile", 1, tmp_path, tiny_ckpt)[0])


@pytest.mark.gpu
def test_compiled_layers_do_not_recompile_on_gpu(tiny_ckpt, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _assert_compiled_once_per_grad_mode(launch_subprocesses("compile_gpu", 1, tmp_path, tiny_ckpt)[0], head_graphs=True)
