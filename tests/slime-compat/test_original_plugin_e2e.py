"""A plugin written for the original slime runs unchanged in a CPU end-to-end run of `apps/train`.

The plugin (`original_plugins/orig_gsm8k_plugin.py`) uses only the original's imports and signatures: a
two-turn custom generate function posting to the router with `slime.utils.http_utils.post`, a custom reward,
a dynamic-sampling filter. Its directory is put on PYTHONPATH, as the original's launch scripts do with Ray's
runtime env. Ray (local), the reference engine and FSDP on gloo run for real.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"
PLUGINS = pathlib.Path(__file__).parent / "original_plugins"

pytestmark = pytest.mark.slow


def test_original_plugin_runs_unchanged(make_tiny_qwen3, tmp_path):
    from transformers import AutoTokenizer

    model = make_tiny_qwen3(tmp_path / "model", hidden_size=32, intermediate_size=64, head_dim=8,
                            max_position_embeddings=1024)  # fmt: skip
    out = tmp_path / "run"
    argv = [
        sys.executable, str(REPO / "apps" / "train"),
        "--train-backend", "fsdp", "--hf-checkpoint", str(model),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--custom-generate-function-path", "orig_gsm8k_plugin.generate",
        "--custom-rm-path", "orig_gsm8k_plugin.reward_func",
        "--dynamic-sampling-filter-path", "orig_gsm8k_plugin.keep_diverse_groups",
        "--rollout-batch-size", "2", "--over-sampling-batch-size", "3", "--n-samples-per-prompt", "3",
        "--global-batch-size", "6", "--num-rollout", "2", "--rollout-max-response-len", "8",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate", "--lr", "1e-4",
        "--output-dir", str(out), "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(PLUGINS)}
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]

    tokenizer = AutoTokenizer.from_pretrained(model)
    obs_ids = tokenizer("\nObservation: keep going.\n", add_special_tokens=False)["input_ids"]
    labels = {json.loads(line)["answer"] for line in GSM8K.read_text().splitlines()}
    for rollout_id in (0, 1):
        samples = torch.load(out / "dumps" / f"rollout_{rollout_id}.pt", weights_only=False)["samples"]
        assert len(samples) == 6  # 2 kept groups of 3
        for group_start in range(0, 6, 3):
            rewards = [s["reward"] for s in samples[group_start : group_start + 3]]
            assert max(rewards) > min(rewards)  # the plugin's filter decided which groups were kept
        for s in samples:
            assert s["label"] in labels
            mask, lps = s["loss_mask"], s["rollout_log_probs"]
            assert len(mask) == len(lps) == s["response_length"]
            # turn 1 (trainable) | observation (masked, log-prob 0.0) | turn 2 (trainable)
            start = mask.index(0)
            n_obs = len(obs_ids)
            assert mask[start : start + n_obs] == [0] * n_obs and lps[start : start + n_obs] == [0.0] * n_obs
            assert s["tokens"][-s["response_length"] :][start : start + n_obs] == obs_ids
            assert 1 <= start <= 4 and all(m == 1 for m in mask[start + n_obs :])
            assert s["reward"] in (0.0, 0.25, 0.5, 1.0)
    # The trainer's log-probs of the plugin's tokens match the engine's (fp32 on both sides).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    diffs = {e.step: e.value for e in acc.Scalars("train/train_rollout_logprob_abs_diff")}
    assert diffs[0] < 1e-4
