"""End-to-end runs of `apps/train` on CPU: Ray (local), the reference engine, FSDP on gloo.

1. GSM8K with the real Qwen3 tokenizer and a tiny random Qwen3 at top-p 0.5 (one run, three tests), started by
   `benchmarks/bench_e2e.sh` in its CPU smoke mode: 2 rollouts complete, chat-template prompts and GSM8K labels
   reach the reward, the first-step check holds with the engine's nucleus replayed, outputs are written, and the
   benchmark prints and appends one well-formed result line.
2. LoRA through the loop: base + adapter served, only the adapter synced and exported.
3. `--async` on bfloat16 (two runs): one step off-policy; killed with SIGKILL after its rollout-1 checkpoint, it
   resumes at the rollout after its last checkpoint with the same data order as an uninterrupted run.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"

pytestmark = pytest.mark.slow


def _argv(model: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(REPO / "apps" / "train"),
        "--train-backend", "fsdp",
        "--hf-checkpoint", str(model),
        "--prompt-data", str(GSM8K),
        "--input-key", "question",
        "--label-key", "answer",
        "--apply-chat-template",
        "--rm-type", "math",
        "--advantage-estimator", "grpo",
        "--rollout-batch-size", "2",
        "--n-samples-per-prompt", "2",
        "--global-batch-size", "4",
        "--rollout-max-response-len", "8",
        "--rollout-temperature", "1.0",
        "--actor-num-nodes", "1",
        "--actor-num-gpus-per-node", "1",
        "--colocate",
        "--lr", "1e-4",
        "--output-dir", str(out),
        "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt"),
        *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "SLIME_LOG_LEVEL": "INFO"}


def _dump(out: pathlib.Path, rollout_id: int) -> list[dict]:
    return torch.load(out / "dumps" / f"rollout_{rollout_id}.pt", weights_only=False)["samples"]


@pytest.fixture(scope="module")
def gsm8k_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    """One 2-rollout GSM8K run at `--rollout-top-p 0.5`, asserted on by the three tests below (one start-up, not three).

    `benchmarks/bench_e2e.sh` starts it (the benchmark's CPU smoke): the script writes the qwen3-tiny preset (2
    layers, the real Qwen3 tokenizer; float32 here, so the trainer's log-probs can match the engine's to 1e-4) and
    runs `apps/train` with the GSM8K flags of `_argv` (4 samples per rollout, 8-token responses, colocated) plus
    `--use-dynamic-batch-size --lr 1e-6`; EXTRA_FLAGS adds what the tests read. stdout: the app's, then the
    benchmark's JSON line; `results.jsonl` next to the run dir: the line it appended.
    """
    tmp = tmp_path_factory.mktemp("gsm8k")
    out = tmp / "run"
    extra = ["--save-hf", str(out / "hf"), "--rollout-top-p", "0.5",
             "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt")]  # fmt: skip
    env = {**_env(), "BENCH_DEVICE": "cpu", "PRESET": "qwen3-tiny", "MODEL_DTYPE": "float32", "RBS": "2", "N": "2",
           "MAXLEN": "8", "NUM_ROLLOUT": "2", "RUN_DIR": str(out), "PYTHON": sys.executable,
           "EXTRA_FLAGS": " ".join(extra), "SLIME_BENCH_MODELS": str(tmp / "models"),
           "BENCH_RESULTS": str(tmp / "results.jsonl"), "BENCH_LOG_DIR": str(tmp / "logs"),
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    (tmp / "logs").mkdir()
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "bench_e2e.sh")], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc, out


def test_gsm8k_two_rollouts(gsm8k_run, tb_scalars):
    proc, out = gsm8k_run
    log = proc.stdout + proc.stderr
    assert "rollout    1" in proc.stdout
    # No terminal here: every phase is a plain log line when it ends, start-up phases first.
    done = re.findall(r"slime_app\.progress: (.+?): done in [\d.]+ s", log)
    assert done[:3] == ["ray (local node and placement group)", "engines (--rollout-engine reference)",
                        "model load (--train-backend fsdp)"], done  # fmt: skip
    assert {"rollout 0", "train 0", "rollout 1", "train 1"} <= set(done), done
    assert "\x1b[" not in proc.stdout  # no live bar, no escape codes in a log

    gsm8k = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    labels = {row["answer"] for row in gsm8k}
    for rollout_id in (0, 1):
        samples = _dump(out, rollout_id)
        assert len(samples) == 4
        for s in samples:
            # The tokenizer's own chat template was applied to the GSM8K question.
            assert s["prompt"].startswith("<|im_start|>user\n") and s["prompt"].endswith("<|im_start|>assistant\n")
            assert s["label"] in labels
            assert s["reward"] in (0.0, 1.0)
            assert 1 <= s["response_length"] <= 8
            assert len(s["rollout_log_probs"]) == len(s["loss_mask"]) == s["response_length"]
            assert s["status"] in ("completed", "truncated")
    # First step: the trainer's log-probs of the rollout tokens match the engine's (fp32 on both sides).
    diffs = tb_scalars(out / "tensorboard", "train/train_rollout_logprob_abs_diff")
    assert diffs[0] < 1e-4
    assert (out / "reward_curve.png").stat().st_size > 0
    # Goodput: every accepted model token is counted; the random model scores 0, so no advantage is non-zero.
    generated = {r: float(sum(sum(s["loss_mask"]) for s in _dump(out, r))) for r in (0, 1)}
    assert tb_scalars(out / "tensorboard", "goodput/tokens_generated") == generated
    assert tb_scalars(out / "tensorboard", "goodput/cum/tokens_zero_advantage")[1] == generated[0] + generated[1]
    assert tb_scalars(out / "tensorboard", "goodput/cum/tokens_trained")[1] == 0.0
    assert "0.0% of generated tokens trained on" in proc.stdout and (out / "goodput.json").exists()
    # Weight-content check: the first sync (logged at rollout 0) compared 4 engine checksums, all equal.
    assert tb_scalars(out / "tensorboard", "weight_check/tensors_checked") == {0: 4.0}
    assert tb_scalars(out / "tensorboard", "weight_check/mismatches") == {0: 0.0}

    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out / "hf")
    assert exported.config.num_hidden_layers == 2


def test_top_p_replay_trainer_scores_the_engine_nucleus(gsm8k_run, tb_scalars):
    # Issue 17: with --rollout-top-p < 1 the engine samples from (and reports log-probs of) the nucleus; the trainer
    # replays the engine's kept ids, so on the first step its log-probs equal the engine's. Without replay they
    # would differ by -log(nucleus mass) (~0.7 nats at top-p 0.5 on this near-uniform tiny model).
    _, out = gsm8k_run
    for rollout_id in (0, 1):
        for s in _dump(out, rollout_id):
            assert len(s["rollout_top_p_token_offsets"]) == s["response_length"] + 1
    diffs = tb_scalars(out / "tensorboard", "train/train_rollout_logprob_abs_diff")
    assert diffs[0] < 1e-4


def test_bench_e2e_prints_one_self_consistent_result_line(gsm8k_run):
    """`benchmarks/bench_e2e.sh` ends with `e2e_report.py`'s summary of the run (the numbers mean nothing on CPU)."""
    proc, out = gsm8k_run
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout  # exactly one result line on stdout
    r = json.loads(lines[0])
    saved = [json.loads(ln) for ln in (out.parent / "results.jsonl").read_text().splitlines()]
    assert saved[-1] == r  # the same line was appended to $BENCH_RESULTS
    assert r["steps"] == [0, 1] and r["steps_measured"] == [1]
    assert r["perf/step_time"]["median"] > 0 and r["perf/train_time"]["median"] > 0
    assert 0 < r["generated_tokens"] <= 2 * 2 * 8  # rollout-batch 2 x 2 samples x at most 8 tokens


