"""The checkpoints a run reads (`--load`, `--ref-load`, `--critic-load`): what each holds, checked before starting.

Each one's kind is told from its files alone (`slime_app.checkpoint_kinds`); its architecture is compared with
`--hf-checkpoint`'s (`slime_app.checkpoint_shapes`).
`--ref-load` is checked (and converted for FSDP) in `slime_app.ref_load`; architectures in
`slime_app.checkpoint_architecture`.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib

from slime_app.checkpoint_architecture import architecture_check, grouped, key_shapes_check
from slime_app.checkpoint_kinds import RECOGNIZED_KINDS, checkpoint_kind, iteration_dir, with_article
from slime_app.dcp_shards import check_shards, checkpoint_state_dirs
from slime_app.ref_load import check_ref_load
from slime_app.run_lock import unless_in_use
from slime_core.checkpoint_dirs import (
    TRACKER_FILE,
    complete_iterations,
    critic_dirs,
    interrupted_saves,
    iteration_name,
    restore_interrupted_saves,
)
from slime_core.config import SlimeArgs
from slime_core.error_text import first_sentence
from slime_core.extensions import train_backend_spec

logger = logging.getLogger(__name__)

__all__ = ["check_checkpoints"]


def _recovery_hint(root: pathlib.Path, *, exclude: str | None = None) -> str:
    """The complete iterations under `root` to resume from (`exclude`: the name of one found damaged)."""
    iterations = [step for step in complete_iterations(root) if iteration_name(step) != exclude]
    cut = interrupted_saves(root)
    aside = (
        f"; {', '.join(f'{iteration_name(step)}.old' for step in cut)}: complete, moved aside by a save cut between "
        "its two renames: rename it back without .old (a run whose --save is this --load does that itself)"
        if cut
        else ""
    )
    if not iterations:
        other = " other" if exclude else ""
        return f"no{other} complete checkpoint is there: leave out --load to start afresh{aside}"
    return (
        f"complete checkpoints there: iterations {', '.join(map(str, iterations))}; resume from one with "
        f"--ckpt-step {iterations[-1]}{aside}"
    )


def _restore_cut_saves(cfg: SlimeArgs, notes: list[str]) -> None:
    """Puts back the iterations a save cut between its two renames left as `iter_XXXXXXX.old` (`interrupted_saves`).

    Only in this run's own checkpoint folders (`--load` equal to `--save`: a resume; with a critic, also its
    `--critic-load` equal to `--critic-save`, by default `<--load>/critic` and `<--save>/critic`), not in `--dry-run`,
    and only while no live run holds the folder's lock; elsewhere `_recovery_hint` names them. Without this, the
    tracker named a missing iteration and the resume was refused as "a partial copy", or went back one checkpoint,
    with the complete copy in the folder.
    """
    if cfg.dry_run or not cfg.save:
        return
    pairs = [("--load", cfg.load, cfg.save, cfg.save)]
    if cfg.use_critic:
        critic_load, critic_save = critic_dirs(cfg)
        pairs.append(("--critic-load", critic_load, critic_save, cfg.critic_save or cfg.save))
    for flag, load, save, locked in pairs:
        if os.path.realpath(load) != os.path.realpath(save) or not interrupted_saves(load):
            continue
        try:
            with unless_in_use(locked) as free:
                restored = restore_interrupted_saves(load) if free else []
        except OSError:  # a read-only folder: the hint names the folders, the writable check names the flag
            logger.debug("%s %s: could not restore its cut saves", flag, load, exc_info=True)
            restored = []
        notes += [
            f"{flag} {load}: restored {iteration_name(step)} from {iteration_name(step)}.old (a save that replaced it "
            "was cut between its two renames; the copy is complete)"
            for step in restored
        ]


def _tracker_problem(root: pathlib.Path) -> str | None:
    """Why `root`'s tracker file names no usable iteration (None: it names one, or no tracker and no iteration)."""
    tracker = root / TRACKER_FILE
    if not tracker.is_file():
        # The first save's folder is in place before its tracker is written: a kill in between left complete
        # iterations and no tracker, refused as "an unknown checkpoint ... point --load at a --save directory".
        if complete_iterations(root):
            return f"{TRACKER_FILE} is missing (a save cut before its tracker was written, or a partial copy)"
        return None
    if iteration_dir(root) is not None:
        return None
    text = tracker.read_text(errors="replace").strip()
    said = "is empty" if not text else f"names {text!r}, which is not an iteration folder there"
    # The tracker is replaced only after its iteration is in place: a cut-short copy or a crash before the data
    # reached the disk, not a save of ours, leaves it so.
    return f"{TRACKER_FILE} {said} (a partial copy, or a crash before the last save reached the disk)"


