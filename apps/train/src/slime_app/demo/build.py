r"""Builds the embedded demo's assets: task data, a tiny tokenizer and an SFT-warmed tiny Qwen3.

Run ``uv run python -m slime_app.demo.build`` (about a minute of CPU). It writes
``assets/data/{train,eval}.jsonl`` and, atomically, ``assets/model/`` (config, safetensors, generation config,
tokenizer). Everything is seeded and the SFT runs on one thread, so a rerun on the same torch build
reproduces the same files.

The SFT warm-up is deliberately stopped early, half-way up its learning curve: the policy almost always
answers in the ``\boxed{N}`` format, but at temperature 1 only ~30% of its samples carry the right sum
while pass@4 is ~65%. That is the regime in which GRPO visibly sharpens sampled accuracy within a few
dozen steps.
"""

import argparse
import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from slime_app.demo import task

logger = logging.getLogger(__name__)

ASSETS_DIR = Path(__file__).resolve().parent / "assets"

PAD_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<eos>", "<unk>"
BOXED_TOKEN = "\\boxed{"
#: Word-level vocabulary: specials first (fixed ids 0..2), then the pieces the task and simple prompts use.
VOCAB: list[str] = [
    PAD_TOKEN,
    EOS_TOKEN,
    UNK_TOKEN,
    *[str(d) for d in range(10)],
    *["+", "-", "*", "=", "?", ".", ":", " ", "\n"],
    BOXED_TOKEN,
    "}",
    *["What", "is", "Compute", "Answer", "the", "sum", "of", "and"],
]
#: Pre-tokenizer pattern: ``\boxed{`` as one piece, each digit alone, words, single other chars.
PIECE_PATTERN = r"\\boxed\{|[0-9]|[A-Za-z]+|\s|[^0-9A-Za-z\s]"

#: Tiny Qwen3 shape (about 0.4 M parameters, 1.6 MB in fp32).
MODEL_SHAPE = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=64,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
#: SFT warm-up hyper-parameters.
#: The warm-up is stopped on purpose mid-way up the learning curve (measured on eval, sampled at T=1:
#: step 200: 13% acc / 38% pass@4, step 250: 29% / 66%, step 300: 62% / 93%, step 450: 89% / 96%).
SFT_STEPS = 250
SFT_WARMUP = 60
SFT_BATCH = 128
SFT_LR = 3e-3
#: Optional fraction of SFT targets replaced by a wrong nearby sum (another way to keep the policy uncertain).
SFT_NOISE = 0.0
SEED = 0


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Builds the demo's word-level tokenizer.

    Returns:
        A ``PreTrainedTokenizerFast`` whose ``decode(encode(text)) == text`` for any text made of
        :data:`VOCAB` pieces; ``eos_token="<eos>"`` (id 1), ``pad_token="<pad>"`` (id 0), no BOS.
    """
    tok = Tokenizer(models.WordLevel(vocab={p: i for i, p in enumerate(VOCAB)}, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")
    # Fuse concatenates pieces without inserting spaces (spaces are tokens of their own).
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = SEED) -> Qwen3ForCausalLM:
    """Builds the randomly initialised tiny Qwen3 (fp32) for ``tokenizer``'s vocabulary.

    Args:
        tokenizer: Tokenizer from :func:`build_tokenizer`; supplies vocab size and eos/pad ids.
        seed: ``torch.manual_seed`` used for the initialisation.

    Returns:
        ``Qwen3ForCausalLM`` in train mode on CPU.
    """
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL_SHAPE,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0
    )
    return model


def _sft_example(tokenizer: PreTrainedTokenizerFast, a: int, b: int, answer: int) -> tuple[list[int], int]:
    """Returns ``(token ids of prompt+response+eos, number of prompt tokens)``."""
    prompt_ids = tokenizer.encode(task.make_prompt(a, b))
    response_ids = tokenizer.encode(task.make_response(answer)) + [tokenizer.eos_token_id]
    return prompt_ids + response_ids, len(prompt_ids)


def sft_batch(
    tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[int, int]], rng: random.Random, noise: float
) -> dict[str, torch.Tensor]:
    """Builds one right-padded SFT batch with the loss on response tokens only.

    Args:
        tokenizer: The demo tokenizer.
        pairs: ``B`` operand pairs.
        rng: Source of the label noise.
        noise: Probability that a target answer is replaced by ``a + b + d``, ``d`` in {±1, ±2, ±10}.

    Returns:
        ``input_ids``, ``attention_mask``, ``labels``: int64 ``[B, T]``; ``labels`` is -100 on prompt and pad.
    """
    rows = []
    for a, b in pairs:
        answer = a + b
        if rng.random() < noise:
            answer = max(0, answer + rng.choice((-10, -2, -1, 1, 2, 10)))
        rows.append(_sft_example(tokenizer, a, b, answer))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, n_prompt) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
        mask[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def sft(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    train_items: list[dict[str, str]],
    steps: int = SFT_STEPS,
    batch_size: int = SFT_BATCH,
    lr: float = SFT_LR,
    noise: float = SFT_NOISE,
    seed: int = SEED,
    callback=None,
) -> list[float]:
    """Runs the SFT warm-up in place (AdamW, linear warm-up over :data:`SFT_WARMUP` steps, grad-norm clip 1.0).

    Args:
        model: Model from :func:`build_model`.
        tokenizer: The demo tokenizer.
        train_items: Train split from :func:`task.generate_splits`; only its operand pairs are used.
        steps: Optimizer steps.
        batch_size: Sequences per step.
        lr: Peak learning rate.
        noise: Label-noise probability (see :func:`sft_batch`).
        seed: Seed for batch sampling and noise.
        callback: Optional ``fn(step, model)`` called after every step (for experiments).

    Returns:
        Per-step mean token cross-entropy (nats).
    """
    rng = random.Random(seed)
    pairs = [tuple(int(x) for x in it["prompt"].rstrip("=").split("+")) for it in train_items]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = SFT_WARMUP
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    model.train()
    losses = []
    for step in range(steps):
        batch = sft_batch(tokenizer, [rng.choice(pairs) for _ in range(batch_size)], rng, noise)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == steps - 1:
            logger.info("sft step %d/%d loss %.4f", step + 1, steps, losses[-1])
        if callback is not None:
            callback(step, model)
    model.eval()
    return losses


def save_model_dir(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Saves model (safetensors) and tokenizer to ``out``, replacing it atomically (temp dir, then rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for f in tmp.iterdir():
            f.chmod(0o644)  # some writers create 0600 files
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> None:
    """Builds data, tokenizer and SFT-warmed model under ``--out`` (default: the committed assets dir)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSETS_DIR)
    parser.add_argument("--sft-steps", type=int, default=SFT_STEPS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # One thread: the SFT trajectory (and so the committed weights) then does not depend on the core count.
    torch.set_num_threads(1)
    train_path, eval_path = task.write_splits(args.out / "data")
    train_items = [json.loads(line) for line in train_path.read_text().splitlines()]
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=args.seed)
    sft(model, tokenizer, train_items, steps=args.sft_steps, seed=args.seed)
    save_model_dir(model, tokenizer, args.out / "model")
    logger.info("wrote %s, %s, %s", train_path, eval_path, args.out / "model")


if __name__ == "__main__":
    main()
