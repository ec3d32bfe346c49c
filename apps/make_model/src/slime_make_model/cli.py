"""Command line: ``uv run apps/make_model --preset qwen3-tiny --out DIR`` (or ``slime-make-model ...``).

Presets: qwen3-tiny (a few MB, real Qwen3 vocab), qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b,
qwen3-moe-tiny (a 2-layer Qwen3-MoE, 8 experts, top-2: MoE routing replay on CPU), qwen3-moe-small (the same
with Qwen3-0.6B's width and heads, which SGLang serves on a GPU), and qwen3-vl-tiny (a 2-layer
Qwen3-VL with Qwen3-0.6B's head geometry, its processor and a Qwen-VL chat template).
"""

import argparse
import logging
from pathlib import Path

from slime_make_model.presets import DEFAULT_TOKENIZER_DIR, DTYPE_NAMES, PRESETS


def main(argv: list[str] | None = None) -> None:
    """Parses flags and writes the checkpoint."""
    parser = argparse.ArgumentParser(prog="make_model", description=__doc__)
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", required=True, type=Path, help="new directory to create")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER_DIR, help="Qwen3 tokenizer dir")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_NAMES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-shard-gb", type=float, default=4.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from slime_make_model.checkpoint import make_model  # torch and transformers: only once the flags parsed

    try:
        out = make_model(args.preset, args.out, args.tokenizer, args.dtype, args.seed, args.max_shard_gb)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    print(out)
