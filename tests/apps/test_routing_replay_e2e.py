"""End-to-end MoE routing replay on CPU: `apps/train` with `--use-rollout-routing-replay` on a tiny random Qwen3-MoE.

The reference engine starts with `--enable-return-routed-experts`, every sample carries the engine's routes, the
FSDP trainer replays them in every actor forward and reports `train/routing_replay_mismatch`; the trained MoE weights
(fused in the trainer) reach the engine as per-expert matrices, and the weight check compares every engine parameter
after the first push, the experts' `w13_weight` / `w2_weight` included.
"""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"

pytestmark = pytest.mark.slow


def test_rollout_routing_replay_two_rollouts(tmp_path, make_tiny_qwen3_moe, tb_scalars):
    model = make_tiny_qwen3_moe(tmp_path / "moe", max_position_embeddings=1024)
    out = tmp_path / "run"
    argv = [
        sys.executable, str(REPO / "apps" / "train"), "--train-backend", "fsdp", "--hf-checkpoint", str(model),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--rm-type", "math", "--advantage-estimator", "grpo", "--use-rollout-routing-replay",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "2",
        "--rollout-max-response-len", "8", "--rollout-temperature", "1.0",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate", "--lr", "1e-3",
        "--output-dir", str(out), "--check-weight-sync-tensors", "64",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    tb = out / "tensorboard"
    mismatch = tb_scalars(tb, "train/routing_replay_mismatch")
    assert set(mismatch) == {0, 1} and all(0.0 <= v < 0.5 for v in mismatch.values()), mismatch
    diff = tb_scalars(tb, "train/train_rollout_logprob_abs_diff")
    # Same weights and the engine's routes: the first step's trainer log-probs match the engine's (fp32 both).
    assert diff[0] < 1e-3, diff
    # The engine's 20 parameters: per layer qkv, o, 2 qk-norms, 2 norms, router, experts.w13 and w2; embedding, norm.
    # Before the expert count reached the check: 16 compared and "48 unmatched names" (every expert matrix).
    assert tb_scalars(tb, "weight_check/tensors_checked") == {0: 20.0}, log[-3000:]
    assert "20 tensor checksums equal on 1 engine(s) (0 sharded, 0 unmatched names)" in log, log[-3000:]
    print(f"routing replay e2e: mismatch {mismatch}, first-step |dlogp| {diff[0]:.3g}")
