"""`FSDPCriticBackend` (the PPO value model) and the FSDP actor's on-policy-distillation teacher, on CPU/gloo
with tiny Qwen3s built from config (fp32).

The scenarios of `_critic_workers.py` run in forked processes (world size 1 or 2) and write their results;
the assertions below check them. Tolerances: 1e-5 absolute on values and log-probs against a plain transformers
forward (fp32 kernels differ in summation order); 1e-5 relative on the DP parameter update; exact for a resumed
checkpoint. The OPD teacher is a differently seeded tiny Qwen3 (HF directory), then an FSDP checkpoint of the
trained student.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import shutil

import pytest
import torch

from slime_train_fsdp.value_model import fill_value_head

pytestmark = [
    pytest.mark.slow,  # multi-process: ranks forked from the forkserver (_launch.py)
]

WORKER = pathlib.Path(__file__).with_name("_critic_workers.py")
TOL = 1e-5
# What only a policy has: token log-probs, the RL step, reference/teacher weights, HF export and engine weight push.
ACTOR_ONLY = ("compute_log_probs", "train", "update_ref", "has_ref", "has_teacher", "save_hf", "named_hf_weights")


_LAUNCH = pathlib.Path(__file__).with_name("_launch.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch", _LAUNCH)
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(WORKER)
_load_workers = _ranks.workers
# Ranks forked from the forkserver, not from this process (a critic rank forked from a pytest worker that had run
# the FSDP files aborted natively in backward about 1 run in 4; see _launch.py).
launch = _ranks.forked
launch_subprocesses = _ranks.subprocesses


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, qwen3_tokenizer_dir) -> pathlib.Path:
    """A 2-layer Qwen3 (vocab 64, hidden 32, tied embeddings) saved as an HF checkpoint."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = tmp_path_factory.mktemp("tiny_qwen3_critic")
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    for f in qwen3_tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, path / f.name)
    _load_workers()  # the worker module's import errors show here, not in a rank
    return path


@pytest.fixture(scope="module")
def single(tiny_ckpt, tmp_path_factory) -> dict:
    return launch("single", 1, tmp_path_factory.mktemp("critic_single"), tiny_ckpt)[0]


def test_values_match_a_plain_transformers_backbone_with_the_head(single):
    assert single["protocol"] and single["start"] == 0
    assert single["value_diff"] <= TOL
    # A fresh head as the original's critic: weight ~ N(0, 0.02), bias 0.
    assert 0.005 < single["head_std"] < 0.05 and single["head_bias"] == 0.0


def test_training_fits_the_returns(single):
    history = single["history"]
    assert single["first_values_diff"] == 0.0  # the returned values are the ones before the update
    first, last = history[0], history[-1]
    # γ = λ = 1: every return is its sample's reward (±1); the critic learns to predict them.
    assert last["train/critic-value_loss"] < 0.2 * first["train/critic-value_loss"]
    assert first["train/critic-explained_variance"] < 0.2 < 0.8 < last["train/critic-explained_variance"]
    assert last["train/critic-return_mean"] == pytest.approx(first["train/critic-return_mean"])
    assert all(math.isfinite(m["train/critic-grad_norm"]) for m in history)
    assert first["train/critic-lr"] == pytest.approx(3e-3)  # --critic-lr, not --lr
    assert {"train/critic-value_clipfrac", "train/critic-value_mean"} <= set(first)


def test_checkpoint_resumes_exactly(single):
    assert single["saved_dir"] == ["iter_0000025", "latest_checkpointed_iteration.txt"]
    assert single["resumed_start"] == 25
    for a, b in zip(single["saved_values"], single["resumed_values"], strict=True):
        assert torch.equal(a, b)


def test_the_critic_is_a_critic_backend_and_nothing_of_the_actor():
    """Composition, not an actor subclass that refuses: the actor-only API does not exist on the critic."""
    from slime_core.critic import CriticStepBackend
    from slime_core.protocols import CriticBackend, TrainBackend
    from slime_train_fsdp import FSDPCriticBackend, FSDPTrainBackend

    assert not issubclass(FSDPCriticBackend, FSDPTrainBackend)
    critic = FSDPCriticBackend()
    assert isinstance(critic, CriticBackend) and isinstance(critic, CriticStepBackend)
    assert not isinstance(critic, TrainBackend)
    assert [m for m in ACTOR_ONLY if hasattr(critic, m)] == []


def test_bad_critic_load_fails_clearly(single):
    assert (
        "neither a critic checkpoint (latest_checkpointed_iteration.txt) nor an HF directory"
        in (single["bad_load_error"])
    )


