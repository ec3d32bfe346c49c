r"""Builds the CPU geo3k-style example: a synthetic visual counting task drawn with Pillow and a tiny Qwen3-VL.

Run from the repository root: ``uv run python examples/geo3k-vlm/build.py`` (a few minutes of CPU). It writes

* ``data/train.parquet``: ``{"problem": "<image>How many circles are there?", "answer": "2", "images": [PNG
  bytes]}`` rows (the Hugging Face ``datasets`` layout of geo3k: images as bytes in Parquet);
* ``data/eval.jsonl`` + ``data/eval_images/*.png``: the held-out split, images as paths next to the JSONL;
* ``model/``: a Qwen3-VL checkpoint built from a config (no download): word-level tokenizer with the Qwen-VL
  special tokens, a Qwen-VL chat template, the Qwen3-VL processor (64x64 images, 16-pixel patches, 2x2 merge:
  4 image tokens) and weights warm-started by a short supervised fine-tuning that is stopped on purpose half
  way up its learning curve, so that GRPO has something visible to improve.

The task: a 64x64 picture holds 1-6 shapes (circle, square or triangle, random colours) in distinct cells of a
4x4 grid; the question asks how many circles, squares, triangles or shapes there are; the expected answer is
``\boxed{N}`` (graded by ``--rm-type math``). Everything is seeded; SFT runs on one thread, so a rerun on the same
torch build reproduces the same files.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from PIL import Image, ImageDraw

logger = logging.getLogger("geo3k-vlm.build")

HERE = Path(__file__).resolve().parent
SIZE, CELL, GRID = 64, 16, 4  # picture side, cell side (= vision patch), cells per side
SHAPES = ("circle", "square", "triangle")
COLORS = ((220, 40, 40), (40, 90, 220), (30, 160, 60), (200, 140, 20))
QUESTIONS = {
    "circle": "How many circles are there?",
    "square": "How many squares are there?",
    "triangle": "How many triangles are there?",
    None: "How many shapes are there?",
}
NUM_TRAIN, NUM_EVAL, SEED = 2000, 128, 0

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
           "<|image_pad|>", "<|video_pad|>"]  # fmt: skip
WORDS = ["user", "assistant", "How", "many", "circles", "squares", "triangles", "shapes", "are", "there",
         "?", " ", "\n", "\\boxed{", "}", *[str(d) for d in range(10)]]  # fmt: skip
PIECE_PATTERN = r"\\boxed\{|[0-9]|[A-Za-z]+|\s|[^0-9A-Za-z\s]"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: Tiny Qwen3-VL: language model hidden 128, 2 layers; vision tower hidden 64, 2 blocks, 16-pixel patches.
TEXT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, max_position_embeddings=256, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5],
                             "mrope_interleaved": True})  # fmt: skip
VISION = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=128, patch_size=CELL,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=GRID * GRID,
              deepstack_visual_indexes=[0])  # fmt: skip
SFT_STEPS, SFT_BATCH, SFT_LR, SFT_WARMUP = 300, 64, 2e-3, 50


def draw_item(rng: random.Random) -> tuple[Image.Image, str, str]:
    """One picture with its question and answer, e.g. ``(img, "<image>How many circles are there?", "2")``."""
    image = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    cells = rng.sample(range(GRID * GRID), rng.randint(1, 6))
    kinds = [rng.choice(SHAPES) for _ in cells]
    for cell, kind in zip(cells, kinds, strict=True):
        x, y, color = (cell % GRID) * CELL, (cell // GRID) * CELL, rng.choice(COLORS)
        if kind == "circle":
            draw.ellipse([x + 2, y + 2, x + 13, y + 13], fill=color)
        elif kind == "square":
            draw.rectangle([x + 3, y + 3, x + 12, y + 12], fill=color)
        else:
            draw.polygon([(x + 8, y + 2), (x + 14, y + 13), (x + 2, y + 13)], fill=color)
    asked = rng.choice(list(QUESTIONS))
    answer = len(kinds) if asked is None else kinds.count(asked)
    return image, "<image>" + QUESTIONS[asked], str(answer)


def png(image: Image.Image) -> bytes:
    """The picture as PNG bytes."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def write_data(out: Path, seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """Writes the two splits; returns them as ``{"image", "problem", "answer"}`` dicts (images as PIL)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    items = [
        dict(zip(("image", "problem", "answer"), draw_item(rng), strict=True)) for _ in range(NUM_TRAIN + NUM_EVAL)
    ]
    train, evals = items[:NUM_TRAIN], items[NUM_TRAIN:]
    shutil.rmtree(out, ignore_errors=True)
    (out / "eval_images").mkdir(parents=True)
    rows = [{"problem": it["problem"], "answer": it["answer"], "images": [png(it["image"])]} for it in train]
    pq.write_table(pa.Table.from_pylist(rows), out / "train.parquet")
    with open(out / "eval.jsonl", "w", encoding="utf-8") as f:
        for i, it in enumerate(evals):
            name = f"eval_images/{i:04d}.png"
            (out / name).write_bytes(png(it["image"]))
            f.write(json.dumps({"problem": it["problem"], "answer": it["answer"], "images": [name]}) + "\n")
    return train, evals


