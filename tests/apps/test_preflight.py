"""Bad config or data fails before anything starts, with one line naming the flag, file and row."""

import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "apps" / "train"))

from slime_app.preflight import preflight  # noqa: E402
from slime_core.config import parse_args  # noqa: E402

MODEL = REPO / "apps" / "train" / "demo" / "assets" / "model"


def _args(data: pathlib.Path, *extra: str):
    return parse_args(
        ["--train-backend", "fsdp", "--hf-checkpoint", str(MODEL), "--prompt-data", str(data),
         "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "2",
         "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout", "1",
         "--rollout-max-response-len", "8", *extra]
    )  # fmt: skip


def test_rows_are_numbered_like_lines(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n" + json.dumps({"q": "x", "label": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"d\.jsonl row 2: no --input-key 'prompt'"):
        preflight(_args(data))


def test_missing_files_name_the_flag(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    preflight(_args(data))  # valid
    with pytest.raises(FileNotFoundError, match="--prompt-data: file not found"):
        preflight(_args(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match="--eval-prompt-data: file not found"):
        preflight(_args(data, "--eval-prompt-data", "e", str(tmp_path / "nope.jsonl")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: invalid JSON"):
        preflight(_args(bad))


def test_megatron_without_cuda_is_a_one_line_error(tmp_path, monkeypatch):
    import torch

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    args = _args(data)
    args.train_backend = "megatron"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--train-backend megatron needs CUDA GPUs.*--train-backend fsdp"):
        preflight(args)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    preflight(args)  # on a GPU machine the same config passes
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    preflight(args)  # a remote cluster: its GPUs are not visible from the driver
