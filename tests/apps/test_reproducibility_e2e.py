"""Two real runs with the same flags are bit-identical rollout by rollout.

Issue 27 (pass 81): the README promised that two runs with the same flags generate the same samples; the demo's
runs drew the same tokens for 60 rollouts and then parted. The sampling seeds were per sample already; the CPU
reference engine's batching was not: a row's log-probs moved in their last bits with the requests batched with it
(which depends on timing), and once in a while a sampled token flipped. With `--sglang-enable-deterministic-inference`
the reference engine now runs one request at a time (it noted the flag as having no effect). Digests compared per
rollout: token ids, rewards, rollout log-probs (exact floats), the loss and grad norm, and the final HF weights.
The second run adds `--use-fault-tolerance` (health probes while generating), which must change none of them: one
run fewer in CI than checking the two claims apart. A `--load` resume's exactness is `test_loop_resume`'s and the
async SIGKILL test's.

One rollout per run (two before): the rollout's samples and the trained weights are compared bit for bit, and a
second rollout only generated again from those weights after a push. That the engine then holds exactly the
trainer's bytes is checked at every push by test_fp8_rollout_e2e.py (`--check-weight-sync-interval 1`) and after a
training step by test_vlm_pipeline.py's checksum round trip; the reference engine keeps no cache across requests.
"""

import hashlib
import os
import pathlib
import random
import subprocess
import sys
import tempfile

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _argv(out: pathlib.Path, *extra: str) -> list[str]:
    from slime_app.demo import MODEL_DIR, TRAIN_DATA

    return [
        sys.executable, str(REPO / "apps" / "train"),
        "--train-backend", "fsdp", "--hf-checkpoint", str(MODEL_DIR),
        "--prompt-data", str(TRAIN_DATA), "--input-key", "prompt", "--label-key", "label",
        "--rm-type", "math", "--advantage-estimator", "grpo", "--seed", "1234",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--global-batch-size", "32",
        "--rollout-max-response-len", "8", "--rollout-temperature", "1.0", "--num-rollout", "1",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--colocate", "--lr", "5e-4",
        "--sglang-enable-deterministic-inference",
        "--output-dir", str(out), "--save-hf", str(out / "hf"),
        "--save-debug-rollout-data", str(out / "dumps" / "{rollout_id}.pt"),
        *extra,
    ]  # fmt: skip


def _run(out: pathlib.Path, *extra: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": tempfile.mkdtemp(prefix="ray-repro-"),
           "SLIME_ENGINE_BASE_PORT": str(random.randrange(30000, 60000, 100))}  # fmt: skip
    proc = subprocess.run(_argv(out, *extra), cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


def _rollout_digest(out: pathlib.Path, rollout_id: int) -> dict[str, str]:
    samples = torch.load(out / "dumps" / f"{rollout_id}.pt", weights_only=False)["samples"]
    assert len(samples) == 32

    def digest(field: str) -> str:
        return hashlib.sha256(repr([s[field] for s in samples]).encode()).hexdigest()

    return {f: digest(f) for f in ("index", "tokens", "reward", "rollout_log_probs")}


def _weights(out: pathlib.Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted((out / "hf").glob("*.safetensors")):
        tensors.update(load_file(f))
    assert tensors
    return tensors


def test_two_runs_are_bit_identical_rollout_by_rollout(tmp_path, tb_scalars):
    """The demo's model and prompts (rewards vary, so advantages, loss, grad norm and the weight updates are not 0)."""
    first, watched = tmp_path / "first", tmp_path / "watched"
    _run(first)
    _run(watched, "--use-fault-tolerance", "--rollout-health-check-interval", "1")  # health probes while generating
    assert _rollout_digest(watched, 0) == _rollout_digest(first, 0)
    for key in ("train/loss", "train/grad_norm"):
        reference = tb_scalars(first / "tensorboard", key)
        assert sorted(reference) == [0]
        assert tb_scalars(watched / "tensorboard", key) == reference
    reference, weights = _weights(first), _weights(watched)
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[k], reference[k]) for k in reference)
    rewards = [s["reward"] for s in torch.load(first / "dumps" / "0.pt", weights_only=False)["samples"]]
    assert 0 < sum(rewards) < len(rewards)  # advantages, loss and grad norm are not all zero: the weights moved
    assert all(v != 0 for v in tb_scalars(first / "tensorboard", "train/grad_norm").values())