def _warn_unread_load(cfg: SlimeArgs) -> None:
    """`--debug-rollout-only` with a checkpoint as `--load`: no trainer runs, so nothing of it is read; said once.

    As the original (its actor returns rollout 0 without loading), the engines serve `--hf-checkpoint` and the data
    starts from its first prompt; a run meant to roll out the checkpoint's model rolled out the initial one without a
    word. Its trainer checks (the learning-rate schedule) refused it instead, though no optimizer runs.
    """
    kind = checkpoint_kind(cfg.load)
    if kind in ("missing", "empty"):
        return
    logger.warning(
        "--load %s: --debug-rollout-only runs no trainer, so the weights of %s there are not loaded: the engines "
        "serve --hf-checkpoint %s, from rollout %d; to roll out the checkpoint's weights, export them (--save-hf, or "
        "slime-convert mcore-to-hf) and give that folder as --hf-checkpoint",
        cfg.load, with_article(kind), cfg.hf_checkpoint, cfg.start_rollout_id or 0,
    )  # fmt: skip


def _check_load(cfg: SlimeArgs, notes: list[str]) -> None:
    root = pathlib.Path(cfg.load)
    _restore_cut_saves(cfg, notes)
    if cfg.ckpt_step is not None and root.is_dir():
        step_dir = root / iteration_name(cfg.ckpt_step)
        if cfg.ckpt_step not in complete_iterations(root):
            raise ValueError(
                f"--ckpt-step {cfg.ckpt_step}: --load {root} has no complete {step_dir.name}; {_recovery_hint(root)}"
            )
        kind = "fsdp" if (step_dir / "meta.json").is_file() else "torch_dist"
    else:
        kind = checkpoint_kind(cfg.load)
        problem = _tracker_problem(root) if kind == "unknown" else None
        if problem:
            raise ValueError(f"--load {root}: {problem}; {_recovery_hint(root)}")
    if kind in ("missing", "empty"):
        if cfg.ckpt_step is not None:  # the trainer stopped on it, after Ray and the engines had started
            raise ValueError(
                f"--ckpt-step {cfg.ckpt_step}: --load {cfg.load} does not exist; leave out --ckpt-step to start "
                "afresh there (or fix --load)"
            )
        notes.append(f"--load {cfg.load}: no checkpoint yet, the run starts at rollout 0")
        return
    if kind == "hf" and _check_hf_load(cfg, notes):
        return
    wanted = train_backend_spec(cfg).checkpoint_format
    if wanted not in RECOGNIZED_KINDS:  # another package's format: its backend checks the directory when it loads it
        notes.append(
            f"--load {cfg.load}: --train-backend {cfg.train_backend} saves {wanted or 'its own'} checkpoints, which "
            "this check does not recognize; the backend reads it when it starts"
        )
        return
    if kind != wanted:
        hint = {
            "torch_dist": "convert it to HF (slime-convert mcore-to-hf) and give that as --hf-checkpoint",
            "hf": "give it as --hf-checkpoint",
        }.get(kind, "point --load at a --save directory of this backend")
        raise ValueError(
            f"--load {cfg.load}: {with_article(kind)}; --train-backend {cfg.train_backend} resumes its own {wanted} "
            f"checkpoints ({hint})"
        )
    folders = checkpoint_state_dirs(root, kind, cfg.ckpt_step)  # metadata and file sizes only, no tensor read
    step_name = (folders[0].name if kind == "torch_dist" else folders[0].parent.name) if folders else None
    check_shards("--load", root, folders, _recovery_hint(root, exclude=step_name))
    if kind == "fsdp":
        _check_fsdp_model_flags(cfg, root)
    if kind == "fsdp" and not cfg.no_load_optim:
        _check_fsdp_schedule(cfg, root)
    notes.append(f"--load {cfg.load}: {kind} checkpoint, the run resumes from it")


