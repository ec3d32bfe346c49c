"""End to end on CPU: the fully-async rollout in the real loop (Ray, reference engine, FSDP on gloo).

The original's launch flags (`--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async`,
engines on their own GPU, `--partial-rollout`) plus `--max-weight-staleness`: the run completes, every trained sample
carries the engine version it came from and is at most the bound behind, the staleness reaches TensorBoard, and each
checkpoint holds the producer's groups next to the data cursor, and a run resumed from it continues the prompt
stream (the held groups first, then the cursor's next prompts; none trained twice, none skipped).
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

pytestmark = pytest.mark.slow

BOUND = 1
ORIGINAL_PATH_FA = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
FIRST, TOTAL = 2, 4  # rollouts of the first run, and of the resumed one (from the last checkpoint)


def _argv(model: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(REPO / "apps" / "train"), "--train-backend", "fsdp", "--hf-checkpoint", str(model),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--rm-type", "math", "--advantage-estimator", "grpo", "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--rollout-max-response-len", "8",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--lr", "1e-4", "--output-dir", str(out),
        "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt"), *extra,
    ]  # fmt: skip


def _dump(out: pathlib.Path, rollout_id: int) -> list[dict]:
    return torch.load(out / "dumps" / f"rollout_{rollout_id}.pt", weights_only=False)["samples"]


def _held(ckpt: pathlib.Path, rollout_id: int) -> list[list[dict]]:
    """The groups the producer held at the checkpoint of `rollout_id`."""
    return json.loads((ckpt / "rollout" / f"fully_async_{rollout_id}.json").read_text())["held"]


def test_fully_async_run_trains_within_the_staleness_bound(tiny_qwen3, tmp_path, tb_scalars):
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    extra = [
        "--num-rollout", str(FIRST), "--rollout-num-gpus", "1", "--sglang-server-concurrency", "2",
        "--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
        "--max-weight-staleness", str(BOUND), "--partial-rollout", "--save", str(ckpt), "--save-interval", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO"}
    argv = _argv(tiny_qwen3, out, *extra)
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    for rollout_id in range(FIRST):
        versions = [int(v) for s in _dump(out, rollout_id) for v in s["weight_versions"]]
        # Rollout r trains with weight version r: its samples come from versions r - BOUND .. r.
        assert versions and all(rollout_id - BOUND <= v <= rollout_id for v in versions), (rollout_id, versions)
        held = json.loads((ckpt / "rollout" / f"fully_async_{rollout_id}.json").read_text())["held"]
        assert all(len(g) == 2 for g in held)
    staleness = tb_scalars(out / "tensorboard", "rollout/staleness_max")
    assert sorted(staleness) == list(range(FIRST)) and all(0 <= v <= BOUND for v in staleness.values()), staleness
    assert sorted(tb_scalars(out / "tensorboard", "rollout/stale_groups_dropped")) == list(range(FIRST))

    # Resume from the last checkpoint: the held groups, then the data source's next prompts.
    held = [g[0]["group_index"] for g in _held(ckpt, FIRST - 1)]
    cursor = json.loads((ckpt / "rollout" / f"data_source_{FIRST - 1}.json").read_text())["sample_group_index"]
    out2 = tmp_path / "run2"
    argv = _argv(tiny_qwen3, out2, *extra[2:], "--num-rollout", str(TOTAL), "--load", str(ckpt))
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    before = [{s["group_index"] for s in _dump(out, r)} for r in range(FIRST)]
    after = [{s["group_index"] for s in _dump(out2, r)} for r in range(FIRST, TOTAL)]
    trained = sorted(i for groups in before + after for i in groups)
    assert len(trained) == len(set(trained)) == 2 * TOTAL  # 2 groups per rollout, none twice
    assert min(set().union(*after) - set(held)) >= cursor  # fresh prompts come after the checkpoint's cursor
    # Every prompt drawn in either run was trained, dropped as stale (counted), or is held at the last checkpoint.
    held_last = {g[0]["group_index"] for g in _held(ckpt, TOTAL - 1)}
    cursor_last = json.loads((ckpt / "rollout" / f"data_source_{TOTAL - 1}.json").read_text())["sample_group_index"]
    assert not held_last & set(trained)
    dropped = [tb_scalars(o / "tensorboard", "rollout/stale_groups_dropped") for o in (out, out2)]
    num_dropped = sum(dropped[0][r] for r in range(FIRST)) + sum(dropped[1][r] for r in range(FIRST, TOTAL))
    assert len(set(range(cursor_last)) - held_last - set(trained)) == num_dropped, (dropped, held_last, trained)


@pytest.mark.parametrize("loop", ["sync", "async"])
def test_fully_async_on_one_shared_gpu_with_both_sides_resident(tiny_qwen3, tmp_path, tb_scalars, loop):
    """`--colocate --no-offload-train --no-offload-rollout`: the engine keeps generating on the trainer's GPU while
    it trains (nothing is swapped), the weights go through the colocated tensor transport, and every trained sample
    is within the staleness bound (issue 30 item 1: what one GPU allows). With `--async` rollout r is generated on
    the engines' version r - 1 (the push waits for it): the producer paces by that version (at bound 1 it dropped
    the batch it drew ahead, every rollout from 2 on)."""
    out = tmp_path / "run"
    num_rollout = 3 if loop == "sync" else 4
    extra = [
        "--num-rollout", str(num_rollout), "--colocate", "--no-offload-train", "--no-offload-rollout",
        "--sglang-server-concurrency", "2", "--rollout-function-path", ORIGINAL_PATH_FA,
        "--max-weight-staleness", str(BOUND), "--partial-rollout", *(["--async"] if loop == "async" else []),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO"}
    proc = subprocess.run(_argv(tiny_qwen3, out, *extra), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "weight sync: tensor (tensor handles to colocated engines)" in log
    for rollout_id in range(num_rollout):
        versions = [int(v) for s in _dump(out, rollout_id) for v in s["weight_versions"]]
        assert versions and all(rollout_id - BOUND <= v <= rollout_id for v in versions), (rollout_id, versions)
    staleness = tb_scalars(out / "tensorboard", "rollout/staleness_max")
    assert sorted(staleness) == list(range(num_rollout)), staleness
    assert all(0 <= v <= BOUND for v in staleness.values()), staleness
    # The producer paces itself to the bound: nothing generated is dropped (one H200 dropped 20 of 32 groups every
    # other rollout at this setting).
    dropped = tb_scalars(out / "tensorboard", "rollout/stale_groups_dropped")
    assert dropped == dict.fromkeys(range(num_rollout), 0.0), dropped
    with pytest.raises(KeyError):  # no swap was timed: both sides stayed resident
        tb_scalars(out / "tensorboard", "perf/engine_release_time")
