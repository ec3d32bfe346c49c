"""End-to-end FP8 rollout on CPU: BF16 (here fp32) training, the reference engine serving a blockwise-FP8 checkpoint.

`apps/train` runs with an FP8 `--hf-checkpoint` (made by `slime-convert hf-to-fp8`) and the unquantized weights as
`--ref-load`. Every push is quantized by the trainer; after each one the weight check compares every engine tensor
(each FP8 weight and its scale, fused as SGLang fuses them, hashed dequantized as SGLang's checker does) with the
trainer's quantization of its weights, so the
engine holds exactly dequant(quant(trainer weights)). The first-step |Δlogp| is reported and is larger than the
fp32-vs-fp32 gap of plain serving, yet under the FP8 gate.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from slime_convert.fp8 import hf_to_fp8

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"

pytestmark = pytest.mark.slow


def test_fp8_rollout_two_rollouts(tmp_path, make_tiny_qwen3, tb_scalars):
    bf16 = make_tiny_qwen3(tmp_path / "bf16", hidden_size=64, intermediate_size=128, head_dim=16,
                           max_position_embeddings=1024)  # fmt: skip
    fp8 = tmp_path / "fp8"
    hf_to_fp8(bf16, fp8, block_size=(32, 32), progress=False)
    out = tmp_path / "run"
    argv = [
        sys.executable, str(REPO / "apps" / "train"), "--train-backend", "fsdp",
        "--hf-checkpoint", str(fp8), "--ref-load", str(bf16),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--rm-type", "math", "--advantage-estimator", "grpo", "--use-tis",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "2",
        "--rollout-max-response-len", "8", "--rollout-temperature", "1.0",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate", "--lr", "1e-4",
        "--check-weight-sync-interval", "1", "--check-weight-sync-tensors", "64",
        "--output-dir", str(out), "--save-hf", str(out / "hf"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "FP8 rollout: engines serve" in log and "32x32 blocks" in log

    tb = out / "tensorboard"
    # Each push: all engine tensors (2 layers × qkv, o, gate_up, down with their scales, norms, embedding) equal.
    checked = tb_scalars(tb, "weight_check/tensors_checked")
    assert set(checked) == {0, 1, 2} and min(checked.values()) >= 17, checked  # at the versions pushed
    assert set(tb_scalars(tb, "weight_check/mismatches").values()) == {0.0}
    diff = tb_scalars(tb, "train/train_rollout_logprob_abs_diff")
    # fp32 trainer vs FP8 engine: above plain serving's < 1e-4 (test_train_e2e), below the FP8 gate.
    assert 1e-4 < diff[0] < 0.3, diff
    print(f"first-step |dlogp| with FP8 serving: {diff[0]:.4g}")
    # The export holds the trainer's unquantized weights: no quantization_config copied from the FP8 checkpoint.
    assert "quantization_config" not in json.loads((out / "hf" / "config.json").read_text())
