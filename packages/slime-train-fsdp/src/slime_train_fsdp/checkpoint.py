"""Resumable checkpoints with torch.distributed.checkpoint (DCP).

Layout under `--save` (as the original FSDP backend):

    iter_{rollout_id + 1:07d}/
        model_and_optim/      DCP shards of {"model", "optim"} (sharded state dicts, no gather); a LoRA model's
                              "model" holds its adapters only (`_persisted`)
        ref/                  DCP shards of {"model"}: the KL reference, with --ref-update-interval only
        scheduler.pt          LR scheduler state
        rng_{rank}.pt         torch (and CUDA) RNG state of each rank
        meta.json             {rollout_id, next_rollout_id, global_step, world_size, model_flags, save_optim}
    latest_checkpointed_iteration.txt

Atomicity: everything is written into `iter_XXXXXXX.tmp`, renamed to its final name by rank 0 after all ranks
finished, and only then is the tracker file replaced (`slime_core.dir_swap.write_text_atomic`); files are flushed
to the disk before each rename. A run killed mid-save leaves
the previous checkpoint as `latest`. A checkpoint directory is marked as slime's (`slime_core.dir_swap`): re-saving an
iteration replaces only a directory slime wrote, never a user's folder of the same name. The names of the layout
are `slime_core.checkpoint_dirs`'s, shared with the driver's checks and the Megatron backend.

A resume is refused before anything is read when a flag that decides the parameters (`model_flags_of`) differs
from the one in `meta.json`, and when the saved parameter names or shapes (DCP's `.metadata`) differ from the
model's; only a checkpoint whose files cannot be read is called damaged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from slime_core.checkpoint_dirs import (
    FSDP_MODEL_DIR,
    REFERENCE_DIR,
    TRACKER_FILE,
    complete_iterations,
    iteration_name,
    no_optimizer_state_message,
    tracker_step,
)
from slime_core.dir_swap import prepare_staging, staging_dir, swap_in, write_text_atomic
from slime_core.error_text import first_rank_error, first_sentence
from slime_train_fsdp.base_weights import weights_fingerprint
from slime_train_fsdp.lora import is_adapter
from slime_train_fsdp.lr_schedule import check_param_groups, load_scheduler_state

logger = logging.getLogger(__name__)

__all__ = [
    "check_critic_checkpoint",
    "load_checkpoint",
    "load_reference",
    "model_flag_mismatches",
    "model_flags_of",
    "optimizer_state_refusal",
    "save_checkpoint",
]


def _persisted(model_sd: dict[str, Any]) -> dict[str, Any]:
    """The part of a model state dict a checkpoint holds: everything, or a LoRA model's adapters only.

    A LoRA model's base is frozen: it is `--hf-checkpoint`'s, loaded at init (and what the engines serve), so each
    save rewrote the whole model (gigabytes) for a few MB of adapters; the original's FSDP LoRA saved `adapter/`
    alone too. A checkpoint that holds the base as well (written before) still loads: its base is not read.
    """
    if not any(is_adapter(k) for k in model_sd):
        return model_sd
    return {k: v for k, v in model_sd.items() if is_adapter(k)}


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_checkpoint(
    save_dir: str | pathlib.Path,
    *,
    rollout_id: int,
    global_step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    save_optim: bool = True,
    model_flags: dict[str, Any] | None = None,
    reference: contextlib.AbstractContextManager[Any] | None = None,
    commit: bool = True,
) -> pathlib.Path:
    """Writes the checkpoint of `rollout_id` (collective: every rank calls it).

    Args:
        save_dir: `--save`.
        rollout_id: the rollout just trained; the run resumes at `rollout_id + 1`.
        global_step: optimizer steps taken so far.
        model: the sharded model.
        optimizer: its optimizer.
        scheduler: its LR scheduler.
        save_optim: False skips optimizer and scheduler state (`--no-save-optim`).
        model_flags: the flags that decide which parameters the model has (`--lora-rank`, `--lora-target-modules`),
            kept in `meta.json` so a resume with others is refused by name (`model_flag_mismatches`).
        reference: a context in which `model` holds the KL reference's weights (`WeightSwap.swapped("ref")`), given
            with `--ref-update-interval`: they are saved in `REFERENCE_DIR` (`load_reference` reads them back).
        commit: name it in the tracker file (the resume point); False leaves that to `commit_checkpoint`, once what
            the driver keeps with the checkpoint is written too.

    Returns:
        The final checkpoint directory.
    """
    root = pathlib.Path(save_dir)
    rank = dist.get_rank()
    final = root / iteration_name(rollout_id + 1)
    tmp = staging_dir(final)
    if rank == 0:
        prepare_staging(final, flag="--save")  # never deletes a folder slime did not write (slime_core.dir_swap)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    model_sd = _persisted(model_sd)
    state = {"model": model_sd, "optim": optim_sd} if save_optim else {"model": model_sd}
    dcp.save(state, checkpoint_id=str(tmp / FSDP_MODEL_DIR))
    if reference is not None:
        # `model_sd`'s tensors are views of the live parameters (no gather, no copy), which the swap overwrites in
        # place: saved again while the reference is in them.
        with reference:
            dcp.save({"model": model_sd}, checkpoint_id=str(tmp / REFERENCE_DIR))
    torch.save(_rng_state(), tmp / f"rng_{rank}.pt")
    if rank == 0:
        if save_optim:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        meta = {
            "rollout_id": rollout_id,
            "next_rollout_id": rollout_id + 1,
            "global_step": global_step,
            "world_size": dist.get_world_size(),
            "model_flags": model_flags or {},
            "save_optim": save_optim,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
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

    Rank 0 writes (flushed, then renamed: a crash leaves the previous name); other ranks do nothing.
    """
    if dist.get_rank() == 0:
        write_text_atomic(pathlib.Path(save_dir) / TRACKER_FILE, str(rollout_id + 1))


