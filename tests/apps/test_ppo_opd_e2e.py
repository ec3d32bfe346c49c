"""End-to-end PPO and on-policy distillation on CPU: Ray (local), reference engines, FSDP on gloo, the demo task.

Short runs (16 prompts x 4 samples, 8-token responses, a few rollouts) of the real loop:

1. PPO (critic colocated, sharing the actor's slot): the critic reports its metrics from rollout 0, the actor
   trains after `--num-critic-only-steps`, both checkpoints are written; a second run resumed from the rollout-2
   checkpoint and replaying the first run's rollouts (`--load-debug-rollout-data`) reproduces its critic and
   actor metrics, so the critic's weights, optimizer and schedule were resumed, not rebuilt.
2. OPD with a teacher engine (`--opd-type sglang`, no task reward) and with the teacher in the trainer
   (`--opd-type fsdp`, next to the task reward), the teacher being the demo model at temperature 1/2 (its final
   norm doubled: logits x2): the first rollout's `train/opd_reverse_kl` equals the student-teacher log-prob gap
   recomputed with transformers from the dumped samples, and the engine's scores are the teacher's log-probs of
   exactly the sampled tokens. (That the KL falls and the student learns over a longer run is the OPD demo's
   measurement, README.md.)
"""

import math
import os
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from slime_app.demo import MODEL_DIR, TRAIN_DATA

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _argv(out: pathlib.Path, *extra: str, reward: bool = True) -> list[str]:
    return [
        sys.executable, str(REPO / "apps" / "train"),
        "--train-backend", "fsdp", "--hf-checkpoint", str(MODEL_DIR),
        "--prompt-data", str(TRAIN_DATA), "--input-key", "prompt", "--label-key", "label",
        *(["--rm-type", "math"] if reward else []),
        "--rollout-batch-size", "16", "--n-samples-per-prompt", "4", "--global-batch-size", "64",
        "--rollout-max-response-len", "8", "--rollout-temperature", "1.0", "--seed", "1234",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate",
        "--output-dir", str(out), "--use-tensorboard",
        *extra,
    ]  # fmt: skip


def _run(argv: list[str]) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log


CRITIC_METRICS = ("value_loss", "value_clipfrac", "explained_variance", "value_mean", "return_mean", "grad_norm")