def _initial_weights(cfg: SlimeArgs) -> tuple[str, str]:
    """`(flag, directory)` the trainer's weights come from before any `--load`.

    A torch_dist `--ref-load` under a backend that reads it (Megatron), else `trainer_weights_dir` (`--hf-checkpoint`,
    or the BF16 `--ref-load` of an FP8 one).
    """
    from slime_core.fp8 import trainer_weights_dir

    if cfg.ref_load and train_backend_spec(cfg).reads_torch_dist and checkpoint_kind(cfg.ref_load) == "torch_dist":
        return "--ref-load", cfg.ref_load
    weights = trainer_weights_dir(cfg.hf_checkpoint, cfg.ref_load)
    return ("--hf-checkpoint" if weights == str(cfg.hf_checkpoint) else "--ref-load"), weights


def _check_hf_load(cfg: SlimeArgs, notes: list[str]) -> bool:
    """An HF directory as `--load`: the original's "start from these weights at rollout 0" (no optimizer, no RNG).

    Its scripts give the model folder as both flags (`examples/geo3k_vlm/run_geo3k_qwen35.sh`: `--hf-checkpoint M
    --load M`). When it is the folder the trainer starts from anyway (`_initial_weights`), the run is the one the
    original makes; it was refused as "an hf checkpoint ... give it as --hf-checkpoint", which it already was.

    Returns:
        True when accepted (a note says so); False without `--hf-checkpoint` (left to the refusal below).

    Raises:
        ValueError: another HF folder than the trainer's initial weights (the original's Megatron actor would start
            from it; here the trainer starts from `_initial_weights`): names both flags and folders.
    """
    if not cfg.hf_checkpoint:
        return False
    flag, weights = _initial_weights(cfg)
    if os.path.realpath(cfg.load) != os.path.realpath(weights):
        raise ValueError(
            f"--load {cfg.load}: an HF checkpoint other than the weights the trainer starts from ({flag} {weights}); "
            "the trainer starts from those and resumes only its own checkpoints from --load: give this folder as "
            f"{flag}, or leave out --load"
        )
    notes.append(
        f"--load {cfg.load}: HF weights, the ones the trainer starts from ({flag}): the run starts from them at "
        "rollout 0 with a fresh optimizer, as the original's --load of an HF directory"
    )
    return True


def _read_meta(root: pathlib.Path, step_dir: pathlib.Path | None) -> dict | None:
    """`step_dir/meta.json` as a dict (None: no iteration, or no meta.json there: the trainer's load names that).

    Raises:
        ValueError: not UTF-8 JSON holding an object, named as `--load <root>: <iteration>/meta.json ...` with the
            complete iterations to resume from (callers for the critic rename the flag).
    """
    meta = step_dir / "meta.json" if step_dir is not None else None
    if meta is None or not meta.is_file():
        return None
    try:  # the trainer's load refuses it too, but after Ray, the engines and the model build
        saved = json.loads(meta.read_text(encoding="utf-8"))
        if not isinstance(saved, dict):
            raise ValueError(f"it holds {type(saved).__name__}, not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"--load {root}: {step_dir.name}/meta.json cannot be read ({type(e).__name__}: {first_sentence(e)}); it "
            "was damaged after it was written (a partial copy, a crash before it reached the disk); "
            f"{_recovery_hint(root, exclude=step_dir.name)}"
        ) from None
    return saved