def _recovery_hint(root: pathlib.Path, damaged: pathlib.Path | None = None) -> str:
    """Which other iterations under `root` look complete (`meta.json`), as a `--ckpt-step` to resume from."""
    steps = [step for step in complete_iterations(root) if damaged is None or iteration_name(step) != damaged.name]
    if not steps:
        return "no other checkpoint is there"
    return f"other checkpoints there: iterations {', '.join(map(str, steps))}; resume with --ckpt-step {steps[-1]}"


class _OtherParameters(ValueError):
    """The checkpoint's files are fine but hold other parameters (names or shapes) than the model being loaded."""


class _OtherSchedule(ValueError):
    """The checkpoint's learning-rate schedule or AdamW settings differ from this run's flags (`load_scheduler_state`).

    Kept apart from a file that cannot be read, so the message says what differs (not "damaged") and names the
    loader's own flag (`--critic-load` for the critic).
    """


def _parameter_differences(
    state_dir: pathlib.Path, model_sd: dict[str, Any], not_read: frozenset[str] = frozenset()
) -> str | None:
    """How the model parameters saved in DCP's `.metadata` differ from `model_sd`'s names and shapes; None: same.

    Compared from the metadata before loading, so that a checkpoint of another model is told from a damaged one
    by what it holds, not by the wording of torch's error. Saved keys in `not_read` (a LoRA model's frozen base,
    which older checkpoints hold: `_persisted`) are no difference.

    Raises:
        Exception: what DCP's reader raises on a `.metadata` it cannot read (a damaged checkpoint).
    """
    saved_meta = dcp.FileSystemReader(str(state_dir)).read_metadata().state_dict_metadata
    saved = {key.removeprefix("model."): tuple(md.size) for key, md in saved_meta.items()
             if key.startswith("model.") and isinstance(md, TensorStorageMetadata)}  # fmt: skip
    here = {key: tuple(value.shape) for key, value in model_sd.items() if isinstance(value, torch.Tensor)}

    def names(keys: set[str]) -> str:
        listed = sorted(keys)
        return ", ".join(listed[:3]) + (f" ({len(listed)} in all)" if len(listed) > 3 else "")

    parts = []
    if missing := set(here) - set(saved):
        parts.append(f"not in the checkpoint: {names(missing)}")
    if extra := set(saved) - set(here) - not_read:
        parts.append(f"only in the checkpoint: {names(extra)}")
    resized = sorted(k for k in set(here) & set(saved) if here[k] != saved[k])
    if resized:
        k = resized[0]
        more = f" and {len(resized) - 1} more" if len(resized) > 1 else ""
        parts.append(f"other shapes: {k} {list(saved[k])} saved vs {list(here[k])} here{more}")
    return "; ".join(parts) or None


