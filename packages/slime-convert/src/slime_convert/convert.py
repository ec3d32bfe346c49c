"""HF safetensors ↔ Megatron-core torch_dist conversion, streaming one layer at a time.

`hf_to_mcore` writes `<save>/release/` (+ `latest_checkpointed_iteration.txt` = "release"), the layout
Megatron-LM's `--load`/`--ref-load` and slime's Megatron backend read; both appear together
(`slime_convert.staged.staged_save_root`). `mcore_to_hf` writes a HF
directory with `model-0000k-of-0000n.safetensors` shards, an index, and the non-weight files
(config, tokenizer, generation config) copied from the original HF directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Callable

import torch
from tqdm import tqdm

from slime_convert.hf_io import HFCheckpointReader, HFShardedWriter
from slime_convert.lora_export import fsdp_lora_to_peft
from slime_convert.mapping import TensorMapping, expand_mappings, extra_state_keys, tensor_mappings, to_hf, to_mcore
from slime_convert.model_args import ModelArgs
from slime_convert.shapes import check_hf_shapes, check_hf_unused, check_torch_dist_shapes, check_torch_dist_unused
from slime_convert.staged import staged_output, staged_save_root
from slime_convert.torch_dist import (
    LazyChunk,
    TorchDistReader,
    resolve_iteration_dir,
    sharded_object_key,
    write_torch_dist,
)
from slime_convert.vocab_padding import check_vocab_divisor, read_recorded_divisor
from slime_core.checkpoint_dirs import FSDP_MODEL_DIR, TRACKER_FILE, iteration_name, tracker_step
from slime_core.dir_swap import MARKER, remove, write_text_atomic
from slime_core.hf_checkpoint import copy_assets, describe_exported_weights

logger = logging.getLogger(__name__)

__all__ = ["fsdp_to_hf", "hf_to_mcore", "mcore_to_hf"]


def _stored_shape(mapping: TensorMapping, args: ModelArgs, tensor_shape: tuple[int, ...]) -> tuple[int, ...]:
    if mapping.scope == "expert":
        return (args.num_layers, args.num_experts or 0, *tensor_shape)
    if mapping.scope == "layer":
        return (args.num_layers, *tensor_shape)
    return tensor_shape


def _index(layer: int | None, expert: int | None) -> tuple[int, ...]:
    return tuple(i for i in (layer, expert) if i is not None)


_CHECKED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _cast(tensor: torch.Tensor, dtype: torch.dtype | None, name: str, nonfinite: set[str]) -> torch.Tensor:
    """`tensor.to(dtype)` (`--dtype`), refusing a cast that turns finite values into inf (fp16's max is 65504).

    Args:
        tensor: one weight as read.
        dtype: the `--dtype` to cast to, or None to keep the stored one.
        name: its name, for the messages.
        nonfinite: collects the names of tensors that hold NaN or inf as read (carried as they are, then warned of).

    Raises:
        ValueError: naming the tensor, its largest magnitude and the dtype.
    """
    if tensor.dtype in _CHECKED_DTYPES and not bool(torch.isfinite(tensor).all()):
        nonfinite.add(name)
    if dtype is None or tensor.dtype == dtype:
        return tensor
    out = tensor.to(dtype)
    if out.is_floating_point() and bool((torch.isinf(out) & torch.isfinite(tensor)).any()):
        peak, kind = tensor[torch.isfinite(tensor)].abs().max().item(), str(dtype).removeprefix("torch.")
        raise ValueError(
            f"--dtype {kind}: {name} holds values up to {peak:.6g}, beyond {kind}'s range "
            f"(max {torch.finfo(dtype).max:.6g}); they would become inf. Keep the stored dtype or choose a wider one"
        )
    return out


def _warn_nonfinite(where: str | os.PathLike[str], nonfinite: set[str]) -> None:
    if nonfinite:  # carried bit for bit (a round trip is exact), but a run started from them trains on NaN
        names = sorted(nonfinite)
        logger.warning("%s: %d tensors hold NaN or inf (converted as they are): %s", where, len(names), names[:3])


def _refuse_quantized(config_path: pathlib.Path) -> None:
    """Names a quantized HF checkpoint (an FP8 rollout one), whose scale tensors no Megatron weight holds.

    Raises:
        ValueError: `config.json` has a `quantization_config`.
    """
    quant = json.loads(config_path.read_text()).get("quantization_config")
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise ValueError(
            f"{config_path}: a quantized checkpoint (quantization_config.quant_method={method!r}); hf-to-mcore "
            "converts unquantized weights: give it the BF16 checkpoint the quantized one was made from"
        )


def hf_to_mcore(
    hf_dir: str | os.PathLike[str],
    save_dir: str | os.PathLike[str],
    *,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    make_vocab_size_divisible_by: int = 128,
    dtype: torch.dtype | None = None,
    force: bool = False,
    progress: bool = True,
) -> pathlib.Path:
    """Converts a HF checkpoint into a Megatron torch_dist checkpoint.

    torch_dist stores global tensors, so one checkpoint loads under any TP/PP layout whose vocabulary padding is the
    same; the TP size and the divisor set that padding (to a multiple of divisor × TP; the divisor is recorded in
    `common.pt` and checked when the checkpoint is loaded or exported), and the PP size is validated.

    Args:
        hf_dir: HF model directory (`config.json` + safetensors).
        save_dir: output root; `<save_dir>/release` is created.
        tensor_model_parallel_size: `--tp`.
        pipeline_model_parallel_size: `--pp`; must not exceed the layer count.
        make_vocab_size_divisible_by: `--make-vocab-size-divisible-by` (Megatron's default 128).
        dtype: cast weights to this dtype (default: keep the stored dtype); a value beyond its range is refused.
        force: replace an existing `<save_dir>/release` (`-f/--force`), once the new one is complete.
        progress: show a tqdm bar.

    Returns:
        The written iteration directory.

    Raises:
        ValueError: bad TP/PP/divisor, unsupported model, a quantized checkpoint (FP8), a missing HF tensor (named), a
            tensor whose shape is not the one config.json implies (`slime_convert.shapes.check_hf_shapes`), or a
            tensor config.json does not describe (an extra layer; a tied model's `lm_head.weight` other than the
            embedding) that would be dropped (`slime_convert.shapes.check_hf_unused`); all checked before anything
            is written.
        FileExistsError: `<save_dir>/release` exists (published: the tracker names it) and not `force`, or
            `save_dir` holds a tracker naming a training iteration (also with `force`).
        slime_core.dir_swap.ReplaceRefused: `<save_dir>.tmp` or `<save_dir>.old` is in the way and not slime's.
    """
    args = ModelArgs.from_hf_dir(hf_dir, make_vocab_size_divisible_by=make_vocab_size_divisible_by)
    _refuse_quantized(pathlib.Path(hf_dir) / "config.json")
    if tensor_model_parallel_size < 1 or pipeline_model_parallel_size < 1:
        raise ValueError(f"--tp and --pp must be ≥ 1, got {tensor_model_parallel_size}, {pipeline_model_parallel_size}")
    if pipeline_model_parallel_size > args.num_layers:
        raise ValueError(f"--pp {pipeline_model_parallel_size} exceeds num_hidden_layers={args.num_layers}")
    tracker = pathlib.Path(save_dir) / TRACKER_FILE
    if tracker.is_file() and tracker.read_text(errors="replace").strip() != "release":
        # Re-pointing the tracker at release would make the next --load of this folder start from the HF weights.
        raise FileExistsError(
            f"--save {save_dir} holds a training run ({TRACKER_FILE} names iteration "
            f"{tracker.read_text(errors='replace').strip()[:40]!r}); give hf-to-mcore a folder of its own"
        )
    reader = HFCheckpointReader(hf_dir)
    if not args.tie_word_embeddings and "lm_head.weight" not in reader:
        # An untied model's output layer is its own matrix; silently using the embedding in its place would
        # train and export a different model than the checkpoint describes.
        raise ValueError(
            f"{hf_dir}: config.json has tie_word_embeddings=false but the checkpoint has no 'lm_head.weight'; "
            "add the tensor, or set tie_word_embeddings=true if the model shares its embedding"
        )

    needed = [n for mapping, layer, expert in expand_mappings(args) for n in mapping.hf_names(layer, expert)]
    try:
        file_of = lambda n: reader.file(n).name  # noqa: E731
        check_hf_shapes([n for n in needed if n in reader], reader.shape, args, hf_dir=hf_dir, file_of=file_of)
        for head in check_hf_unused(reader.keys(), needed, args, hf_dir=hf_dir, file_of=file_of):
            # A tied model's stored head must be the embedding: Megatron keeps only the embedding.
            if not torch.equal(reader.get(head), reader.get("model.embed_tokens.weight")):
                raise ValueError(
                    f"{hf_dir}: config.json has tie_word_embeddings=true but {head} in {file_of(head)} differs from "
                    "model.embed_tokens.weight; the conversion would drop it. Set tie_word_embeddings to false"
                )
    except BaseException:
        reader.close()
        raise

    nonfinite: set[str] = set()

    def read_hf(name: str) -> torch.Tensor:
        if name not in reader:
            raise ValueError(f"{hf_dir}: tensor {name!r} required by {args.model_type} is missing")
        return _cast(reader.get(name), dtype, name, nonfinite)

    def producer(mapping: TensorMapping, layer: int | None, expert: int | None) -> Callable[[], torch.Tensor]:
        return lambda: to_mcore(
            mapping, [read_hf(n) for n in mapping.hf_names(layer, expert)], args, tensor_model_parallel_size
        )

    chunks: list[LazyChunk] = []
    # Shapes come from one cheap conversion of layer 0 / expert 0 per mapping (header-sized for norms,
    # one layer for matrices); each mapping then has the same chunk shape for all layers/experts.
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for mapping in tensor_mappings(args):
        layer = 0 if mapping.scope != "global" else None
        expert = 0 if mapping.scope == "expert" else None
        sample = producer(mapping, layer, expert)()
        shapes[mapping.mcore] = (tuple(sample.shape), sample.dtype)
        del sample
    for mapping, layer, expert in expand_mappings(args):
        shape, tensor_dtype = shapes[mapping.mcore]
        index = _index(layer, expert)
        for key in mapping.ckpt_keys:
            chunks.append(
                LazyChunk(
                    key=key,
                    global_shape=_stored_shape(mapping, args, shape),
                    offsets=index + (0,) * len(shape),
                    dtype=tensor_dtype,
                    produce=producer(mapping, layer, expert),
                    chunk_shape=(1,) * len(index) + shape,
                )
            )
    objects = {}
    for key, scope in extra_state_keys(args):
        grid = (args.num_layers,) if scope == "layer" else (args.num_layers, args.num_experts or 0)
        for flat in range(int(torch.tensor(grid).prod())):
            offset = (flat,) if scope == "layer" else divmod(flat, grid[1])
            objects[sharded_object_key(key, offset, grid)] = None
    common = {
        "checkpoint_version": 3.0,
        "iteration": 0,
        "args": argparse.Namespace(
            tensor_model_parallel_size=tensor_model_parallel_size,
            pipeline_model_parallel_size=pipeline_model_parallel_size,
            padded_vocab_size=args.padded_vocab_size(tensor_model_parallel_size),
            make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,  # as Megatron-LM's args record it
            ckpt_format="torch_dist",
            hf_model_type=args.model_type,
        ),
    }
    bar = tqdm(total=len(chunks), desc="hf→torch_dist", unit="tensor", disable=not progress)

    def counted(chunk: LazyChunk) -> LazyChunk:
        def produce() -> torch.Tensor:
            tensor = chunk.produce()
            bar.update(1)
            return tensor

        return LazyChunk(chunk.key, chunk.global_shape, chunk.offsets, chunk.dtype, produce, chunk.chunk_shape)

    root = pathlib.Path(save_dir)
    out = root / "release"
    try:
        # The tracker is written last, inside the staged root where there is one: a reader sees both or neither.
        with staged_save_root(root, flag="--save") as target:
            _drop_unpublished_release(target)
            write_torch_dist(
                target / "release", [counted(c) for c in chunks], objects, common, force=force,
                inputs={"--hf-checkpoint": hf_dir},
            )  # fmt: skip
            write_text_atomic(target / TRACKER_FILE, "release")
    finally:
        bar.close()
        reader.close()
    _warn_nonfinite(hf_dir, nonfinite)
    logger.info("wrote %s (%d tensor chunks)", out, len(chunks))
    return out


def _drop_unpublished_release(root: pathlib.Path) -> None:
    """Deletes a `release/` that slime wrote (marked) but never published (no tracker file).

    That is a conversion killed between its two renames, in a save root that could not be staged whole. No reader
    loads it; it blocked every rerun.
    """
    release = root / "release"
    if (release / MARKER).is_file() and not (root / TRACKER_FILE).exists():
        logger.warning("%s: written by a conversion killed before its tracker file; replacing it", release)
        remove(release)


def _write_hf(
    ckpt: TorchDistReader, args: ModelArgs, writer: HFShardedWriter, *, dtype: torch.dtype | None, progress: bool
) -> None:
    """Streams every mapped tensor from `ckpt` into `writer` in HF names, one layer per DCP read."""
    nonfinite: set[str] = set()
    groups: list[list[tuple[TensorMapping, int | None, int | None]]] = []
    for item in expand_mappings(args):
        if not groups or groups[-1][0][1] != item[1]:
            groups.append([])
        groups[-1].append(item)
    with tqdm(total=args.num_layers + 2, desc="torch_dist→hf", unit="layer", disable=not progress) as bar:
        for group in groups:
            tensors = ckpt.read([(mp.ckpt_keys[0], _index(layer, expert)) for mp, layer, expert in group])
            for (mapping, layer, expert), tensor in zip(group, tensors, strict=True):
                for name, hf_tensor in zip(mapping.hf_names(layer, expert), to_hf(mapping, tensor, args), strict=True):
                    writer.add(name, _cast(hf_tensor, dtype, name, nonfinite))
            bar.update(1)
    writer.close()
    _warn_nonfinite(ckpt.dir, nonfinite)


def mcore_to_hf(
    input_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    origin_hf_dir: str | os.PathLike[str],
    *,
    chunk_size: int = 5 * 1024**3,
    vocab_size: int | None = None,
    make_vocab_size_divisible_by: int | None = None,
    dtype: torch.dtype | None = None,
    force: bool = False,
    progress: bool = True,
) -> pathlib.Path:
    """Converts a Megatron torch_dist checkpoint into a HF safetensors checkpoint.

    The padding rows are dropped whatever their count; a divisor given is checked against the one the checkpoint
    records (`slime_convert.vocab_padding`), and against its row count.

    Args:
        input_dir: an iteration dir (`iter_0000010`, `release`) or a save root with the tracker file.
        output_dir: HF directory to create.
        origin_hf_dir: the original HF directory (architecture from its config.json; tokenizer and
            config files are copied, the config stating the written dtype and no `quantization_config`).
        chunk_size: max bytes per safetensors shard (`--chunk-size`).
        vocab_size: rows to keep of embedding/head (`--vocab-size`; default: the config's vocab_size).
        make_vocab_size_divisible_by: `--make-vocab-size-divisible-by` the checkpoint was written with (None: not
            checked).
        dtype: cast weights to this dtype (default: keep the stored dtype); a value beyond its range is refused.
        force: replace `output_dir` if it exists (`-f/--force`), once the new checkpoint is complete.
        progress: show a tqdm bar.

    Returns:
        `output_dir`.

    Raises:
        FileExistsError: `output_dir` exists and not `force`; ValueError if it is or holds `input_dir` or
            `origin_hf_dir` (with `force` it would delete them).
        FileNotFoundError: a file of `origin_hf_dir` is a link to a missing file (it would not be copied).
        KeyError: a tensor the mapping needs is missing from the checkpoint.
        ValueError: `vocab_size` < 1, more rows than the checkpoint holds, another recorded divisor than
            `make_vocab_size_divisible_by` (naming both) or rows that are no multiple of it, or a stored tensor whose
            shape or layer count is not what `origin_hf_dir`'s config.json implies
            (`slime_convert.shapes.check_torch_dist_shapes`), or a stored model tensor that config has no HF name
            for (`check_torch_dist_unused`); both checked before anything is written.
        OSError: writing failed (a full disk); `output_dir` is left as it was (the new files go to
            `<output_dir>.tmp` first, which is removed).
    """
    args = ModelArgs.from_hf_dir(origin_hf_dir)
    if vocab_size is not None:
        if vocab_size < 1:  # 0 wrote an empty embedding; -5 sliced [:-5], keeping padding rows (exit 0 both)
            raise ValueError(f"--vocab-size must be a positive number of rows, got {vocab_size}")
        if vocab_size != args.vocab_size:
            logger.warning(
                "--vocab-size %d differs from vocab_size=%d in %s/config.json, which is copied as is: "
                "transformers refuses the embedding until the output's config.json says %d",
                vocab_size, args.vocab_size, origin_hf_dir, vocab_size,
            )  # fmt: skip
        args = dataclasses.replace(args, vocab_size=vocab_size)
    ckpt = TorchDistReader(resolve_iteration_dir(input_dir))
    if make_vocab_size_divisible_by is not None:
        _check_export_divisor(ckpt, args, make_vocab_size_divisible_by)
    check_torch_dist_shapes(ckpt.tensor_keys(), args, ckpt_dir=ckpt.dir, origin_hf_dir=origin_hf_dir)
    check_torch_dist_unused(ckpt.tensor_keys(), args, ckpt_dir=ckpt.dir, origin_hf_dir=origin_hf_dir)
    dangling = sorted(p.name for p in pathlib.Path(origin_hf_dir).iterdir() if p.is_symlink() and not p.exists())
    if dangling:  # a tokenizer.json link into a pruned HF cache: the export would lack it without a word
        raise FileNotFoundError(f"--origin-hf-dir {origin_hf_dir}: {dangling} are links to missing files")
    out = pathlib.Path(output_dir)
    inputs = {"--input-dir": ckpt.dir, "--origin-hf-dir": origin_hf_dir}
    with staged_output(out, force=force, flag="--output-dir", inputs=inputs) as tmp:
        writer = HFShardedWriter(tmp, max_shard_bytes=chunk_size)
        _write_hf(ckpt, args, writer, dtype=dtype, progress=progress)
        copy_assets(origin_hf_dir, tmp)
        # The copied config must state the written dtype (--dtype, or a torch_dist saved in another one) and drop an
        # FP8 origin's quantization_config: the exported weights are unquantized.
        describe_exported_weights(tmp / "config.json", writer.dtypes)
    logger.info("wrote HF checkpoint to %s", out)
    return out


def _check_export_divisor(ckpt: TorchDistReader, args: ModelArgs, divisor: int) -> None:
    """Refuses an export given another `--make-vocab-size-divisible-by` than the checkpoint's (recorded or its rows)."""
    args = dataclasses.replace(args, make_vocab_size_divisible_by=divisor)
    where = f"--input-dir {ckpt.dir}"
    check_vocab_divisor(where, read_recorded_divisor(ckpt.dir), args)
    for key, (shape, _) in ckpt.tensor_keys().items():
        if key in ("embedding.word_embeddings.weight", "output_layer.weight") and shape[0] % divisor:
            raise ValueError(
                f"{where}: {key} has {shape[0]} rows, not a multiple of --make-vocab-size-divisible-by {divisor}: "
                "it was written with another divisor"
            )


def _fsdp_model_dir(path: pathlib.Path) -> pathlib.Path:
    """The DCP folder of a `--train-backend fsdp` checkpoint: a save root (its tracker), an iteration folder, or it.

    Raises:
        FileNotFoundError: none of these (names what was looked for).
        ValueError: the tracker file holds no iteration number.
    """
    if path.name == FSDP_MODEL_DIR and (path / ".metadata").is_file():
        return path
    if (path / FSDP_MODEL_DIR / ".metadata").is_file():
        return path / FSDP_MODEL_DIR
    if (path / TRACKER_FILE).is_file():
        step = tracker_step(path)
        if step is None:
            text = (path / TRACKER_FILE).read_text(errors="replace").strip()
            raise ValueError(f"{path / TRACKER_FILE}: holds {text[:80]!r}, not an FSDP checkpoint's iteration number")
        iteration = path / iteration_name(step)
        if (iteration / FSDP_MODEL_DIR / ".metadata").is_file():
            return iteration / FSDP_MODEL_DIR
        raise FileNotFoundError(f"{iteration}: no {FSDP_MODEL_DIR}/.metadata (not a complete FSDP checkpoint)")
    raise FileNotFoundError(
        f"{path}: not an FSDP checkpoint (no {FSDP_MODEL_DIR}/.metadata, no {TRACKER_FILE}); give the --save folder "
        "of a --train-backend fsdp run or one of its iter_* folders"
    )


def fsdp_to_hf(
    input_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    origin_hf_dir: str | os.PathLike[str],
    *,
    chunk_size: int = 5 * 1024**3,
    dtype: torch.dtype | None = None,
    force: bool = False,
    progress: bool = True,
) -> pathlib.Path:
    """Exports the model of a `--train-backend fsdp` checkpoint as a HF safetensors checkpoint.

    A LoRA run's checkpoint (`--lora-rank` in its `meta.json`) is exported as a PEFT adapter folder instead, as the
    run's `--save-hf` writes it (`slime_convert.lora_export`).

    The trainer's DCP shards (`iter_*/model_and_optim`, `slime_train_fsdp.checkpoint`) hold the HF model's own
    parameters under `model.<HF name>`, so no name or layout mapping applies: each tensor is read whole and written
    under its name (the original's `tools/convert_fsdp_to_hf.py`). Optimizer state is not read.

    Args:
        input_dir: the run's `--save` folder (its tracker names the iteration), an `iter_*` folder, or its
            `model_and_optim` folder.
        output_dir: HF directory to create.
        origin_hf_dir: the HF directory the run started from (`--hf-checkpoint`): its tensor names and shapes are the
            ones the checkpoint must hold; its config, tokenizer and other files are copied (config.json stating the
            written dtype).
        chunk_size: max bytes per safetensors shard.
        dtype: cast weights to this dtype (default: keep the stored one); a value beyond its range is refused.
        force: replace `output_dir` if it exists, once the new checkpoint is complete.
        progress: show a tqdm bar.

    Returns:
        `output_dir`.

    Raises:
        FileNotFoundError: `input_dir` is no FSDP checkpoint.
        ValueError: tensors that differ from `origin_hf_dir`'s in names or shapes (named; checked before anything
            is written); for a LoRA run's checkpoint, see `slime_convert.lora_export.fsdp_lora_to_peft`.
        FileExistsError: `output_dir` exists and not `force`.
        OSError: writing failed; `output_dir` is left as it was.
    """
    model_dir = _fsdp_model_dir(pathlib.Path(input_dir))
    meta_path = model_dir.parent / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    model_flags = meta.get("model_flags") or {}  # slime_train_fsdp.checkpoint.model_flags_of
    if model_flags.get("--lora-rank"):
        return fsdp_lora_to_peft(model_dir, model_flags, output_dir, origin_hf_dir, dtype=dtype, force=force)
    ckpt = TorchDistReader(model_dir)
    stored = {k.removeprefix("model."): v for k, v in ckpt.tensor_keys().items() if k.startswith("model.")}
    origin = HFCheckpointReader(origin_hf_dir)
    try:
        expected = {name: origin.shape(name) for name in origin.keys()}
        tied_head = "lm_head.weight" in stored and "lm_head.weight" not in expected
        if tied_head:  # a tied model's head: the embedding again, which HF stores once
            head, embed = ckpt.read([("model.lm_head.weight", ()), ("model.model.embed_tokens.weight", ())])
            if not torch.equal(head, embed):
                raise ValueError(f"{model_dir}: lm_head.weight differs from the embedding {origin_hf_dir} ties it to")
        problems = [f"{n}: not in {origin_hf_dir}" for n in sorted(set(stored) - set(expected)) if n != "lm_head.weight"
                    or not tied_head]  # fmt: skip
        problems += [f"{n}: missing" for n in sorted(set(expected) - set(stored))]
        problems += [
            f"{n}: shape {list(stored[n][0])}, {origin_hf_dir} has {list(shape)}"
            for n, shape in expected.items()
            if n in stored and tuple(stored[n][0]) != tuple(shape)
        ]
    finally:
        origin.close()
    if problems:
        shown = "; ".join(problems[:5]) + (f"; ... ({len(problems)} in all)" if len(problems) > 5 else "")
        raise ValueError(f"{model_dir}: does not hold {origin_hf_dir}'s model: {shown}")
    nonfinite: set[str] = set()
    inputs = {"--input-dir": model_dir.parent, "--origin-hf-dir": origin_hf_dir}
    with staged_output(pathlib.Path(output_dir), force=force, flag="--output-dir", inputs=inputs) as tmp:
        writer = HFShardedWriter(tmp, max_shard_bytes=chunk_size)
        for name in tqdm(sorted(expected), desc="fsdp→hf", unit="tensor", disable=not progress):
            (tensor,) = ckpt.read([(f"model.{name}", ())])
            writer.add(name, _cast(tensor, dtype, name, nonfinite))
        writer.close()
        copy_assets(origin_hf_dir, tmp)
        describe_exported_weights(tmp / "config.json", writer.dtypes)
    _warn_nonfinite(model_dir, nonfinite)
    logger.info("wrote HF checkpoint to %s", output_dir)
    return pathlib.Path(output_dir)