def _check_fsdp_model_flags(cfg: SlimeArgs, root: pathlib.Path) -> None:
    """`--load`'s `meta.json` names the flags that decided its parameters; this run must have the same.

    A LoRA checkpoint resumed without `--lora-rank` (or the reverse) failed after the engines started, as a
    checkpoint "damaged after it was written".

    Raises:
        ValueError: naming `--load` and each differing flag with both values.
    """
    from slime_train_fsdp.checkpoint import model_flag_mismatches, model_flags_of

    step_dir = root / iteration_name(cfg.ckpt_step) if cfg.ckpt_step is not None else iteration_dir(root)
    saved = _read_meta(root, step_dir)
    if saved is None:
        return
    differ = model_flag_mismatches(saved, model_flags_of(cfg))
    if differ:
        raise ValueError(
            f"--load {root}: {step_dir.name} was saved by a run whose model had other parameters "
            f"({'; '.join(differ)}); resume with the saved run's flags"
        )


def _check_fsdp_schedule(cfg: SlimeArgs, root: pathlib.Path) -> None:
    """The learning-rate schedule this run builds must be the one `--load`'s `scheduler.pt` continues.

    The trainer refuses another one when it loads the checkpoint (`slime_train_fsdp.lr_schedule`), after Ray and the
    engines started, in a trainer's traceback; the same check here is one line before anything starts. A checkpoint
    saved with `--no-save-optim` has no schedule to continue: refused unless `--no-load-optim` (as the original).

    Raises:
        ValueError: naming `--load`, the flags and both values; or `--no-load-optim` for a checkpoint without
            optimizer state.
    """
    import torch

    from slime_train_fsdp.checkpoint import optimizer_state_refusal
    from slime_train_fsdp.lr_schedule import build_lr_scheduler, load_scheduler_state

    step_dir = root / iteration_name(cfg.ckpt_step) if cfg.ckpt_step is not None else iteration_dir(root)
    if step_dir is None or not (step_dir / "meta.json").is_file():
        return  # the trainer's load names what is missing
    refusal = optimizer_state_refusal(root, step_dir)  # the trainer's rule, which it applies after the engines start
    if refusal:
        raise ValueError(refusal)
    if cfg.num_rollout is None:
        # --num-epoch: the run's length (which sizes the decay) is counted from the data by `resolve_config`, after
        # this preflight; the trainer builds its schedule from that count, so the check uses it too.
        from slime_app.resolve import resolve_config

        cfg = resolve_config(cfg, convert=False)[0]
    saved = step_dir / "scheduler.pt"
    try:
        state = torch.load(saved, weights_only=False)
    except Exception as e:  # noqa: BLE001 - a truncated file: torch raises RuntimeError/EOFError/UnpicklingError
        # torch's own error ("PytorchStreamReader failed ...") would end the CLI in a traceback, not one line.
        raise ValueError(
            f"--load {root}: {step_dir.name}/{saved.name} cannot be read ({type(e).__name__}: {first_sentence(e)}); "
            f"it was damaged after it was written (a partial copy, a crash before it reached the disk); "
            f"{_recovery_hint(root, exclude=step_dir.name)}"
        ) from None
    # As many parameter groups as the checkpoint's optimizer had: the group layout depends on the model (decayed
    # matrices, undecayed biases and norms), which only the trainer's own load checks; here the schedule's flags are.
    groups = max(1, len(state.get("base_lrs", ()))) if isinstance(state, dict) else 1
    optimizer = torch.optim.SGD(
        [{"params": [torch.nn.Parameter(torch.zeros(1))]} for _ in range(groups)], lr=float(cfg.lr)
    )
    try:
        load_scheduler_state(build_lr_scheduler(optimizer, cfg), state)
    except ValueError as e:
        raise ValueError(str(e).replace("--load:", f"--load {root}:", 1)) from None