def check_critic_checkpoint(flag: str, load_dir: str | os.PathLike[str], ckpt_step: int | None) -> None:
    """Checks that the checkpoint the critic resumes holds a value head, from DCP's `.metadata`, before loading.

    An actor's checkpoint given as the critic's (`--critic-load <actor save>`) was refused as one whose model flags
    differ (`--lora-rank`, ...) and named `--load`. A tracker or iteration that is missing or unreadable is left to
    `load_checkpoint`, which names it.

    Args:
        flag: `--critic-load`, or `--load` when the critic's folder is `<--load>/critic`.
        load_dir: the critic's checkpoint folder.
        ckpt_step: `--ckpt-step`; the tracker's iteration when None.

    Raises:
        ValueError: naming the flag, the folder and the iteration, when its model has no `value_head.weight`.
    """
    root = pathlib.Path(load_dir)
    step = ckpt_step if ckpt_step is not None else tracker_step(root)
    if step is None:
        return
    path = root / iteration_name(step)
    try:
        saved = dcp.FileSystemReader(str(path / FSDP_MODEL_DIR)).read_metadata().state_dict_metadata
    except Exception:  # noqa: BLE001 - missing or damaged: load_checkpoint names it
        return
    if "model.value_head.weight" in saved:
        return
    head = "an lm_head" if "model.lm_head.weight" in saved else "no value head"
    raise ValueError(
        f"{flag} {root}: {path.name} is not a critic checkpoint: its model has {head} and no value_head (an actor's "
        "checkpoint? the critic's are saved in <--save>/critic); give the critic's checkpoint folder, or an HF "
        "directory to start the value model from"
    )


def _read(
    path: pathlib.Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    load_optim: bool,
    load_rng: bool,
) -> None:
    """Reads the checkpoint at `path` into the model, optimizer, scheduler and RNG.

    Raises:
        _OtherParameters: the saved model parameters differ from `model`'s (names the first differences).
    """
    has_optim = (path / "scheduler.pt").exists()
    full_sd, optim_sd = get_state_dict(model, optimizer)
    model_sd = _persisted(full_sd)
    differences = _parameter_differences(path / FSDP_MODEL_DIR, model_sd, frozenset(full_sd) - frozenset(model_sd))
    if differences:
        raise _OtherParameters(differences)
    if load_optim and has_optim:
        saved_schedule = torch.load(path / "scheduler.pt", weights_only=False)
        try:
            check_param_groups(scheduler, saved_schedule)  # before DCP, which would call the checkpoint damaged
        except ValueError as e:
            raise _OtherSchedule(str(e)) from None
    state = {"model": model_sd, "optim": optim_sd} if (load_optim and has_optim) else {"model": model_sd}
    dcp.load(state, checkpoint_id=str(path / FSDP_MODEL_DIR))
    partial = StateDictOptions(strict=len(model_sd) == len(full_sd))  # a LoRA model: the base stays as loaded
    if "optim" in state:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=partial)  # fmt: skip
    else:
        set_model_state_dict(model, state["model"], options=partial)
    if load_optim and has_optim:
        try:
            load_scheduler_state(scheduler, saved_schedule)
        except ValueError as e:
            raise _OtherSchedule(str(e)) from None
    rng_file = path / f"rng_{dist.get_rank()}.pt"
    if load_rng and rng_file.exists():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])


def model_flag_mismatches(meta: dict[str, Any], model_flags: dict[str, Any]) -> list[str]:
    """`"--flag saved vs here"` for each model flag of `meta.json` that differs from this run's (none recorded: []).

    A LoRA run's `--hf-checkpoint` (its frozen base) is compared by its weights' fingerprint and named by its paths.
    """
    saved = meta.get("model_flags") or {}
    differ = []
    # Flags only one side has (the target modules of a LoRA run against a full fine-tune) follow from one that both
    # have (--lora-rank).
    for flag in saved:
        if flag not in model_flags or saved[flag] == model_flags[flag]:
            continue
        if flag == _BASE_FLAG:
            mine, theirs = model_flags[flag], saved[flag]
            if not (isinstance(theirs, dict) and mine.get("fingerprint") and theirs.get("fingerprint")):
                continue  # one side has no safetensors to fingerprint: nothing to compare
            if mine["fingerprint"] != theirs["fingerprint"]:
                differ.append(
                    f"--hf-checkpoint {theirs.get('path')} saved vs {mine['path']} here: the LoRA adapters were "
                    "trained on other base weights"
                )
            continue
        differ.append(f"{flag} {saved[flag]} saved vs {model_flags[flag]} here")
    return differ


_BASE_FLAG = "--hf-checkpoint"


def model_flags_of(cfg: Any) -> dict[str, Any]:
    """The flags that decide the FSDP model's parameters and what they compute (LoRA or not, its modules and scale).

    A LoRA run also records its frozen base (`--hf-checkpoint`: its path and `base_weights.weights_fingerprint`):
    the checkpoint holds only the adapters, which resumed on another base train on weights they were not fitted to.
    """
    if not cfg.lora_rank:
        return {"--lora-rank": 0}
    base = os.path.abspath(cfg.hf_checkpoint) if cfg.hf_checkpoint else None
    # alpha scales the saved adapter: resumed under another value, the model would silently be another one.
    return {"--lora-rank": cfg.lora_rank, "--lora-alpha": float(cfg.lora_alpha),
            "--lora-target-modules": sorted(cfg.lora_target_modules),
            _BASE_FLAG: {"path": base, "fingerprint": weights_fingerprint(base) if base else None}}  # fmt: skip


