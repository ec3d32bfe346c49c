r"""On-policy distillation demo: the untrained demo student learns from a stronger teacher, no task reward.

    uv run python -m slime_app.demo.opd [--opd-type sglang|fsdp] [--output-dir runs/opd-demo]

The teacher is the demo model trained further (SFT for 450 steps instead of 250, built once under
``<output-dir>/teacher``; about 90 % eval accuracy against the student's ~30 %). With ``--opd-type sglang`` a CPU
reference engine serves it (what ``python -m sglang.launch_server`` is on GPUs) and the rollout asks it for the
log-probs of every student response (``--rm-url``); with ``fsdp`` the trainer holds its weights
(``--opd-teacher-load``). Training uses no reward (``rollout/raw_reward`` is 0): the advantages are the OPD term
``-(log p_student - log p_teacher)`` alone. Eval keeps the task reward (``--eval-config`` with ``rm_type: math``),
so the printed ``eval accuracy: first -> last`` measures what the student learned; ``train/opd_reverse_kl`` is the
teacher-student KL per rollout.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from slime_app.demo import DEMO_HPARAMS, EVAL_DATA, MODEL_DIR, TRAIN_DATA
from slime_rollout.engines.process import start_engine_process

TEACHER_SFT_STEPS = 450
ENGINE_START_TIMEOUT_S = 600


def build_teacher(out: Path) -> Path:
    """The teacher's HF directory (built with `slime_app.demo.build --sft-steps 450` when missing)."""
    model = out / "model"
    if not (model / "config.json").exists():
        from slime_app.demo import build

        build.main(["--out", str(out), "--sft-steps", str(TEACHER_SFT_STEPS)])
    return model


@contextlib.contextmanager
def teacher_engine(model: Path, log: Path) -> Iterator[str]:
    """A reference engine serving `model` on a free local port; yields its base URL, stops it at exit.

    Started as the run's own engines are (`slime_rollout.engines.process`): in a session of its own, killed with its
    process group when SIGTERM does not end it (a frozen engine: a plain terminate-and-wait raised after 60 s and
    left it stopped, an orphan), and with this process if it dies.

    Raises:
        RuntimeError: the engine exits before it is healthy (the message has its log's tail).
        TimeoutError: it is not healthy within `ENGINE_START_TIMEOUT_S`.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "slime_rollout.engines.reference", "--model-path", str(model), "--port", str(port)]
    log.unlink(missing_ok=True)  # the engine's log appends: one file per start
    engine = start_engine_process(cmd, url=f"http://127.0.0.1:{port}", log_path=log)
    try:
        engine.wait_healthy(ENGINE_START_TIMEOUT_S, endpoint="/health")
        yield engine.url
    finally:
        engine.shutdown()


def opd_argv(output_dir: Path, teacher_flags: list[str], num_rollout: int) -> list[str]:
    """The slime flags of the demo run: the embedded demo's, without its reward, with OPD and a math-graded eval."""
    eval_config = output_dir / "eval.yaml"
    eval_config.parent.mkdir(parents=True, exist_ok=True)
    eval_config.write_text(f"eval:\n  datasets:\n    - {{name: demo, path: {EVAL_DATA}, rm_type: math}}\n")
    argv = [
        "--hf-checkpoint", str(MODEL_DIR), "--prompt-data", str(TRAIN_DATA), "--input-key", "prompt",
        "--label-key", "label", "--advantage-estimator", "grpo", "--eval-config", str(eval_config), "--colocate",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--train-backend", "fsdp",
        "--output-dir", str(output_dir), "--use-tensorboard", "--use-opd", *teacher_flags,
    ]  # fmt: skip
    for name, value in {**DEMO_HPARAMS, "num-rollout": str(num_rollout)}.items():
        argv += [f"--{name}", value]
    return argv


def main(argv: list[str] | None = None) -> int:
    """Builds the teacher, starts its engine when needed, runs the distillation; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opd-type", choices=["sglang", "fsdp"], default="sglang")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/opd-demo"))
    parser.add_argument("--num-rollout", type=int, default=40)
    args = parser.parse_args(argv)
    from slime_app.cli import main as train

    teacher = build_teacher(args.output_dir / "teacher")
    run_dir = args.output_dir / args.opd_type
    if args.opd_type == "fsdp":
        return train(opd_argv(run_dir, ["--opd-type", "fsdp", "--opd-teacher-load", str(teacher)], args.num_rollout))
    with teacher_engine(teacher, run_dir / "teacher_engine.log") as url:
        return train(opd_argv(run_dir, ["--opd-type", "sglang", "--rm-url", f"{url}/generate"], args.num_rollout))


if __name__ == "__main__":
    sys.exit(main())
