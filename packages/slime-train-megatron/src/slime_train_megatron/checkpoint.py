"""torch_dist checkpoints of the Megatron backend: model, optimizer, scheduler, RNG and rollout id.

Layout (Megatron-LM's): `<save>/iter_XXXXXXX/` (megatron-core `dist_checkpointing`) and
`<save>/latest_checkpointed_iteration.txt`; the iteration number is the rollout id. Each checkpoint
is written to `iter_XXXXXXX.tmp` by all ranks and renamed by rank 0 after a barrier, then the tracker
is replaced, so a killed run never sees a partial checkpoint. Iteration directories carry slime's marker
(`slime_core.dir_swap.MARKER`): re-saving an iteration replaces only a directory slime wrote. A converted
checkpoint (`release`) is loaded the same way (weights only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import random
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing

from slime_convert import ModelArgs
from slime_convert.load_shapes import check_hf_checkpoint, check_torch_dist_checkpoint
from slime_convert.torch_dist import TorchDistReader, resolve_iteration_dir
from slime_convert.vocab_padding import DIVISOR_KEY
from slime_core.checkpoint_dirs import REFERENCE_DIR, TRACKER_FILE, iteration_name, no_optimizer_state_message
from slime_core.dir_swap import prepare_staging, staging_dir, swap_in, write_text_atomic
from slime_core.fp8 import trainer_weights_dir

logger = logging.getLogger(__name__)

__all__ = [
    "check_load_shapes",
    "check_value_head_checkpoint",
    "is_megatron_checkpoint",
    "load_checkpoint",
    "load_reference",
    "save_checkpoint",
]


def is_megatron_checkpoint(path: str | os.PathLike[str] | None) -> bool:
    """Whether `path` is a Megatron save dir (tracker file) or a torch_dist iteration dir."""
    if not path:
        return False
    p = pathlib.Path(path)
    return (p / TRACKER_FILE).is_file() or (p / ".metadata").is_file()


def check_load_shapes(
    hf_checkpoint: str,
    ref_load: str | None,
    load: str | None,
    ckpt_step: int | None,
    model_args: ModelArgs,
    tensor_model_parallel_size: int = 1,
) -> None:
    """Checks the actor's initial weights and `--load` against `--hf-checkpoint`'s config, before the model is built.

    Reads headers only (`slime_convert.load_shapes`): the initial weights are `--ref-load` when it is torch_dist,
    else the HF weights `load_hf_weights` reads (`--hf-checkpoint`, or the BF16 `--ref-load` of an FP8 model);
    `--load` when it is torch_dist (the `--ckpt-step` iteration). A 2-layer `--ref-load` for a 36-layer config
    failed inside `load_checkpoint` after the GPUs were set up, naming neither flag.

    Args:
        hf_checkpoint: `--hf-checkpoint` (the config.json `model_args` came from).
        ref_load: `--ref-load`, or None.
        load: `--load`, or None.
        ckpt_step: `--ckpt-step`, or None for the latest.
        model_args: the architecture the model is built with (its `make_vocab_size_divisible_by` is the run's).
        tensor_model_parallel_size: the run's TP degree: a torch_dist checkpoint's embedding rows must be the
            model's (`slime_convert.vocab_padding`).

    Raises:
        ValueError: naming the flag, the path, the first mismatching keys and the config fields; or a torch_dist
            checkpoint padded with another `--make-vocab-size-divisible-by` (naming both values) or TP size.
    """
    if ref_load and is_megatron_checkpoint(ref_load):
        check_torch_dist_checkpoint(
            "--ref-load", ref_load, model_args, config_dir=hf_checkpoint,
            tensor_model_parallel_size=tensor_model_parallel_size,
        )  # fmt: skip
    else:
        source = trainer_weights_dir(hf_checkpoint, ref_load)
        flag = "--hf-checkpoint" if source == hf_checkpoint else "--ref-load"
        check_hf_checkpoint(flag, source, model_args, config_dir=hf_checkpoint)
    if load and is_megatron_checkpoint(load):
        check_torch_dist_checkpoint(
            "--load", load, model_args, config_dir=hf_checkpoint, ckpt_step=ckpt_step,
            tensor_model_parallel_size=tensor_model_parallel_size,
        )  # fmt: skip


def check_value_head_checkpoint(flag: str, path: str, ckpt_step: int | None, hidden_size: int) -> None:
    """Checks that the critic's torch_dist checkpoint holds a value head, before the model is built.

    An actor's checkpoint given as the critic's (`--critic-load <actor save>`) stopped the critic's ranks inside
    megatron's load with `CheckpointException ... KeyError: 'output_layer.bias'`. Reads the `.metadata` only.

    Args:
        flag: `--critic-load`, or `--load` when the critic's folder is `<--load>/critic`.
        path: the critic's checkpoint folder (a save dir or an iteration dir).
        ckpt_step: the iteration the loader reads (`--ckpt-step`), else the tracker's.
        hidden_size: the model's hidden size H: a value head is `output_layer.weight [1, H]` with `output_layer.bias`.

    Raises:
        ValueError: naming the flag, the iteration and the head the checkpoint holds.
    """
    ckpt = resolve_iteration_dir(path, ckpt_step)
    keys = TorchDistReader(ckpt).tensor_keys()
    weight = keys.get("output_layer.weight")
    if weight is not None and tuple(weight[0]) == (1, hidden_size) and "output_layer.bias" in keys:
        return
    held = f"an output layer of shape {list(weight[0])}" if weight is not None else "no output layer (tied embeddings)"
    raise ValueError(
        f"{flag} {path}: {ckpt.name} is not a critic checkpoint: it holds {held}, a value head is [1, {hidden_size}] "
        "with a bias (an actor's checkpoint? the critic's are saved in <--save>/critic); give the critic's checkpoint "
        "folder, or an HF directory to start the value model from"
    )


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        state["tracker"] = get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().set_states(state["tracker"])


class _DropMarkerWarning(logging.Filter):
    """Drops megatron's "Overwriting old incomplete / corrupted checkpoint" warning for our marked staging dir."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Overwriting old incomplete")


@contextlib.contextmanager
def _quiet_marker_warning() -> Iterator[None]:
    # The staging dir holds only slime's marker file (MARKER), which megatron takes for a corrupted checkpoint.
    log, drop = logging.getLogger("megatron.core.dist_checkpointing.serialization"), _DropMarkerWarning()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def save_checkpoint(
    save_dir: str,
    rollout_id: int,
    model: Any,
    optimizer: Any,
    scheduler: Any,
    *,
    save_optim: bool = True,
    reference: contextlib.AbstractContextManager[Any] | None = None,
    make_vocab_size_divisible_by: int = 128,
    commit: bool = True,
) -> pathlib.Path:
    """Writes `<save_dir>/iter_{rollout_id:07d}` atomically (collective).

    Args:
        save_dir: `--save`.
        rollout_id: the rollout just trained (stored as the iteration).
        model: the unwrapped `GPTModel` of this rank.
        optimizer: megatron-core optimizer.
        scheduler: `OptimizerParamScheduler`.
        save_optim: False leaves the optimizer and scheduler state out (`--no-save-optim`); the checkpoint says so
            (`optimizer_saved`), and a resume of it needs `--no-load-optim` (`load_checkpoint`).
        reference: a context in which `model` holds the KL reference's weights (`WeightSwap.swapped("ref")`), given
            with `--ref-update-interval`: they are saved as a torch_dist checkpoint in `iter_XXXXXXX/ref`
            (`load_reference` reads them back).
        make_vocab_size_divisible_by: the run's vocabulary padding divisor, recorded for the next load's check
            (`slime_convert.vocab_padding`).
        commit: name it in the tracker file (the resume point); False leaves that to `commit_checkpoint`, once what
            the driver keeps with the checkpoint is written too.

    Returns:
        The checkpoint directory.
    """
    root = pathlib.Path(save_dir)
    final = root / iteration_name(rollout_id)
    tmp = staging_dir(final)
    if dist.get_rank() == 0:
        prepare_staging(final, flag="--save")  # never deletes a folder slime did not write (slime_core.dir_swap)
    dist.barrier()
    model_sd = model.sharded_state_dict()
    state = {
        "model": model_sd,
        "rollout_id": rollout_id,
        "iteration": rollout_id,
        "checkpoint_version": 3.0,
        "optimizer_saved": save_optim,
        DIVISOR_KEY: make_vocab_size_divisible_by,
    }
    if save_optim:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd)
        state["opt_param_scheduler"] = scheduler.state_dict()
    # RNG is per rank; a ShardedObject per rank keeps it out of the replicated common state.
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    rank, world = dist.get_rank(), dist.get_world_size()
    state["rng_state"] = ShardedObject("rng_state", _rng_state(), (world,), (rank,), replica_id=0)
    with _quiet_marker_warning():
        dist_checkpointing.save(state, str(tmp))
    if reference is not None:
        if rank == 0:
            (tmp / REFERENCE_DIR).mkdir()
        dist.barrier()
        with reference:  # the state dict's tensors are the live parameters: saved while the reference is in them
            dist_checkpointing.save({"model": model.sharded_state_dict()}, str(tmp / REFERENCE_DIR))
    dist.barrier()
    if rank == 0:
        swap_in(tmp, final, flag="--save")
        if commit:
            commit_checkpoint(save_dir, rollout_id)
    dist.barrier()
    logger.info("saved checkpoint %s", final)
    return final