def test_an_actors_checkpoint_given_as_the_critics_is_refused_naming_the_flag(single):
    """An actor's FSDP checkpoint where the critic's should be: one line naming the flag the user gave."""
    by_critic_load = single["actor_ckpt_error_critic_load"]
    assert by_critic_load.startswith("--critic-load ") and "actor_run" in by_critic_load.split(":")[0]
    assert "iter_0000001 is not a critic checkpoint" in by_critic_load and "<--save>/critic" in by_critic_load
    by_load = single["actor_ckpt_error_load"]
    assert by_load.startswith("--load ") and "actor_as_load/critic" in by_load.split(":")[0]
    assert "is not a critic checkpoint" in by_load and "\n" not in by_load


def test_two_ranks_match_one(tiny_ckpt, tmp_path):
    one = launch("dp", 1, tmp_path, tiny_ckpt)[0]
    two = launch("dp", 2, tmp_path, tiny_ckpt)
    for key in ("train/critic-value_loss", "train/critic-explained_variance", "train/critic-grad_norm"):
        assert two[0]["metrics"][key] == pytest.approx(one["metrics"][key], rel=TOL, abs=TOL)
        assert two[1]["metrics"][key] == two[0]["metrics"][key]
    for name, param in one["params"].items():
        torch.testing.assert_close(two[0]["params"][name], param, rtol=TOL, atol=TOL)
    # Rank r holds its slice of the values, in its batch order (samples 2r, 2r+1 of each step).
    values_two = two[0]["values"][:2] + two[1]["values"][:2]
    for a, b in zip(values_two, one["values"][:4], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=TOL)


def test_value_head_from_a_checkpoint_or_fresh():
    class _Model:
        config = type("C", (), {"hidden_size": 4, "initializer_range": 0.5})()

    score = {"score.weight": torch.ones(1, 4), "score.bias": torch.tensor([2.0])}
    got = fill_value_head(_Model(), score)  # an HF reward / token-classification head
    assert torch.equal(got["value_head.weight"], torch.ones(1, 4)) and float(got["value_head.bias"]) == 2.0
    fresh = fill_value_head(_Model(), {"score.weight": torch.ones(3, 4)})  # a 3-label head is not a value head
    assert fresh["value_head.weight"].shape == (1, 4) and float(fresh["value_head.bias"]) == 0.0
    assert not torch.equal(fresh["value_head.weight"], torch.ones(1, 4))


# ---------------------------------------------------------------- the OPD teacher of the actor


def _save_tiny(path: pathlib.Path, tokenizer_dir: pathlib.Path, seed: int) -> pathlib.Path:
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    for f in tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, qwen3_tokenizer_dir) -> dict:
    work = tmp_path_factory.mktemp("opd_teacher")
    student = _save_tiny(work / "student_hf", qwen3_tokenizer_dir, seed=0)
    _save_tiny(work / "teacher_hf", qwen3_tokenizer_dir, seed=1)
    return launch("teacher", 1, work, student)[0]


def test_teacher_log_probs_come_from_the_teacher_weights(teacher_run):
    assert teacher_run["has_teacher"]
    assert teacher_run["teacher_diff"] <= TOL and teacher_run["student_diff"] <= TOL
    assert teacher_run["student_after_teacher_diff"] == 0.0  # the actor's weights are swapped back exactly


def test_first_step_reports_the_reverse_kl(teacher_run):
    """One step over 4 samples, old = current: opd_reverse_kl = mean_i Σ_t m_t (lp - lp_T) / D_i."""
    batch = _load_workers().make_batch(0, 1)
    student, teacher = teacher_run["student"], teacher_run["teacher"]
    per_sample = [
        float(((s - t) * m).sum() / d)
        for s, t, m, d in zip(student, teacher, batch.loss_masks, batch.loss_denominators, strict=True)
    ]
    expected = (sum(per_sample[:4]) / 4 + sum(per_sample[4:]) / 4) / 2  # two steps of 4 samples, averaged
    assert teacher_run["metrics"]["train/opd_reverse_kl"] == pytest.approx(expected, abs=1e-4)


def test_teacher_from_an_fsdp_checkpoint(teacher_run):
    assert teacher_run["ckpt_teacher_diff"] <= TOL


@pytest.mark.gpu
def test_gpu_critic_and_teacher(tiny_ckpt, tmp_path):
    """On CUDA/NCCL (1 or 2 GPUs): bf16 values near fp32, training, sleep frees memory, exact resume, OPD teacher."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    world = min(2, torch.cuda.device_count())
    for res in launch_subprocesses("gpu", world, tmp_path, tiny_ckpt):
        assert res["value_diff"] < 5e-2  # bf16 forward vs the fp32 reference
        for m in res["metrics"]:
            assert all(math.isfinite(v) for v in m.values())
        before, after = res["mem_before_after_sleep"]
        assert after < before
        assert res["start"] == 3 and res["resume_max_diff"] == 0.0
        assert res["teacher_student_diff"] == 0.0
        assert abs(res["opd_metrics"]["train/opd_reverse_kl"]) < 1e-6  # student == teacher on the first step
