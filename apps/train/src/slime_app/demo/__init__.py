r"""The embedded demo: a tiny arithmetic task and a tiny SFT-warmed Qwen3 that GRPO visibly improves on CPU.

``uv run apps/train`` with no flags runs :func:`default_demo_argv`. The assets are committed under
``assets/`` (package data: they ship in the wheel) and rebuilt by ``uv run python -m slime_app.demo.build``.
This package imports no Ray, torch or transformers, so importing it is free.
"""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
ASSETS_DIR = DEMO_DIR / "assets"
#: HF checkpoint dir (Qwen3ForCausalLM, fp32, ~1.6 MB) with its word-level tokenizer.
MODEL_DIR = ASSETS_DIR / "model"
#: JSONL with ``prompt`` (e.g. ``"12+7="``) and ``label`` (e.g. ``"19"``).
TRAIN_DATA = ASSETS_DIR / "data" / "train.jsonl"
EVAL_DATA = ASSETS_DIR / "data" / "eval.jsonl"

#: Recommended RL hyper-parameters, measured by the learnability check described in README.md.
DEMO_HPARAMS: dict[str, str] = {
    "rollout-batch-size": "64",
    "n-samples-per-prompt": "8",
    "global-batch-size": "512",
    "micro-batch-size": "64",
    "num-rollout": "80",
    "rollout-max-response-len": "8",
    "rollout-temperature": "1.0",
    "lr": "5e-4",
    "eval-interval": "10",
    "n-samples-per-eval-prompt": "8",
    "eval-temperature": "1.0",
    "eval-max-response-len": "8",
    "seed": "1234",
}


def default_demo_argv(output_dir: str | Path = "runs/demo") -> list[str]:
    r"""Returns the slime command-line flags of the demo run.

    Prompts are fed raw (no ``--apply-chat-template``); the reward is ``--rm-type math``, i.e. the last
    ``\boxed{...}`` of the response compared to ``label``. One optimizer step per rollout
    (``global_batch_size = rollout_batch_size * n_samples_per_prompt``).

    Args:
        output_dir: Directory of the run's outputs: checkpoints (``checkpoints/``), the final HF export
            (``hf/``), TensorBoard logs (``tensorboard/``) and the reward curve PNG.

    Returns:
        Flags in original slime spelling, e.g. ``["--hf-checkpoint", ".../assets/model", ...]``.
    """
    out = Path(output_dir)
    argv = [
        "--hf-checkpoint", str(MODEL_DIR),
        "--prompt-data", str(TRAIN_DATA),
        "--input-key", "prompt",
        "--label-key", "label",
        "--rm-type", "math",
        "--advantage-estimator", "grpo",
        "--eval-prompt-data", "demo", str(EVAL_DATA),
        "--colocate",
        "--actor-num-nodes", "1",
        "--actor-num-gpus-per-node", "1",
        "--train-backend", "fsdp",
        "--output-dir", str(out),
        "--save", str(out / "checkpoints"),
        "--save-hf", str(out / "hf"),
        "--use-tensorboard",
    ]  # fmt: skip
    for name, value in DEMO_HPARAMS.items():
        argv += [f"--{name}", value]
    return argv