def commit_checkpoint(save_dir: str | pathlib.Path, rollout_id: int) -> None:
    """Names the checkpoint of `rollout_id` in `<save_dir>/latest_checkpointed_iteration.txt`: the resume point.

    Rank 0 writes (flushed, then renamed: a crash leaves the previous name, never an empty tracker); other ranks do
    nothing.
    """
    if dist.get_rank() == 0:
        write_text_atomic(pathlib.Path(save_dir) / TRACKER_FILE, str(rollout_id))


def load_reference(reference_dir: str | os.PathLike[str], model: Any) -> None:
    """Reads the KL reference `save_checkpoint` kept in an iteration folder into `model` (collective).

    Call inside `WeightSwap.capture("ref", ...)`, which holds what this puts into the model and restores the trained
    weights.

    Args:
        reference_dir: `slime_core.checkpoint_dirs.saved_reference` of the iteration folder the actor resumed from
            (`resolve_iteration_dir` of `--load`: a save root or an iteration folder given directly).
        model: the unwrapped `GPTModel` of this rank (the actor's resume checked its shapes).
    """
    state = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(reference_dir))
    model.load_state_dict(state["model"], strict=True)


def _saved_rng_world(ckpt: pathlib.Path) -> int | None:
    """Number of ranks whose RNG states `save_checkpoint` wrote into `ckpt` (keys `rng_state/shard_<rank>_<world>`).

    None when the checkpoint holds none (saved by another program).
    """
    from torch.distributed.checkpoint import FileSystemReader

    for key in FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata:
        # Megatron-LM keys its RNG shards by (PP, TP) instead: `rng_state/shard_0.0_1.1`, not slime's.
        found = re.fullmatch(r"rng_state/shard_\d+_(\d+)", key)
        if found:
            return int(found.group(1))
    return None


