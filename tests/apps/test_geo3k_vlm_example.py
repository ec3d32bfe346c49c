"""The CPU geo3k-style example (`examples/geo3k-vlm/`): its data, its model, and its config running end to end.

1. The committed splits are what `build.py` generates (same questions, answers and pixels), and every answer is
   right: an independent reader of the pictures (one shape per 16-pixel cell, told apart by two probe pixels)
   counts what the question asks for.
2. The committed model and processor load in transformers and lay a prompt out as the engine and trainer expect
   (4 image tokens between the vision markers).
3. (slow) `apps/train --config examples/geo3k-vlm/cpu.yaml`, cut to 2 small rollouts and one evaluation (after the
   last rollout): the run completes, the dumped samples carry their images and vision tensors, rewards are the math
   grade of the response against the label, and the trainer's first-step log-probs equal the engine's.
"""

import importlib.util
import io
import json
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "geo3k-vlm"


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("geo3k_vlm_build", EXAMPLE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pixels(image) -> bytes:
    return image.convert("RGB").tobytes()


def _read_picture(image) -> dict[str, int]:
    """Counts shapes by kind: a cell holds a shape if any pixel is not white; a square fills its cell's (3, 3)
    pixel, a triangle (not a square) fills (3, 12), a circle fills neither."""
    counts = {"circle": 0, "square": 0, "triangle": 0}
    px = image.convert("RGB").load()
    white = (255, 255, 255)
    for cy in range(0, 64, 16):
        for cx in range(0, 64, 16):
            if all(px[cx + i, cy + j] == white for i in range(16) for j in range(16)):
                continue
            if px[cx + 3, cy + 3] != white:
                counts["square"] += 1
            elif px[cx + 3, cy + 12] != white:
                counts["triangle"] += 1
            else:
                counts["circle"] += 1
    return counts


def _expected_answer(problem: str, image) -> str:
    counts = _read_picture(image)
    kind = re.fullmatch(r"<image>How many (\w+)s are there\?", problem).group(1)
    return str(sum(counts.values()) if kind == "shape" else counts[kind])


def test_committed_data_is_generated_and_every_answer_is_right(build, tmp_path):
    import pyarrow.parquet as pq
    from PIL import Image

    train, evals = build.write_data(tmp_path)
    rows = pq.read_table(EXAMPLE / "data" / "train.parquet").to_pylist()
    assert len(rows) == len(train) == build.NUM_TRAIN
    for row, item in zip(rows, train, strict=True):
        assert (row["problem"], row["answer"]) == (item["problem"], item["answer"])
        image = Image.open(io.BytesIO(row["images"][0]))
        assert _pixels(image) == _pixels(item["image"])
        assert row["answer"] == _expected_answer(row["problem"], image), row["problem"]

    lines = (EXAMPLE / "data" / "eval.jsonl").read_text().splitlines()
    assert len(lines) == len(evals) == build.NUM_EVAL
    for line, item in zip(lines, evals, strict=True):
        row = json.loads(line)
        assert (row["problem"], row["answer"]) == (item["problem"], item["answer"])
        image = Image.open(EXAMPLE / "data" / row["images"][0])
        assert _pixels(image) == _pixels(item["image"])
        assert row["answer"] == _expected_answer(row["problem"], image), row["problem"]


def test_committed_model_and_processor_lay_out_an_image_prompt(build):
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(EXAMPLE / "model")
    model = AutoModelForImageTextToText.from_pretrained(EXAMPLE / "model", dtype=torch.float32).eval()
    row = json.loads((EXAMPLE / "data" / "eval.jsonl").read_text().splitlines()[0])
    image = Image.open(EXAMPLE / "data" / row["images"][0])
    text = build._prompt(processor, row["problem"])
    batch = processor(text=[text], images=[image], return_tensors="pt")
    tok = processor.tokenizer
    ids = batch["input_ids"][0].tolist()
    start = ids.index(tok.convert_tokens_to_ids("<|vision_start|>"))
    end = ids.index(tok.convert_tokens_to_ids("<|vision_end|>"))
    # 64x64 pixels / 16-pixel patches = 4x4 patches, merged 2x2: 4 image tokens.
    assert ids[start + 1 : end] == [tok.convert_tokens_to_ids("<|image_pad|>")] * 4
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert tok.decode(ids[end + 1 :]) == row["problem"].removeprefix("<image>") + "<|im_end|>\n<|im_start|>assistant\n"
    with torch.no_grad():
        logits = model(**batch).logits[0, -1]
    # The warm start answers in the task's format: `\boxed{` is the most likely first token.
    assert tok.convert_ids_to_tokens(int(logits.argmax())) == "\\boxed{"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_example_config_runs_two_small_rollouts(tmp_path):
    import torch

    from slime_core.sample import Sample
    from slime_rollout.rewards import rule_based_reward

    out = tmp_path / "run"
    argv = [
        sys.executable, str(REPO / "apps" / "train"), "--config", str(EXAMPLE / "cpu.yaml"),
        "--num-rollout", "2", "--rollout-batch-size", "4", "--global-batch-size", "32", "--micro-batch-size", "32",
        # One evaluation, after the last rollout: its 128 prompts x 2 samples were 4x the rollouts' generations.
        "--eval-interval", "2", "--skip-eval-before-train", "--n-samples-per-eval-prompt", "2",
        "--output-dir", str(out),
        "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt"),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "eval accuracy:" in proc.stdout and "(one eval)" in proc.stdout

    # The trainer's log-probs of the engine's samples equal the engine's (the loop's |Δlogp| column).
    gaps = [float(g) for g in re.findall(r"\|Δlogp\|=([0-9.eE+-]+)", proc.stdout)]
    assert len(gaps) == 2 and max(gaps) < 1e-4, gaps

    samples = torch.load(out / "dumps" / "rollout_0.pt", weights_only=False)["samples"]
    assert len(samples) == 4 * 8
    for s in map(Sample.from_dict, samples):
        assert len(s.multimodal_inputs["images"]) == 1
        assert s.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
        assert s.multimodal_train_inputs["pixel_values"].shape[0] == 16  # 4x4 patches of 16 pixels
        assert s.reward == rule_based_reward("math", s.response, s.label)