def _kill_tree(proc: subprocess.Popen) -> None:
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    os.killpg(proc.pid, signal.SIGKILL)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)


def test_lora_two_rollouts(tiny_qwen3, tmp_path, tb_scalars):
    """LoRA through the real loop: the engine serves base + the synced adapter (first-step log-probs agree), only
    the adapter is written for the sync, and `--save-hf` exports a PEFT adapter that peft loads on the base."""
    out = tmp_path / "run"
    proc = subprocess.run(
        _argv(
            tiny_qwen3,
            out,
            "--num-rollout",
            "2",
            "--save-hf",
            str(out / "hf"),
            "--lora-rank",
            "4",
            "--lora-alpha",
            "8",
            "--lr",
            "1e-3",
        ),  # fmt: skip
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    tb = out / "tensorboard"
    assert tb_scalars(tb, "train/train_rollout_logprob_abs_diff")[0] < 1e-4  # base + adapter on both sides
    # The engine's base weights equal the checkpoint's (issue 25: a colocated engine without
    # --enable-weights-cpu-backup lost them on the first memory release, and a LoRA sync never rewrites them).
    assert tb_scalars(tb, "weight_check/tensors_checked") == {0: 4.0}
    # Each push at the version it pushed: the first (0), after rollout 0 (1) and after rollout 1 (2).
    assert sorted(tb_scalars(tb, "perf/update_weights_time")) == [0, 1, 2]
    assert sorted(p.name for p in (out / "weight_sync").iterdir()) == ["lora_v000002"]  # adapter files only
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (out / "hf").iterdir()}

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_qwen3), out / "hf")
    assert model.peft_config["default"].r == 4