def load_checkpoint(
    load_dir: str | pathlib.Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ckpt_step: int | None = None,
    load_optim: bool = True,
    load_rng: bool = True,
    model_flags: dict[str, Any] | None = None,
    flag: str = "--load",
) -> dict[str, Any] | None:
    """Restores a checkpoint written by `save_checkpoint` (collective).

    Args:
        load_dir: `--load` (or the critic's folder, see `flag`).
        model: the sharded model (same world size not required: DCP reshards).
        optimizer: its optimizer.
        scheduler: its LR scheduler.
        ckpt_step: `--ckpt-step`, the `iter_` number to load; the tracker's value when None.
        load_optim: False leaves optimizer/scheduler fresh (`--no-load-optim`).
        load_rng: False keeps the current RNG (`--no-load-rng`).
        model_flags: this run's `model_flags_of(cfg)`, compared with the ones in the checkpoint's `meta.json` before
            anything is read; a checkpoint written before `meta.json` had them gets them written there once it
            loaded, so its next resume is checked. None: not compared (the critic, the OPD teacher).
        flag: the flag that named `load_dir`, as the messages name it (`--critic-load` for the critic's own).

    Returns:
        The checkpoint's `meta.json`, or None when `load_dir` holds no checkpoint.

    Raises:
        FileNotFoundError: when `ckpt_step` (or the tracker) names a missing checkpoint.
        ValueError: the tracker names no iteration; `load_optim` with a checkpoint saved without optimizer
            state (`--no-save-optim`: names `--no-load-optim`); a model flag differs from the saved one (names the
            flag and both values); the saved parameters differ from the model's (names the first differing ones); the
            learning-rate schedule or AdamW flags differ from the saved ones (`load_scheduler_state`); or the
            checkpoint's files cannot be read (truncated, corrupt): the message names `flag`, the iteration and
            the cause, and lists the other complete iterations.
    """
    root = pathlib.Path(load_dir)
    if ckpt_step is None:
        tracker = root / TRACKER_FILE
        if not tracker.exists():
            logger.warning("%s %s has no %s; starting from the HF checkpoint", flag, root, TRACKER_FILE)
            return None
        ckpt_step = tracker_step(root)
        if ckpt_step is None:  # there, and damaged ("release" is a Megatron conversion's)
            text = tracker.read_text(errors="replace").strip()
            raise ValueError(f"{flag} {root}: {TRACKER_FILE} holds {text!r}, not an iteration; {_recovery_hint(root)}")
    path = root / iteration_name(ckpt_step)
    if not (path / "meta.json").exists():
        raise FileNotFoundError(f"{flag} {root}: checkpoint {path} is missing or incomplete; {_recovery_hint(root)}")
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise ValueError(f"meta.json holds {type(meta).__name__}, not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise _damaged(root, path, e, flag) from e
    refusal = optimizer_state_refusal(root, path, meta, flag=flag) if load_optim else None
    if refusal:
        raise ValueError(refusal)
    differ = model_flag_mismatches(meta, model_flags) if model_flags is not None else []
    if differ:
        raise ValueError(
            f"{flag} {root}: {path.name} was saved with other model flags than this run's ({'; '.join(differ)}); "
            "resume with the saved run's flags"
        )
    try:
        _read(path, model, optimizer, scheduler, load_optim=load_optim, load_rng=load_rng)
    except _OtherParameters as e:
        raise ValueError(
            f"{flag} {root}: {path.name} holds other parameters than this run's model ({e}): a flag that decides "
            "the parameters differs from the saved run's (--lora-rank, --lora-target-modules, --hf-checkpoint); "
            "resume with the saved run's flags"
        ) from None
    except _OtherSchedule as e:
        raise ValueError(str(e).replace("--load:", f"{flag} {root}: {path.name}:", 1)) from None
    except (Exception, CheckpointException) as e:  # DCP's collection of rank errors is a BaseException
        raise _damaged(root, path, e, flag) from e
    _note_other_world_size(root, path, meta.get("world_size"), load_rng)
    if model_flags is not None and "model_flags" not in meta:
        meta["model_flags"] = model_flags
        if dist.get_rank() == 0:  # written before these flags were kept: the next resume compares them
            write_text_atomic(path / "meta.json", json.dumps(meta, indent=2))
    dist.barrier()
    logger.info("loaded checkpoint %s (next rollout %d)", path, meta["next_rollout_id"])
    return meta


def load_reference(reference_dir: str | os.PathLike[str], model: nn.Module) -> None:
    """Reads the KL reference `save_checkpoint` kept in an iteration folder into `model` (collective).

    Call inside `WeightSwap.capture("ref", ...)`, which holds what this puts into the model and restores the
    trained weights.

    Args:
        reference_dir: `slime_core.checkpoint_dirs.saved_reference` of the iteration folder resumed
            (`<--load>/iter_XXXXXXX/ref`).
        model: the sharded model (its parameter names and shapes are the saved ones: the actor's resume checked them).

    Raises:
        ValueError: its files cannot be read (names `--load`, the iteration and the cause).
    """
    path = pathlib.Path(reference_dir)
    full_sd = get_model_state_dict(model)
    state = {"model": _persisted(full_sd)}  # a LoRA reference: its adapters on the shared frozen base
    try:
        dcp.load(state, checkpoint_id=str(path))
    except (Exception, CheckpointException) as e:  # DCP's collection of rank errors is a BaseException
        raise _damaged(path.parent.parent, path.parent, e) from e
    set_model_state_dict(model, state["model"], options=StateDictOptions(strict=len(state["model"]) == len(full_sd)))


def optimizer_state_refusal(
    load_dir: str | os.PathLike[str], path: pathlib.Path, meta: dict[str, Any] | None = None, *, flag: str = "--load"
) -> str | None:
    """Why the checkpoint at `path` cannot be resumed with its optimizer: it was saved without optimizer state.

    The loader and the app's preflight (`slime_app.checkpoints`) refuse it by this one rule: `meta.json`'s
    `save_optim` is False, or (a checkpoint saved before that field) `scheduler.pt` is missing. A checkpoint saved
    with its optimizer state whose `scheduler.pt` is gone is refused as such (a partial copy).

    Args:
        load_dir: the `--load` directory (named in the message).
        path: the iteration folder.
        meta: its `meta.json`, already read; None reads it (an unreadable one counts as no field: the loader names
            the damage).
        flag: the flag that named `load_dir` (`--critic-load` for the critic's own).

    Returns:
        The refusal (`slime_core.checkpoint_dirs.no_optimizer_state_message`), or None when the state is there.
    """
    if meta is None:
        try:
            meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            meta = {}
    saved = meta.get("save_optim", True) if isinstance(meta, dict) else True
    if saved is not False and (path / "scheduler.pt").is_file():
        return None
    if saved is True and isinstance(meta, dict) and "save_optim" in meta:
        # Written with its optimizer state (meta.json says so): the file went missing since, not --no-save-optim.
        return (
            f"{flag} {load_dir}: {path.name}/scheduler.pt is missing, though {path.name} was saved with its optimizer "
            "state (a partial copy); restore the file, resume from another iteration with --ckpt-step, or give "
            "--no-load-optim to start the optimizer and its learning-rate schedule afresh"
        )
    return no_optimizer_state_message(load_dir, path.name, flag=flag)


def _note_other_world_size(root: pathlib.Path, path: pathlib.Path, saved: Any, load_rng: bool) -> None:
    """One warning (rank 0) when the RNG states of a checkpoint saved by another number of ranks cannot all be used.

    DCP reshards the weights and the optimizer; the RNG states are per rank (`rng_{rank}.pt`) and are not: a rank
    without a saved state kept its seeded one, and saved states of ranks that no longer exist were dropped, silently.
    """
    world = dist.get_world_size()
    if not load_rng or not isinstance(saved, int) or saved == world or dist.get_rank() != 0:
        return
    which = (
        f"ranks {saved}-{world - 1} have no saved RNG state and keep their seeded one"
        if world > saved
        else f"the saved RNG states of ranks {world}-{saved - 1} are not used"
    )
    logger.warning(
        "--load %s: %s was saved by %d rank(s) and resumes on %d: %s, so the trainer's random draws (dropout) differ "
        "from an uninterrupted run's",
        root, path.name, saved, world, which,
    )  # fmt: skip


def _damaged(root: pathlib.Path, path: pathlib.Path, error: BaseException, flag: str = "--load") -> ValueError:
    """The one-line error of a checkpoint whose files cannot be read (names the cause and the other iterations)."""
    detail = first_sentence(first_rank_error(error))
    return ValueError(
        f"{flag} {root}: {path.name} cannot be read ({detail}); it was damaged after it was written (a partial copy, "
        f"a crash before it reached the disk); {_recovery_hint(root, path)}"
    )
