"""The rollout a resumed run starts at, told from `--load`'s files on the driver, and a check of its data cursor.

The loop learns the start rollout from the trainer's `init`, after Ray, the engines and the model load; a damaged
`rollout/data_source_<id>.json` was found only then. The same id is known from the tracker: an FSDP save of rollout
`r` is `iter_{r+1}` (its `next_rollout_id`), a Megatron save is `iter_{r}` and resumes at `r + 1`.
"""

from __future__ import annotations

from slime_app.checkpoint_kinds import checkpoint_kind
from slime_core.checkpoint_dirs import iteration_name, pinned_iteration, save_root, tracker_step
from slime_core.config import SlimeArgs

__all__ = ["check_data_cursor", "check_replay_dumps", "start_rollout_id"]


def _loaded_step(cfg: SlimeArgs) -> int | None:
    """The iteration the trainer loads from `--load`: `--ckpt-step`, the iteration folder given, or the tracker's."""
    pinned = pinned_iteration(cfg.load, cfg.ckpt_step)
    return pinned if pinned is not None else tracker_step(cfg.load)


def start_rollout_id(cfg: SlimeArgs) -> int | None:
    """The rollout id the run's loop starts at, as `slime_app.loop.Run.build` will find it.

    Args:
        cfg: the validated config (`--load`, `--ckpt-step`, `--start-rollout-id`, `--debug-rollout-only`,
            `--finetune` among the Megatron flags).

    Returns:
        `--start-rollout-id` when given; 0 without a checkpoint to resume (no `--load`, a missing or empty one, HF
        weights, `--debug-rollout-only`, Megatron's `--finetune` or a converted `release` checkpoint); the
        checkpoint's next rollout for an FSDP or torch_dist one; None when its files do not tell (another backend's
        format, a damaged tracker: the checkpoint checks name those).
    """
    if cfg.start_rollout_id is not None:
        return cfg.start_rollout_id
    if not cfg.load or cfg.debug_rollout_only:
        return 0
    kind = checkpoint_kind(cfg.load)
    if kind in ("missing", "empty", "hf"):
        return 0
    step = _loaded_step(cfg)
    if cfg.ckpt_step is not None:  # that iteration's own files say, whatever the tracker names
        folder = save_root(cfg.load) / iteration_name(cfg.ckpt_step)
        kind = (
            "fsdp" if (folder / "meta.json").is_file() else "torch_dist" if (folder / ".metadata").is_file() else kind
        )
    if kind == "fsdp":
        return step  # iter_{next_rollout_id}
    if kind == "torch_dist":
        if cfg.megatron_flag("--finetune") or step is None:  # weights only, or `release`: rollout 0
            return 0
        return step + 1
    return None


def check_data_cursor(cfg: SlimeArgs) -> list[str]:
    """Reads the data cursor the resumed run restores (`<--load>/rollout/data_source_<start - 1>.json`) and checks it.

    Only the built-in data sources' cursors are checked (a `--data-source-path` plugin reads its own format); a run
    that draws no prompt (`--num-rollout 0`) or starts at rollout 0 reads none.

    Returns:
        A note naming the cursor checked, or none.

    Raises:
        ValueError: the cursor is not JSON or lacks a field the data source restores (message names `--load`, the
            file and the field).
    """
    from slime_rollout.data.cursor_file import check_cursor  # the rollout package's imports: only for a resume
    from slime_rollout.data.source import DEFAULT_DATA_SOURCES

    if not cfg.load or cfg.num_rollout == 0 or cfg.data_source_path not in DEFAULT_DATA_SOURCES:
        return []
    start = start_rollout_id(cfg)
    if not start:
        return []
    try:
        path = check_cursor(cfg.load, start - 1)
    except ValueError as e:
        raise ValueError(
            f"--load {cfg.load}: the run resumes at rollout {start}, whose data cursor cannot be restored: {e}; "
            "restore the file from a copy, or give --start-rollout-id to start the data from another saved cursor"
        ) from None
    return [f"--load {cfg.load}: data cursor {path} read, the prompts go on from rollout {start}"] if path else []


def check_replay_dumps(cfg: SlimeArgs) -> list[str]:
    """Every rollout this run replays from `--load-debug-rollout-data` must have its dump file (checked by name only).

    The rollout manager opened each when its rollout came, after Ray and the trainer started (and, at a missing later
    one, after hours of training).

    Returns:
        A note naming the dumps found, or none without the flag.

    Raises:
        FileNotFoundError: naming the flag, the missing rollout ids and the first missing file.
    """
    from slime_rollout.runtime.debug_dump import dump_path  # the rollout package's imports: only when replaying

    if not cfg.load_debug_rollout_data or not cfg.num_rollout:  # None: counted from --num-epoch later
        return []
    start = start_rollout_id(cfg)
    if start is None:
        return []
    ids = range(start, cfg.num_rollout)
    missing = [i for i in ids if not dump_path(cfg.load_debug_rollout_data, i).is_file()]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise FileNotFoundError(
            f"--load-debug-rollout-data {cfg.load_debug_rollout_data}: no dump for {len(missing)} of the {len(ids)} "
            f"rollouts this run replays ({start}..{cfg.num_rollout - 1}): rollout {shown} (first missing: "
            f"{dump_path(cfg.load_debug_rollout_data, missing[0])}); lower --num-rollout or dump those rollouts"
        )
    return [f"--load-debug-rollout-data: dumps of rollouts {start}..{cfg.num_rollout - 1} are there"]