def test_async_bf16_run_is_one_step_off_policy_and_resumes_in_the_data_order_after_sigkill(
    make_tiny_qwen3, tmp_path, tb_scalars
):
    """`--async` (disaggregated, one step off-policy) on a bfloat16 checkpoint, killed with SIGKILL once it has
    generated rollout 2 and committed its rollout-1 checkpoint; a second run resumed from its last checkpoint.

    Two runs check what three checked before (an uninterrupted `--async` run; a run resumed from its rollout-0 save
    with `--ckpt-step` and killed after its own rollout-1 checkpoint; a last run resumed from that one): the kill
    and the resume in the one-step-ahead loop, where the next rollout is always drawn and generating at a save, is
    the resume the middle run checked too. (`--ckpt-step` is test_ppo_opd_e2e.py's.)
    1. off-policy: rollout N+1 is generated while N trains; weights change only between generations. On a bfloat16
       checkpoint (the GPU default), the only CPU run of the whole loop in that dtype.
    2. SIGKILL and resume: the killed run resumes at the rollout after its last committed checkpoint (nothing before
       it runs again) with the same data order as an uninterrupted run, and commits the next checkpoints. Issue 27:
       the data cursor of a save queued behind the generation of the next rollout, already drawn, so the resume
       skipped that rollout's prompts (as the original's train_async.py).
    3. the resumed run's per-phase timings (benchmarks/e2e_report.py reads them), as the sync loop logs them.
    4. the learning-rate schedule (`--lr-decay-style WSD`, refused before issue 27's leftovers) goes on at the
       checkpoint's optimizer step through the real loop's save and `--load`.
    """
    model = make_tiny_qwen3(tmp_path / "bf16", dtype=torch.bfloat16, hidden_size=32, intermediate_size=64,
                            head_dim=8, max_position_embeddings=1024)  # fmt: skip
    ckpt = tmp_path / "ckpt"
    total = 5

    def argv(out, num_rollout, *extra) -> list[str]:
        # WSD: --lr over the first 3 of the 5 optimizer steps, then a linear anneal over the run's last 3 (steps 3, 4).
        flags = ["--num-rollout", str(num_rollout), "--rollout-shuffle", "--async", "--rollout-num-gpus", "1",
                 "--save", str(ckpt), "--save-interval", "1", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3",
                 "--lr-wsd-decay-style", "linear", *extra]  # fmt: skip
        return [a for a in _argv(model, out, *flags) if a != "--colocate"]

    # Run 1: killed once rollout 2 is generated (on the weights rollout 0 trained) and rollout 1's checkpoint is
    # committed: rollout 2 trains or rollout 3 generates then, so its last checkpoint is rollout 1's or rollout 2's.
    out = tmp_path / "run1"
    log1 = open(tmp_path / "run1.log", "w")
    proc = subprocess.Popen(argv(out, total), cwd=REPO, env=_env(), stdout=log1, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    tracker = ckpt / "latest_checkpointed_iteration.txt"

    def committed() -> int:
        text = tracker.read_text().strip() if tracker.exists() else ""
        return int(text) if text else 0

    deadline = time.time() + 900
    try:
        while time.time() < deadline and proc.poll() is None:
            if (out / "dumps" / "rollout_2.pt").exists() and committed() >= 2:
                break
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "run1.log").read_text()[-6000:]
        assert (out / "dumps" / "rollout_2.pt").exists() and committed() >= 2
    finally:
        _kill_tree(proc)
        log1.close()
    resumed_at = committed()  # the checkpoint of rollout resumed_at - 1
    assert resumed_at in (2, 3), resumed_at
    # Engine weight versions seen by each rollout: one step stale, never mixed within a rollout.
    versions = [{v for s in _dump(out, r) for v in s["weight_versions"]} for r in range(3)]
    assert versions == [{"0"}, {"0"}, {"1"}]

    # Run 2: resumes from the last complete checkpoint at the next rollout id.
    out2 = tmp_path / "run2"
    proc2 = subprocess.run(argv(out2, total, "--load", str(ckpt)), cwd=REPO, env=_env(), capture_output=True,
                           text=True, timeout=900)  # fmt: skip
    assert proc2.returncode == 0, (proc2.stdout + proc2.stderr)[-6000:]
    assert f"rollout    {resumed_at - 1}" not in proc2.stdout and f"rollout    {resumed_at}" in proc2.stdout
    assert not any((out2 / "dumps" / f"rollout_{r}.pt").exists() for r in range(resumed_at))
    assert tracker.read_text().strip() == str(total)
    # The same per-phase timings as the sync loop, from the resumed rollout on; the last rollout has no next
    # generation to update weights for.
    tb = out2 / "tensorboard"
    for key in ("perf/rollout_time", "perf/train_time", "perf/step_time"):
        times = tb_scalars(tb, key)
        assert sorted(times) == list(range(resumed_at, total)) and all(t > 0 for t in times.values()), (key, times)
    assert sorted(tb_scalars(tb, "perf/update_weights_time")) == list(range(resumed_at, total)), "pushes"
    # The learning-rate schedule goes on at the checkpoint's step (mid-anneal when it resumes at rollout 3): one
    # optimizer step per rollout, at megatron-core's WSD rates (TensorBoard keeps float32).
    rates = [1e-4, 1e-4, 1e-4, 1e-4 * 2 / 3, 1e-4 / 3]
    lrs = tb_scalars(tb, "train/lr")
    assert [lrs[k] for k in sorted(lrs)] == pytest.approx(rates[resumed_at:], rel=1e-6), lrs
    # One step off-policy after the resume too: the resumed rollout and the next one on the loaded weights.
    resumed_versions = [{v for s in _dump(out2, r) for v in s["weight_versions"]} for r in range(resumed_at, total)]
    assert len(resumed_versions[0]) == 1 and resumed_versions[0] == resumed_versions[1], resumed_versions

    # Same data order as an uninterrupted run: the data source replayed from scratch gives these prompts.
    from slime_core.config import parse_args
    from slime_rollout.data.source import RolloutDataSource

    source = RolloutDataSource(parse_args(argv(tmp_path / "unused", total)[2:]))
    expected = [{g[0].prompt for g in source.get_samples(2)} for _ in range(total)]
    assert [{s["prompt"] for s in _dump(out, r)} for r in range(3)] == expected[:3]
    assert [{s["prompt"] for s in _dump(out2, r)} for r in range(resumed_at, total)] == expected[resumed_at:]
    # A resume that skipped the drawn rollout would train expected[resumed_at + 1] first; one that repeated the
    # last trained rollout, expected[resumed_at - 1].
    assert len({frozenset(e) for e in expected[resumed_at - 1 : resumed_at + 2]}) == 3
