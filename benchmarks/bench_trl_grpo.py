"""Baseline: TRL's GRPOTrainer (HF `generate`, no vLLM) on the same task and shape as bench_e2e.sh.

`python3 benchmarks/bench_trl_grpo.py --preset qwen3-0.6b [--num-prompts 32] [--n 8] [--max-new-tokens 256]
[--steps 3] [--micro-batch 32] [--device cuda|cpu]`

GSM8K prompts (tests/fixtures/gsm8k, chat format, TRL applies the tokenizer's chat template), a math reward
(1 if the last number of the completion equals the reference answer's), group size `--n`, `--num-prompts`
prompts per optimizer step (so one generation round of num_prompts·n completions per step), β = 0 (no
reference model, like slime's default), temperature 1, bf16 on GPU. Measured by a TrainerCallback: wall
time of each optimizer step (generation + scoring + training) and TRL's logged mean completion length;
tokens/s = Σ generated tokens / Σ step time over the steps after the first (warm-up).
TRL is not on the GPU machine: gpu_session.sh installs the wheels in .whl (trl, datasets, dill,
multiprocess) to /tmp/trl-site first. Budget on an H200: model write ~20 s, 3 steps × ~40 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

import _common  # sibling module: a script's own directory is first on sys.path

_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def last_number(text: str) -> str | None:
    """The last number in `text` without thousands separators or a trailing dot ("1,234." -> "1234")."""
    found = _NUMBER.findall(text or "")
    return found[-1].replace(",", "").rstrip(".") if found else None


def math_reward(completions, answer, **_) -> list[float]:
    """TRL reward function: 1.0 when the completion's last number equals the GSM8K label, else 0.0."""
    out = []
    for completion, label in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        out.append(1.0 if last_number(text) is not None and last_number(text) == last_number(str(label)) else 0.0)
    return out


def load_prompts(path: Path, count: int) -> list[dict]:
    """`count` rows `{prompt: [user message], answer}` cycling over the GSM8K jsonl file."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"--prompt-data {path} has no rows")
    return [{"prompt": [{"role": "user", "content": rows[i % len(rows)]["question"]}],
             "answer": str(rows[i % len(rows)]["answer"])} for i in range(count)]  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    """Parses flags, trains a few GRPO steps with TRL, emits one JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--prompt-data", type=Path, default=_common.GSM8K)
    p.add_argument("--num-prompts", type=int, default=32, help="prompts per optimizer step")
    p.add_argument("--n", type=int, default=8, help="completions per prompt (num_generations)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=3, help="optimizer steps; the first is the warm-up")
    p.add_argument("--micro-batch", type=int, default=32, help="completions per forward/backward")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args(argv)
    completions = a.num_prompts * a.n
    if completions % a.micro_batch:
        p.error(f"--num-prompts × --n = {completions} must be a multiple of --micro-batch {a.micro_batch}")
    _common.setup_logging()
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA GPU is visible")
    model_dir, write_s = _common.ensure_model(a.preset, a.model_root)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if cuda else torch.float32,
                                                 attn_implementation="sdpa")  # fmt: skip
    data = Dataset.from_list(load_prompts(a.prompt_data, a.num_prompts * (a.steps + 1)))

    class Timer(TrainerCallback):
        """Step wall times (device-synchronized) and TRL's per-step logs."""

        def __init__(self) -> None:
            self.starts, self.times, self.logs = [], [], []

        def on_step_begin(self, args, state, control, **kw):
            _common.sync(a.device)
            self.starts.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            _common.sync(a.device)
            self.times.append(time.perf_counter() - self.starts[-1])

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    timer = Timer()
    accum = completions // a.micro_batch
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out_dir:
        config = GRPOConfig(
            output_dir=out_dir, max_steps=a.steps, per_device_train_batch_size=a.micro_batch,
            gradient_accumulation_steps=accum, steps_per_generation=accum, num_generations=a.n,
            max_completion_length=a.max_new_tokens, temperature=1.0, beta=0.0, num_iterations=1,
            learning_rate=1e-6, bf16=cuda, use_cpu=not cuda, use_vllm=False, logging_steps=1, report_to="none",
            save_strategy="no", log_completions=False, disable_tqdm=True, seed=1234, dataloader_num_workers=0,
        )  # fmt: skip
        trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=config, train_dataset=data,
                              processing_class=tok, callbacks=[timer])  # fmt: skip
        t0 = time.perf_counter()
        trainer.train()
        total_s = time.perf_counter() - t0
    if len(timer.times) != a.steps or len(timer.logs) < a.steps:
        raise RuntimeError(f"expected {a.steps} timed, logged steps; got {len(timer.times)}, {len(timer.logs)}")
    lengths = [float(log["completions/mean_length"]) for log in timer.logs[: a.steps]]
    keep = slice(1, None) if a.steps > 1 else slice(None)
    tokens = sum(completions * n for n in lengths[keep])
    seconds = sum(timer.times[keep])
    return _common.emit("trl_grpo", {
        "device": _common.device_name(a.device), "trl_version": trl.__version__, "preset": a.preset,
        "num_prompts": a.num_prompts, "n": a.n, "max_new_tokens": a.max_new_tokens, "steps": a.steps,
        "micro_batch": a.micro_batch, "step_s_all": timer.times, "step_s_median": _common.median(timer.times[keep]),
        "mean_completion_len_all": lengths, "generated_tokens": tokens, "tokens_per_s": tokens / seconds,
        "train_total_s": total_s, "checkpoint_write_s": write_s,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    })  # fmt: skip


if __name__ == "__main__":
    main()