def test_ppo_trains_the_critic_and_resumes_it_exactly(tmp_path, tb_scalars):
    ckpt, dumps = tmp_path / "ckpt", tmp_path / "dumps" / "rollout_{rollout_id}.pt"
    ppo = ["--advantage-estimator", "ppo", "--normalize-advantages", "--lr", "5e-4", "--critic-lr", "3e-3",
           "--num-critic-only-steps", "1", "--num-rollout", "3"]  # fmt: skip
    first = tmp_path / "run1"
    log = _run(_argv(first, *ppo, "--save", str(ckpt), "--save-interval", "2", "--save-debug-rollout-data", str(dumps)))
    assert "rollout 0: the critic trains alone" in log
    critic = {key: tb_scalars(first / "tensorboard", f"train/critic-{key}") for key in CRITIC_METRICS}
    for key, series in critic.items():
        assert sorted(series) == [0, 1, 2] and all(math.isfinite(v) for v in series.values()), (key, series)
    assert all(v > 0 for v in critic["value_loss"].values()) and all(
        0 <= v <= 1 for v in critic["value_clipfrac"].values()
    )
    pg_loss = tb_scalars(first / "tensorboard", "train/pg_loss")
    assert sorted(pg_loss) == [1, 2]  # the actor trains from rollout 1 on
    for tracker in (ckpt / "critic", ckpt):
        assert (tracker / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
        assert (tracker / "iter_0000002").is_dir()

    # Resume from the rollout-2 checkpoints and train on the same samples: rollout 2 again, same numbers.
    second = tmp_path / "run2"
    replay = ["--load", str(ckpt), "--ckpt-step", "2", "--load-debug-rollout-data", str(dumps)]
    log = _run(_argv(second, *ppo, *replay))
    assert "the critic resumes at rollout" not in log  # actor and critic checkpoints agree
    for key in ("value_loss", "value_mean", "explained_variance", "grad_norm"):
        resumed = tb_scalars(second / "tensorboard", f"train/critic-{key}")
        assert sorted(resumed) == [2], (key, resumed)
        for r in (2,):  # fp32 CPU kernels, same inputs: equal up to summation order
            assert resumed[r] == pytest.approx(critic[key][r], rel=1e-4, abs=1e-6), (key, r, resumed, critic[key])
    resumed_pg = tb_scalars(second / "tensorboard", "train/pg_loss")
    assert resumed_pg == pytest.approx({2: pg_loss[2]}, rel=1e-4, abs=1e-6)


@pytest.fixture(scope="module")
def sharp_teacher(tmp_path_factory) -> pathlib.Path:
    """The demo model at temperature 1/2: final RMSNorm weight x2 (tied, bias-free head), so logits are doubled."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("sharp_teacher")
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(MODEL_DIR).save_pretrained(out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def teacher_engine(sharp_teacher, tmp_path_factory):
    """A reference engine serving the teacher (what `python -m sglang.launch_server` is on GPUs)."""
    port = _free_port()
    log = open(tmp_path_factory.mktemp("teacher_log") / "engine.log", "w")
    cmd = [sys.executable, "-m", "slime_rollout.engines.reference", "--model-path", str(sharp_teacher),
           "--port", str(port), "--num-threads", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    try:
        while True:
            assert proc.poll() is None, "teacher engine exited"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                assert time.time() < deadline, "teacher engine did not come up"
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


OPD_FLAGS = ["--use-opd", "--lr", "5e-4", "--num-rollout", "2"]


def _response_log_probs(model_dir: pathlib.Path, samples: list[dict]) -> list[torch.Tensor]:
    """`[response_length]` float32 log-probs of each sample's response tokens under `model_dir` (transformers, T=1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for s in samples:
            tokens = torch.tensor([s["tokens"]])
            logp = torch.log_softmax(model(tokens).logits[0, :-1].float(), dim=-1)
            picked = logp.gather(-1, tokens[0, 1:, None])[:, 0]  # [T-1]: token t+1 given 0..t
            out.append(picked[len(s["tokens"]) - 1 - s["response_length"] :])
    return out


def _check_first_rollout(out: pathlib.Path, dumps: str, teacher: pathlib.Path, tb_scalars) -> list[dict]:
    """Rollout 0's `train/opd_reverse_kl` is the per-sample token mean of `log p_student - log p_teacher`,
    averaged over samples, recomputed here with transformers from the rollout's own tokens (tolerance 1e-4)."""
    samples = torch.load(dumps.format(rollout_id=0), weights_only=False)["samples"]
    assert len(samples) == 64 and all(s["loss_mask"] is None or all(s["loss_mask"]) for s in samples)
    student, teacher_lp = _response_log_probs(MODEL_DIR, samples), _response_log_probs(teacher, samples)
    expected = sum(float((s - t).mean()) for s, t in zip(student, teacher_lp, strict=True)) / len(samples)
    kl = tb_scalars(out / "tensorboard", "train/opd_reverse_kl")
    assert sorted(kl) == [0, 1]
    assert expected > 0.02  # the teacher differs: a zero or misaligned teacher term would not match below
    assert kl[0] == pytest.approx(expected, rel=1e-4, abs=1e-6), (kl, expected)
    assert sorted(tb_scalars(out / "tensorboard", "train/pg_loss")) == [0, 1]
    return samples


def test_opd_with_a_teacher_engine_pure_distillation(sharp_teacher, teacher_engine, tmp_path, tb_scalars):
    out, dumps = tmp_path / "run", str(tmp_path / "dumps" / "rollout_{rollout_id}.pt")
    opd = ["--opd-type", "sglang", "--rm-url", f"{teacher_engine}/generate", "--save-debug-rollout-data", dumps]
    _run(_argv(out, *OPD_FLAGS, *opd, reward=False))
    samples = _check_first_rollout(out, dumps, sharp_teacher, tb_scalars)
    # What the engine returned for each response is the teacher's log-probs of exactly those tokens.
    for s, t in zip(samples, _response_log_probs(sharp_teacher, samples), strict=True):
        assert torch.tensor(s["teacher_log_probs"]) == pytest.approx(t, abs=1e-4), s["index"]
    # No task reward: the OPD term alone.
    assert set(tb_scalars(out / "tensorboard", "rollout/raw_reward").values()) == {0.0}


def test_opd_with_the_teacher_in_the_trainer_and_a_task_reward(sharp_teacher, tmp_path, tb_scalars):
    out, dumps = tmp_path / "run", str(tmp_path / "dumps" / "rollout_{rollout_id}.pt")
    opd = ["--opd-type", "fsdp", "--opd-teacher-load", str(sharp_teacher), "--save-debug-rollout-data", dumps]
    _run(_argv(out, *OPD_FLAGS, *opd))
    samples = _check_first_rollout(out, dumps, sharp_teacher, tb_scalars)
    assert all(s["teacher_log_probs"] is None for s in samples)  # scored in the trainer, not the rollout
    assert max(tb_scalars(out / "tensorboard", "rollout/raw_reward").values()) > 0  # the math reward is still given
