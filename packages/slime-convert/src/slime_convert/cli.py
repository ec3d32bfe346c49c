r"""`slime-convert`: command-line HF ↔ Megatron torch_dist conversion.

Usage:
    slime-convert hf-to-mcore --hf-checkpoint /models/Qwen3-4B --save /ckpt/Qwen3-4B_torch_dist [--tp 2 --pp 1] \
        [--make-vocab-size-divisible-by 64]
    slime-convert mcore-to-hf --input-dir /ckpt/run/iter_0000100 --output-dir /models/out \
        --origin-hf-dir /models/Qwen3-4B
    slime-convert fsdp-to-hf --input-dir /ckpt/run --output-dir /models/out --origin-hf-dir /models/Qwen3-4B
    slime-convert megatron-args --hf-checkpoint /models/Qwen3-4B
    slime-convert hf-to-fp8 --hf-checkpoint /models/Qwen3-4B --save /models/Qwen3-4B-FP8 [--block-size 128 128]
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from typing import Any

from slime_convert.model_args import ModelArgs

logger = logging.getLogger(__name__)

# `--dtype` names -> torch dtype attribute names (torch is imported only to convert, never for --help).
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _torch_dtype(name: str | None) -> Any:
    if name is None:
        return None
    import torch

    return getattr(torch, _DTYPES[name])


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="slime-convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    to_mcore = sub.add_parser("hf-to-mcore", help="HF safetensors → Megatron torch_dist")
    to_mcore.add_argument("--hf-checkpoint", required=True, help="HF model directory")
    to_mcore.add_argument("--save", required=True, help="output root; writes <save>/release")
    to_mcore.add_argument(
        "--tp", "--tensor-model-parallel-size", dest="tp", type=int, default=1, help="TP size (vocab padding)"
    )
    to_mcore.add_argument(
        "--pp", "--pipeline-model-parallel-size", dest="pp", type=int, default=1, help="PP size (validated)"
    )
    to_mcore.add_argument(
        "--make-vocab-size-divisible-by", type=_positive_int, default=128,
        help="pad the vocabulary to a multiple of this × TP (Megatron's flag; default 128); recorded in the checkpoint",
    )  # fmt: skip
    to_mcore.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="cast weights (default: keep)")
    to_mcore.add_argument("-f", "--force", action="store_true", help="overwrite <save>/release")
    to_mcore.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    to_hf = sub.add_parser("mcore-to-hf", help="Megatron torch_dist → HF safetensors")
    to_hf.add_argument(
        "--input-dir", required=True, help="iter_XXXXXXX/release dir, or a save root with the tracker file"
    )
    to_hf.add_argument("--output-dir", required=True, help="HF directory to write")
    to_hf.add_argument("--origin-hf-dir", required=True, help="original HF directory (config + tokenizer)")
    to_hf.add_argument(
        "--chunk-size", type=int, default=5 * 1024**3, help="max bytes per safetensors shard (default: 5 GiB)"
    )
    to_hf.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="rows of embedding/head to keep (default: config.json's vocab_size, padding removed)",
    )
    to_hf.add_argument(
        "--make-vocab-size-divisible-by", type=_positive_int, default=None,
        help="the divisor the checkpoint was padded with (Megatron's flag): checked against the one it records",
    )  # fmt: skip
    to_hf.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="cast weights (default: keep)")
    to_hf.add_argument("-f", "--force", action="store_true", help="overwrite --output-dir")
    to_hf.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    fsdp = sub.add_parser(
        "fsdp-to-hf", help="--train-backend fsdp checkpoint → HF safetensors (a LoRA run's: a PEFT adapter folder)"
    )
    fsdp.add_argument(
        "--input-dir", required=True, help="the run's --save folder, an iter_* folder or its model_and_optim"
    )
    fsdp.add_argument("--output-dir", required=True, help="HF directory to write")
    fsdp.add_argument(
        "--origin-hf-dir", required=True, help="the run's --hf-checkpoint (names, shapes, config, tokenizer)"
    )
    fsdp.add_argument(
        "--chunk-size", type=int, default=5 * 1024**3, help="max bytes per safetensors shard (default: 5 GiB)"
    )
    fsdp.add_argument("--dtype", choices=sorted(_DTYPES), default=None, help="cast weights (default: keep)")
    fsdp.add_argument("-f", "--force", action="store_true", help="overwrite --output-dir")
    fsdp.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    fp8 = sub.add_parser("hf-to-fp8", help="BF16 HF → blockwise-FP8 HF serving checkpoint (FP8 rollout)")
    fp8.add_argument("--hf-checkpoint", required=True, help="unquantized HF model directory")
    fp8.add_argument("--save", required=True, help="output HF directory (the run's FP8 --hf-checkpoint)")
    fp8.add_argument("--block-size", type=int, nargs=2, default=[128, 128], help="rows and columns per scale")
    fp8.add_argument("-f", "--force", action="store_true", help="overwrite --save")
    fp8.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    flags = sub.add_parser("megatron-args", help="print the Megatron model flags equivalent to a HF config")
    flags.add_argument("--hf-checkpoint", required=True, help="HF model directory")
    flags.add_argument(
        "--make-vocab-size-divisible-by", type=_positive_int, default=128, help="the run's vocabulary padding divisor"
    )
    return parser


# What the original's tools took that a conversion here reads elsewhere (said when such a flag is refused).
_ORIGINAL_ONLY = {
    "hf-to-mcore": "Megatron model flags (the original's ${MODEL_ARGS[@]}) are read from --hf-checkpoint's "
    "config.json: drop them (`slime-convert megatron-args` prints the equivalent ones)",
    "mcore-to-hf": "the architecture is read from --origin-hf-dir's config.json (no --model-name); "
    "-a/--add-missing-from-origin-hf is not supported",
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `slime-convert` script; returns the exit code.

    Raises:
        SystemExit: bad or unknown flags (exit 2, argparse's one-line error; an original's flag says where its
            information comes from here).
    """
    parser = build_parser()
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        hint = _ORIGINAL_ONLY.get(ns.command)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}" + (f"; {hint}" if hint else ""))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if ns.command == "megatron-args":
            model_args = ModelArgs.from_hf_dir(
                ns.hf_checkpoint, make_vocab_size_divisible_by=ns.make_vocab_size_divisible_by
            )
            sys.stdout.write(shlex.join(model_args.megatron_flags()) + "\n")
        elif ns.command == "hf-to-fp8":
            from slime_convert.fp8 import hf_to_fp8

            hf_to_fp8(ns.hf_checkpoint, ns.save, block_size=tuple(ns.block_size), force=ns.force,
                      progress=not ns.no_progress)  # fmt: skip
        elif ns.command == "hf-to-mcore":
            from slime_convert.convert import hf_to_mcore

            model_args = ModelArgs.from_hf_dir(
                ns.hf_checkpoint, make_vocab_size_divisible_by=ns.make_vocab_size_divisible_by
            )
            logger.info("equivalent Megatron flags: %s", shlex.join(model_args.megatron_flags(ns.tp)))
            hf_to_mcore(
                ns.hf_checkpoint,
                ns.save,
                tensor_model_parallel_size=ns.tp,
                pipeline_model_parallel_size=ns.pp,
                make_vocab_size_divisible_by=ns.make_vocab_size_divisible_by,
                dtype=_torch_dtype(ns.dtype),
                force=ns.force,
                progress=not ns.no_progress,
            )
        elif ns.command == "fsdp-to-hf":
            from slime_convert.convert import fsdp_to_hf

            fsdp_to_hf(ns.input_dir, ns.output_dir, ns.origin_hf_dir, chunk_size=ns.chunk_size,
                       dtype=_torch_dtype(ns.dtype), force=ns.force, progress=not ns.no_progress)  # fmt: skip
        else:
            from slime_convert.convert import mcore_to_hf

            mcore_to_hf(
                ns.input_dir,
                ns.output_dir,
                ns.origin_hf_dir,
                chunk_size=ns.chunk_size,
                vocab_size=ns.vocab_size,
                make_vocab_size_divisible_by=ns.make_vocab_size_divisible_by,
                dtype=_torch_dtype(ns.dtype),
                force=ns.force,
                progress=not ns.no_progress,
            )
    except KeyboardInterrupt:
        # Every writer stages its output and removes the staging folder on the way out, so nothing half-written stays.
        logger.error("interrupted: nothing was written (a previous output is left as it was)")
        return 130
    except (ValueError, KeyError, OSError) as e:
        # OSError: a full disk, a read-only or missing folder, a file where a folder should be; the output is left
        # as it was (every writer stages its files and renames them at the end).
        logger.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
