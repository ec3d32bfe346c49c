r"""Deterministic generator of the demo's arithmetic task.

Each item is a two-operand addition such as ``{"prompt": "12+7=", "label": "19"}``. The policy is expected to
answer ``\boxed{19}``; the math reward (``--rm-type math``) grades the content of the last ``\boxed{...}``
against ``label``. Train and eval items are drawn from disjoint operand pairs so eval measures
generalisation, not memorisation.

Run ``uv run python -m slime_app.demo.task OUT_DIR`` to write ``train.jsonl`` and ``eval.jsonl``.
"""

import json
import os
import random
import sys
import tempfile
from pathlib import Path

#: Operands are drawn uniformly from ``[0, MAX_OPERAND]``.
MAX_OPERAND = 49
#: Default sizes of the two splits.
NUM_TRAIN = 2000
NUM_EVAL = 128
#: Default seed; changing it changes which operand pairs are held out.
SEED = 1234


def make_prompt(a: int, b: int) -> str:
    """Returns the prompt text for ``a + b`` (e.g. ``"12+7="``)."""
    return f"{a}+{b}="


def make_response(answer: int) -> str:
    r"""Returns the reference response text for a given answer (e.g. ``\boxed{19}``)."""
    return "\\boxed{" + str(answer) + "}"


def generate_splits(
    seed: int = SEED, num_train: int = NUM_TRAIN, num_eval: int = NUM_EVAL, max_operand: int = MAX_OPERAND
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Generates the train and eval splits.

    All ``(max_operand + 1) ** 2`` operand pairs are shuffled with ``random.Random(seed)``; the first
    ``num_eval`` pairs form the eval set, the next ``num_train`` the train set, so the two never share a pair.

    Args:
        seed: Seed of the shuffle; same seed gives byte-identical splits.
        num_train: Number of train items.
        num_eval: Number of eval items.
        max_operand: Largest operand (inclusive).

    Returns:
        ``(train, eval)``: lists of ``{"prompt": str, "label": str}`` dicts.

    Raises:
        ValueError: If ``num_train + num_eval`` exceeds the number of distinct operand pairs.
    """
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if num_train + num_eval > len(pairs):
        raise ValueError(
            f"num_train + num_eval = {num_train + num_eval} exceeds the {len(pairs)} distinct operand pairs "
            f"with max_operand={max_operand}"
        )
    random.Random(seed).shuffle(pairs)

    def item(a: int, b: int) -> dict[str, str]:
        return {"prompt": make_prompt(a, b), "label": str(a + b)}

    eval_items = [item(a, b) for a, b in pairs[:num_eval]]
    train_items = [item(a, b) for a, b in pairs[num_eval : num_eval + num_train]]
    return train_items, eval_items


def write_jsonl(path: Path, items: list[dict[str, str]]) -> None:
    """Writes ``items`` as JSON lines atomically (temp file in the same dir, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for it in items:
                f.write(json.dumps(it, ensure_ascii=False) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; data files should be world-readable like any other
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_splits(out_dir: Path, seed: int = SEED) -> tuple[Path, Path]:
    """Writes ``train.jsonl`` and ``eval.jsonl`` under ``out_dir``; returns their paths."""
    train_items, eval_items = generate_splits(seed)
    train_path, eval_path = Path(out_dir) / "train.jsonl", Path(out_dir) / "eval.jsonl"
    write_jsonl(train_path, train_items)
    write_jsonl(eval_path, eval_items)
    return train_path, eval_path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m slime_app.demo.task OUT_DIR")
    for p in write_splits(Path(sys.argv[1])):
        print(p)