def _check_critic_load(cfg: SlimeArgs) -> None:
    """The PPO critic's checkpoint: the actor's cheap checks, and for FSDP the value head's presence.

    The critic's trainer found a truncated `.distcp`, a damaged `meta.json` or another `--critic-lr` when it loaded,
    after Ray, the engines and the actor's model load: shard sizes, and for FSDP meta.json, the lr schedule and
    whether the model has a value head (an actor's checkpoint has none). The critic loads the actor's iteration
    (`slime_app.actor_critic.critic_resume_step`); `.metadata` and file sizes only, no tensor read. Megatron's
    torch_dist critic gets the shard check (its actor's checkpoint gets no more).

    Raises:
        ValueError: a shard lacking bytes, an unreadable `.metadata` or `meta.json` (names the file and the
            iterations to resume from), a schedule or AdamW flag that differs (names the critic's flags), the
            critic's folder lacks the actor's iteration, or (FSDP) its model has no value head. Each names
            `--critic-load`, or `--load` and the critic's folder in it.
    """
    kind = train_backend_spec(cfg).checkpoint_format
    if not cfg.use_critic or kind not in ("fsdp", "torch_dist"):
        return
    from slime_core.critic import critic_config

    critic = critic_config(cfg)
    if not critic.load or not os.path.isdir(critic.load):
        return
    from slime_app.actor_critic import critic_resume_step  # imports Ray: only when a critic checkpoint is there
    from slime_app.train_actor import pin_load_step

    step = critic_resume_step(pin_load_step(cfg))
    root = pathlib.Path(critic.load)
    try:
        step_dir = root / iteration_name(step) if step is not None else iteration_dir(root)
        if step_dir is not None:
            # The critic's iteration follows the actor's, so the hint names its folder's other iterations.
            hint = _recovery_hint(root, exclude=step_dir.name)
            check_shards("--load", root, checkpoint_state_dirs(root, kind, step), hint)
            if kind == "fsdp":
                _read_meta(root, step_dir)
                from slime_train_fsdp.checkpoint import check_critic_checkpoint

                # An actor's checkpoint given as the critic's: the critic's trainer refused it after Ray, the engines
                # and the actor's model load; its DCP `.metadata` says so now.
                check_critic_checkpoint("--load", root, step)
        if kind == "fsdp" and not cfg.no_load_optim:
            _check_fsdp_schedule(critic if step is None else critic.model_copy(update={"ckpt_step": step}), root)
    except ValueError as e:
        named = f"--critic-load {root}:" if cfg.critic_load else f"--load {cfg.load} (the critic's {root}):"
        message = str(e).replace(f"--load {root}:", named, 1)
        if cfg.critic_lr is not None:
            message = message.replace("--lr ", "--critic-lr ")
        if cfg.critic_lr_warmup_iters is not None:
            message = message.replace("--lr-warmup-iters (or --lr-warmup-fraction)", "--critic-lr-warmup-iters")
        raise ValueError(message) from None


def check_checkpoints(cfg: SlimeArgs) -> list[str]:
    """Checks `--load`, `--ref-load` and `--critic-load` against the backend and `--hf-checkpoint`'s architecture.

    Returns:
        One note per directory for the log.

    Raises:
        FileNotFoundError: `--ref-load` holds no checkpoint.
        ValueError: a checkpoint of a kind the backend cannot read (the message says what to use instead), or one
            whose architecture differs from `--hf-checkpoint`'s (every differing field of every checkpoint, each
            naming both flags).
    """
    notes: list[str] = []
    if cfg.load and cfg.debug_rollout_only:
        _warn_unread_load(cfg)
    elif cfg.load:
        _check_load(cfg, notes)
    if not cfg.debug_rollout_only:
        _check_critic_load(cfg)
    if cfg.ref_load:
        check_ref_load(cfg, notes)
    mismatches, compared = architecture_check(cfg)
    notes += compared
    if mismatches:
        raise ValueError(
            f"checkpoints of another architecture than --hf-checkpoint (the model is built from its config.json): "
            f"{grouped(mismatches)}"
        )
    notes += key_shapes_check(cfg)
    return notes
