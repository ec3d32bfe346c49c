"""Checks that run before anything starts (no Ray, no engines), so bad config or data fails in one line."""

from __future__ import annotations

import os
from typing import Any


def _check_rows(spec: str, args: Any, flag: str) -> None:
    from slime_rollout.data_source import load_prompt_rows

    try:
        rows = load_prompt_rows(spec)
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag}: file not found: {spec}") from None
    if not rows:
        raise ValueError(f"{flag} {spec}: no rows")
    for i, row in enumerate(rows, start=1):  # 1-based, as editors number lines
        if args.input_key not in row:
            raise ValueError(f"{flag} {spec} row {i}: no --input-key {args.input_key!r} (keys: {sorted(row)})")
        if args.label_key and args.label_key not in row:
            raise ValueError(f"{flag} {spec} row {i}: no --label-key {args.label_key!r} (keys: {sorted(row)})")


def preflight(args: Any) -> None:
    """Validates paths and data files named by the config.

    Raises:
        FileNotFoundError: a model directory or data file does not exist (message names the flag).
        ValueError: a data file is malformed (message names the flag, file and line/row), or
            `--train-backend megatron` on a local run without CUDA.
    """
    if args.train_backend == "megatron" and not (getattr(args, "ray_address", None) or os.environ.get("RAY_ADDRESS")):
        import torch

        if not torch.cuda.is_available():  # a remote cluster's GPUs are not visible from here: checked locally only
            raise ValueError(
                "--train-backend megatron needs CUDA GPUs (megatron-core's optimizer and pipeline schedules are "
                "CUDA-only); on this machine use --train-backend fsdp"
            )
    if args.hf_checkpoint and not os.path.isdir(args.hf_checkpoint):
        raise FileNotFoundError(f"--hf-checkpoint: not a directory: {args.hf_checkpoint}")
    if args.hf_checkpoint and not os.path.exists(os.path.join(args.hf_checkpoint, "config.json")):
        raise FileNotFoundError(f"--hf-checkpoint {args.hf_checkpoint}: no config.json (not a Hugging Face model dir)")
    if args.prompt_data and not args.load_debug_rollout_data:
        _check_rows(args.prompt_data, args, "--prompt-data")
    for _name, path in args.eval_datasets:
        _check_rows(path, args, "--eval-prompt-data")