def load_checkpoint(
    path: str,
    model: Any,
    optimizer: Any | None,
    scheduler: Any | None,
    *,
    load_rng: bool = True,
    ckpt_step: int | None = None,
) -> int | None:
    """Loads a torch_dist checkpoint into `model` (and optimizer/scheduler/RNG when given and present).

    Args:
        path: a save dir with the tracker file or an iteration dir.
        model: unwrapped `GPTModel`.
        optimizer: optimizer, or None for weights only.
        scheduler: scheduler, or None.
        load_rng: restore RNG states when saved.
        ckpt_step: iteration to load instead of the latest (`--ckpt-step`).

    A training iteration the original slime wrote (Megatron-LM's `save_checkpoint`: `iter_XXXXXXX` whose common state
    has `iteration` and `args` but no `rollout_id`) gives its weights and its iteration as the rollout id; its
    optimizer, schedule and RNG states are Megatron-LM's layout and are not read, so it needs `optimizer=None`.

    Returns:
        The stored rollout id (an original checkpoint's iteration), or None for a converted (`release`) checkpoint.

    Raises:
        FileNotFoundError: no checkpoint at `path`.
        ValueError: `optimizer` given for a checkpoint saved without optimizer state (names `--no-load-optim`), or
            for a checkpoint of the original slime (names `--no-load-optim` and `--finetune`).
    """
    ckpt = resolve_iteration_dir(path, ckpt_step)
    model_sd = model.sharded_state_dict()
    template: dict[str, Any] = {"model": model_sd}
    common = dist_checkpointing.load_common_state_dict(str(ckpt))
    resumable = "rollout_id" in common
    original = not resumable and ckpt.name.startswith("iter_") and "iteration" in common and "args" in common
    if original and optimizer is not None:
        # It resumed as weights only at rollout 0 (the LR warm-up, the data and --num-rollout started over), silently.
        raise ValueError(
            f"--load {path}: {ckpt.name} is a checkpoint of the original slime (Megatron-LM, iteration "
            f"{common['iteration']}): its optimizer, schedule and RNG states are not read here; give --no-load-optim "
            f"to continue at rollout {int(common['iteration']) + 1} from its weights with a fresh optimizer, or "
            "--finetune to start from its weights at rollout 0"
        )
    if optimizer is not None and resumable and common.get("optimizer_saved") is False:
        # As Megatron-LM ("Unable to load optimizer from checkpoint ... Specify --no-load-optim or --finetune").
        raise ValueError(no_optimizer_state_message(path, ckpt.name))
    if optimizer is not None and resumable:
        template["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=True)
    if load_rng and resumable:
        from megatron.core.dist_checkpointing.mapping import ShardedObject

        rank, world = dist.get_rank(), dist.get_world_size()
        saved_world = _saved_rng_world(ckpt)
        if saved_world == world:
            template["rng_state"] = ShardedObject("rng_state", None, (world,), (rank,), replica_id=0)
        elif rank == 0:
            # One RNG state per rank: another rank count has none of its own (as Megatron-LM after a TP/PP change).
            logger.warning(
                "--load %s: saved by %s ranks, loaded by %d: the RNG states are not restored (weights, optimizer and "
                "schedule are; --no-load-rng says this on purpose)", ckpt, saved_world, world,
            )  # fmt: skip
    state = dist_checkpointing.load(template, str(ckpt))
    model.load_state_dict(state["model"], strict=True)
    if "optimizer" in template:
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and "opt_param_scheduler" in state:
            try:
                scheduler.load_state_dict(state["opt_param_scheduler"])
            except AssertionError as e:  # megatron-core: "class input value X and checkpointvalue Y for NAME ..."
                raise ValueError(
                    f"--load {ckpt}: the checkpoint's learning-rate schedule differs from this run's flags ({e}); a "
                    "resumed run continues the checkpoint's schedule: give the saved --lr/--min-lr/warmup/decay "
                    "(and WSD anneal) values, or --no-load-optim to start the optimizer and its schedule afresh"
                ) from None
    if "rng_state" in template:
        _set_rng_state(state["rng_state"])
    logger.info("loaded %s (%s)", ckpt, "resumable" if resumable else "weights only")
    if original:
        return int(common["iteration"])
    return int(common["rollout_id"]) if resumable else None