def build_processor():
    """Word-level tokenizer with the Qwen-VL special tokens, wrapped in a Qwen3-VL processor."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from tokenizers.decoders import Fuse
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    vocab = {t: i for i, t in enumerate(["<pad>", *SPECIAL, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    tok.decoder = Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                        additional_special_tokens=SPECIAL, clean_up_tokenization_spaces=False,
                                        model_max_length=TEXT["max_position_embeddings"])  # fmt: skip
    tokenizer.chat_template = CHAT_TEMPLATE
    images = Qwen2VLImageProcessor(patch_size=CELL, merge_size=2, temporal_patch_size=2, min_pixels=SIZE * SIZE,
                                   max_pixels=SIZE * SIZE)  # fmt: skip
    return Qwen3VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=Qwen3VLVideoProcessor(),
                            chat_template=CHAT_TEMPLATE)  # fmt: skip


def build_model(tokenizer, seed: int = SEED):
    """The randomly initialised tiny Qwen3-VL (fp32) for ``tokenizer``'s vocabulary."""
    from transformers import GenerationConfig, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}  # fmt: skip
    text = dict(TEXT, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, bos_token_id=None)  # fmt: skip
    config = Qwen3VLConfig(text_config=text, vision_config=VISION, tie_word_embeddings=True, **ids)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=True)  # fmt: skip
    return model


def _prompt(processor, problem: str) -> str:
    content = [{"type": "image"}, {"type": "text", "text": problem.removeprefix("<image>")}]
    return processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip


def sft_batch(processor, items: list[dict]) -> dict[str, torch.Tensor]:
    r"""Right-padded batch of prompt + ``\boxed{answer}<|im_end|>`` with the loss on the answer tokens only."""
    eos = processor.tokenizer.eos_token
    texts = [_prompt(processor, it["problem"]) + "\\boxed{" + it["answer"] + "}" + eos for it in items]
    out = processor(text=texts, images=[it["image"] for it in items], return_tensors="pt", padding=True)
    labels = torch.full_like(out["input_ids"], -100)
    for i, it in enumerate(items):
        n_prompt = _prompt_length(processor, it["problem"], it["image"])
        n = int(out["attention_mask"][i].sum())
        labels[i, n_prompt:n] = out["input_ids"][i, n_prompt:n]
    return {**out, "labels": labels}


_PROMPT_LENGTHS: dict[str, int] = {}


def _prompt_length(processor, problem: str, image: Image.Image) -> int:
    # Every picture has the same size (the same number of image tokens): the length depends on the question only.
    if problem not in _PROMPT_LENGTHS:
        ids = processor(text=[_prompt(processor, problem)], images=[image])["input_ids"][0]
        _PROMPT_LENGTHS[problem] = len(ids)
    return _PROMPT_LENGTHS[problem]


def sft(model, processor, train: list[dict], steps: int, seed: int = SEED, eval_fn=None) -> None:
    """AdamW with a linear warm-up, grad-norm clip 1.0, batches of ``SFT_BATCH`` sampled with replacement."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / SFT_WARMUP))
    model.train()
    for step in range(steps):
        loss = model(**sft_batch(processor, [rng.choice(train) for _ in range(SFT_BATCH)])).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            logger.info("sft step %d/%d loss %.4f", step + 1, steps, loss.item())
        if eval_fn is not None and (step + 1) % 100 == 0:
            eval_fn(step + 1)
    model.eval()


@torch.no_grad()
def sampled_accuracy(model, processor, items: list[dict], samples: int = 4, seed: int = 1) -> tuple[float, float]:
    r"""Accuracy and pass@samples at temperature 1 (exact ``\boxed{answer}`` match) on ``items``."""
    torch.manual_seed(seed)
    model.eval()
    processor.tokenizer.padding_side = "left"
    hits, passes = 0, 0
    for start in range(0, len(items), 32):
        chunk = items[start : start + 32]
        texts = [_prompt(processor, it["problem"]) for it in chunk]
        batch = processor(text=texts, images=[it["image"] for it in chunk], return_tensors="pt", padding=True)
        out = model.generate(**batch, max_new_tokens=6, do_sample=True, temperature=1.0, top_k=0,
                             num_return_sequences=samples)  # fmt: skip
        width = batch["input_ids"].shape[1]
        for i, it in enumerate(chunk):
            answers = [processor.tokenizer.decode(out[i * samples + k, width:]) for k in range(samples)]
            right = [a.startswith("\\boxed{" + it["answer"] + "}") for a in answers]
            hits += sum(right)
            passes += any(right)
    processor.tokenizer.padding_side = "right"
    return hits / (len(items) * samples), passes / len(items)


def save_model_dir(model, processor, out: Path) -> None:
    """Saves weights, processor and tokenizer to ``out``, replacing it atomically (temp dir, then rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        old = out.with_name(f".{out.name}.old")
        if out.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> None:
    """Writes ``data/`` and ``model/`` under ``--out`` (default: this example's directory)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    parser.add_argument("--trace", action="store_true", help="measure sampled eval accuracy every 100 SFT steps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    train, evals = write_data(args.out / "data")
    processor = build_processor()
    model = build_model(processor.tokenizer)

    def trace(step: int) -> None:
        acc, pass_k = sampled_accuracy(model, processor, evals)
        logger.info("sft step %d: eval accuracy %.3f, pass@4 %.3f", step, acc, pass_k)
        model.train()

    sft(model, processor, train, args.sft_steps, eval_fn=trace if args.trace else None)
    acc, pass_k = sampled_accuracy(model, processor, evals)
    logger.info("after %d SFT steps: eval accuracy %.3f, pass@4 %.3f (T=1)", args.sft_steps, acc, pass_k)
    save_model_dir(model, processor, args.out / "model")
    logger.info("wrote %s and %s", args.out / "data", args.out / "model")


if __name__ == "__main__":
    main()
