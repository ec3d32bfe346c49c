"""The vocabulary padding a torch_dist checkpoint was written with, checked against the one a run or export uses.

Megatron pads the embedding and output-layer rows to a multiple of `--make-vocab-size-divisible-by` × TP
(`slime_convert.model_args.padded_vocab_size`). A checkpoint padded with one divisor does not load into a model
built with another: megatron-core's loader stops with a shape traceback naming neither flag. `hf-to-mcore` and the
Megatron trainer's saves record the divisor in `common.pt` (the original's Megatron-LM saves record it in its `args`
namespace, under the same name); these checks read it back and say which two values differ.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import torch

from slime_convert.model_args import ModelArgs

__all__ = [
    "DIVISOR_KEY",
    "check_torch_dist_padding",
    "check_vocab_divisor",
    "check_vocab_rows",
    "read_recorded_divisor",
    "recorded_divisor",
]

#: The `common.pt` key (and Megatron-LM `args` attribute) holding `--make-vocab-size-divisible-by`.
DIVISOR_KEY = "make_vocab_size_divisible_by"

#: The torch_dist keys whose rows are the padded vocabulary.
_VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")


def recorded_divisor(common: dict[str, Any]) -> int | None:
    """The `--make-vocab-size-divisible-by` a checkpoint's `common.pt` records, or None when it records none.

    Args:
        common: the `common.pt` contents (`TorchDistReader.common_state`): slime's top-level key, else
            Megatron-LM's `args` namespace (the original's saves and conversions).
    """
    value = common.get(DIVISOR_KEY)
    if value is None:
        args = common.get("args")
        value = args.get(DIVISOR_KEY) if isinstance(args, dict) else getattr(args, DIVISOR_KEY, None)
    return None if value is None else int(value)


def read_recorded_divisor(ckpt_dir: str | os.PathLike[str]) -> int | None:
    """`recorded_divisor` of a torch_dist directory's `common.pt` (None without one).

    Raises:
        ValueError: `common.pt` does not unpickle (truncated, or a class of a program not installed), naming it.
    """
    path = pathlib.Path(ckpt_dir) / "common.pt"
    if not path.is_file():
        return None
    try:
        common = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - pickle raises many types; the message names the file and the cause
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    return recorded_divisor(common) if isinstance(common, dict) else None


def check_vocab_divisor(where: str, recorded: int | None, args: ModelArgs) -> None:
    """Refuses a checkpoint written with another `--make-vocab-size-divisible-by` than `args` pads with.

    Args:
        where: how the message names the checkpoint (`"--load /ckpt/iter_0000010"`).
        recorded: the checkpoint's divisor (`recorded_divisor`); None (not recorded) passes.
        args: the architecture the checkpoint is read into.

    Raises:
        ValueError: one line naming both divisors and the flag to give.
    """
    if recorded is not None and recorded != args.make_vocab_size_divisible_by:
        raise ValueError(
            f"{where}: written with --make-vocab-size-divisible-by {recorded}, read with "
            f"--make-vocab-size-divisible-by {args.make_vocab_size_divisible_by}: the embedding and output layer "
            f"are padded differently; give --make-vocab-size-divisible-by {recorded} (or convert the HF checkpoint "
            f"again with {args.make_vocab_size_divisible_by})"
        )


def check_vocab_rows(
    where: str,
    stored: dict[str, tuple[tuple[int, ...], Any]],
    args: ModelArgs,
    tensor_model_parallel_size: int,
    recorded: int | None = None,
) -> None:
    """Refuses an embedding/output layer whose rows the Megatron model cannot read its vocabulary from.

    Rows that differ only through the TP degree the checkpoint was written at load: megatron-core marks the
    embedding's and output layer's sharded tensors `allow_shape_mismatch`, reads the rows both shapes have and zeroes
    the rest (padding rows past `vocab_size`, which never reach the log-probs or the engines), and so does the
    optimizer state built from them. A checkpoint saved at TP 2 (rows a multiple of divisor × 2) therefore resumes at
    TP 1 as Megatron-LM's would; this check refused it. Refused: fewer rows than `vocab_size`, or rows that are not
    a multiple of the divisor (another padding scheme, where the rows may not line up).

    Args:
        where: how the message names the checkpoint.
        stored: the checkpoint's tensors, key → (global shape, dtype) (`TorchDistReader.tensor_keys`).
        args: the architecture of the model it loads into.
        tensor_model_parallel_size: the loading run's TP degree (the padding is a multiple of divisor × TP).
        recorded: the checkpoint's recorded divisor, for the message (None: not recorded).

    Raises:
        ValueError: one line naming the stored rows, the expected rows and the divisor and TP behind them.
    """
    want = args.padded_vocab_size(tensor_model_parallel_size)
    for key in _VOCAB_KEYS:
        if key not in stored or stored[key][0][0] == want:
            continue
        rows = stored[key][0][0]
        if rows >= args.vocab_size and rows % args.make_vocab_size_divisible_by == 0:
            continue  # padded for another TP degree: megatron-core reads the shared rows (see above)
        written = f" (written with --make-vocab-size-divisible-by {recorded})" if recorded is not None else ""
        raise ValueError(
            f"{where}: {key} has {rows} rows{written}, this run builds {want}: vocab_size={args.vocab_size} padded "
            f"to a multiple of --make-vocab-size-divisible-by {args.make_vocab_size_divisible_by} × "
            f"--tensor-model-parallel-size {tensor_model_parallel_size}; give the divisor and TP size the checkpoint "
            "was written with, or convert it again (slime-convert mcore-to-hf, then hf-to-mcore)"
        )


def check_torch_dist_padding(
    where: str,
    ckpt_dir: str | os.PathLike[str],
    args: ModelArgs,
    tensor_model_parallel_size: int,
    *,
    value_head: bool = False,
) -> None:
    """`check_vocab_divisor` then `check_vocab_rows` on a torch_dist directory (reads `.metadata` and `common.pt`).

    With `value_head` (a critic's checkpoint) the output layer is `[1, H]` and only the embedding is checked.

    Raises:
        ValueError: see the two checks, or an unreadable `common.pt`.
        FileNotFoundError: `ckpt_dir` is not a torch_dist directory.
    """
    from slime_convert.torch_dist import TorchDistReader

    ckpt = TorchDistReader(ckpt_dir)
    recorded = read_recorded_divisor(ckpt_dir)
    check_vocab_divisor(where, recorded, args)
    stored = ckpt.tensor_keys()
    if value_head:
        stored.pop("output_layer.weight", None)
    check_vocab_rows(where, stored, args, tensor_model_parallel_size, recorded)
