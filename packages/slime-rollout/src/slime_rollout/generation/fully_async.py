"""Fully-async rollout (original `slime.rollout.fully_async_rollout`): a background producer over the engine pool.

Use with `--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async` (the original's
path, served by slime-compat) or `slime_rollout.generation.fully_async.generate_rollout_fully_async`, on engines of
their own, or on the trainer's GPUs when neither side is swapped out (`--colocate --no-offload-train
--no-offload-rollout`). Flow::

    producer task (on the rollout loop; started by the first training rollout, lives until `stop_producer`)
      keeps up to `--sglang-server-concurrency` × engines groups in flight (the original's pool) while fewer than
      that many finished groups wait, and with --max-weight-staleness K while it holds fewer than (e + K - r)
      batches beyond what the waiting take still needs (e: the engines' weight version read at take r; r - 1 with
      --async; more would only be dropped); each new group is, in order: a recycled
      group, a group held at the checkpoint this run resumed from, or `data_source.get_samples(1)`
      a finished group with an ABORTED sample (a weight push pauses the engines with abort) is recycled:
          --partial-rollout: continued from its tokens (`metadata["off_policy_tokens"]` = the response tokens
          generated before the push); else restarted from its prompt
      the dynamic-sampling filter drops a group (counted), else it waits in the ready queue
    generate_rollout_fully_async(args, rollout_id, data_source)   (each training rollout)
      takes --rollout-batch-size ready groups at most --max-weight-staleness versions behind the trainer
      (`slime_rollout.generation.staleness`), oldest first, waiting for an older group still in flight rather than
      leaving it to become too stale (without a bound: in completion order); staler ones are dropped and counted
      (`rollout/stale_groups_dropped`); the producer's exception, if it died, is raised here.

Resume: `save_state` writes the data-source cursor and every group the producer holds (in flight, ready, recycled)
in one step of the loop, so nothing is drawn in between; a resumed run regenerates those held groups from their
prompts first (under the resumed weights), then continues the data source's stream. Generated tokens are not kept
across a restart.
"""

from __future__ import annotations

import copy
import json
import logging
import pathlib
import time
from typing import TYPE_CHECKING

from slime_core.checkpoint_dirs import save_root
from slime_core.dir_swap import write_text_atomic
from slime_core.protocols import DataSource
from slime_core.sample import Sample
from slime_core.sample_json import dumps_with_samples
from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime_rollout.data.cursor_file import keep_groups_of_size
from slime_rollout.generation.eval import eval_rollout
from slime_rollout.generation.fully_async_producer import FullyAsyncProducer
from slime_rollout.generation.rollout import _exclude_empty_responses, _report_env_failures, run_end_of_rollout_plugins
from slime_rollout.rewards.math import num_undecided
from slime_rollout.runtime import async_utils
from slime_rollout.runtime.goodput import rollout_token_fates
from slime_rollout.runtime.metrics import compute_rollout_metrics, flatten_groups

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "FullyAsyncProducer",
    "active_producer",
    "generate_rollout_fully_async",
    "load_state",
    "load_state_into_buffer",
    "save_state",
    "state_path",
    "stop_producer",
]

# ---- the process's producer (one per rollout manager, as the original's global worker) -----------

_producer: FullyAsyncProducer | None = None
_restored: list[list[Sample]] = []
_undecided_seen = 0  # `num_undecided()` when the previous rollout was taken


def active_producer() -> FullyAsyncProducer | None:
    """The running producer of this process, or None before the first fully-async rollout."""
    return _producer


def state_path(root: str | pathlib.Path, rollout_id: int) -> pathlib.Path:
    """Where the producer's held groups of checkpoint `rollout_id` live: `{root}/rollout/fully_async_{id}.json`."""
    return pathlib.Path(root) / "rollout" / f"fully_async_{rollout_id}.json"


async def _ensure_producer(args: SlimeArgs, data_source: DataSource, rollout_id: int) -> FullyAsyncProducer:
    global _producer, _restored
    if _producer is not None and _producer.data_source is not data_source:
        raise RuntimeError("fully-async rollout: a producer already runs on another data source; stop_producer() first")
    if _producer is None:
        _producer = FullyAsyncProducer(args, data_source, restored=_restored, version=rollout_id)
        _restored = []
        _producer.start()
        logger.info("fully-async rollout: producer started, up to %d groups in flight", _producer.capacity)
    return _producer


async def _collect(args: SlimeArgs, rollout_id: int, data_source: DataSource) -> RolloutFnTrainOutput:
    global _undecided_seen
    producer = await _ensure_producer(args, data_source, rollout_id)
    t0 = time.perf_counter()
    data, metrics = await producer.take(rollout_id, args.rollout_batch_size, args.max_weight_staleness)
    wait = time.perf_counter() - t0
    discarded, drops, reward_seconds, wall = producer.take_discarded()
    data.sort(key=lambda g: flatten_groups([g])[0].index or 0)
    _exclude_empty_responses(args, rollout_id, data)
    _report_env_failures(rollout_id, data)
    all_groups = [*data, *discarded["filtered"], *discarded["stale"]]
    await run_end_of_rollout_plugins(args, rollout_id, data, all_groups, data_source)
    # Generation overlaps training: the rollout's wall time is the time since the previous one was taken.
    out = compute_rollout_metrics(args, data, rollout_time=wall, drop_counts=drops)
    out.update(rollout_token_fates(data, discarded))
    out.update(metrics)
    out["perf/reward_time"] = reward_seconds
    out["perf/fully_async_wait_time"] = wait
    # Math gradings without a verdict since the previous rollout was taken (as the default rollout reports them).
    now = num_undecided()
    out["rollout/num_reward_undecided"] = float(now - _undecided_seen)
    _undecided_seen = now
    logger.info(
        "fully-async rollout %d: %d groups in %.1fs (waited %.1fs), staleness max %s, %d stale dropped, %d ready",
        rollout_id, len(data), wall, wait, metrics.get("rollout/staleness_max"),
        int(metrics["rollout/stale_groups_dropped"]), producer.num_ready,
    )  # fmt: skip
    return RolloutFnTrainOutput(samples=data, metrics=out)


def generate_rollout_fully_async(
    args: SlimeArgs, rollout_id: int, data_source: DataSource, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """The fully-async `--rollout-function-path` (original signature).

    Args:
        args: the plugin view; reads `rollout_batch_size`, `max_weight_staleness`, `rollout_sample_filter_path`,
            `rollout_all_samples_process_path` (+ what `FullyAsyncProducer` reads).
        rollout_id: the training rollout; the trainer holds weight version `rollout_id` when it trains it.
        data_source: the prompt source, read by the producer.
        evaluation: run the eval datasets (`slime_rollout.generation.eval.eval_rollout`) on the same engines while
            the producer keeps generating (the original refuses evaluation here).

    Returns:
        `rollout_batch_size` groups sorted by sample index with `rollout/*` metrics (`rollout/staleness_*`
        among them), or `RolloutFnEvalOutput` when `evaluation`.

    Raises:
        RuntimeError: the producer died (its exception chained).
    """
    if evaluation:
        return eval_rollout(args, rollout_id)
    return async_utils.run(_collect(args, rollout_id, data_source))


# _collect computes the rollout's metrics (eval_rollout its own): run_rollout must not recompute them.
generate_rollout_fully_async.computes_metrics = True  # type: ignore[attr-defined]


def stop_producer() -> None:
    """Stops this process's producer (teardown, before the engines stop); a no-op without one."""
    global _producer
    if _producer is not None:
        producer, _producer = _producer, None
        async_utils.run(producer.stop())


async def _write_state(args: SlimeArgs, data_source: DataSource, rollout_id: int) -> int:
    # No await in here: the cursor and the held groups are read in one step of the loop, so the producer
    # cannot draw a group in between.
    held = _producer.held_prompts() if _producer is not None else [copy.deepcopy(g) for g in _restored]
    data_source.save(rollout_id)
    payload = {"held": [[s.to_dict() for s in g] for g in held]}
    text = dumps_with_samples(payload, (s for g in held for s in g), what="--save: the fully-async held groups")
    write_text_atomic(state_path(args.save, rollout_id), text)
    return len(held)


def save_state(args: SlimeArgs, data_source: DataSource, rollout_id: int) -> None:
    """Checkpoints the prompt stream: the data-source cursor and the producer's held groups (no-op without --save).

    Raises:
        TypeError: a held sample holds a value JSON cannot store.
    """
    if not args.save:
        return
    num_held = async_utils.run(_write_state(args, data_source, rollout_id))
    logger.info("fully-async rollout: saved the cursor and %d held group(s) at rollout %d", num_held, rollout_id)


def _read_held(args: SlimeArgs, rollout_id: int) -> tuple[pathlib.Path | None, list[list[Sample]]]:
    """The held groups of checkpoint `rollout_id` under `--load` (those of another group size dropped), and the file.

    Raises:
        ValueError: the file exists but is not a valid state.
    """
    if not args.load:
        return None, []
    path = state_path(save_root(args.load), rollout_id)  # `--load <save>/iter_XXXXXXX`: beside it
    if not path.exists():
        return None, []
    try:
        held = [[Sample.from_dict(d) for d in g] for g in json.loads(path.read_text(encoding="utf-8"))["held"]]
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: bad fully-async rollout state ({e})") from e
    # Restored groups skip the producer's size check: one of another --n-samples-per-prompt was trained as it was.
    return path, keep_groups_of_size(held, args.n_samples_per_prompt, path)


def load_state(args: SlimeArgs, rollout_id: int) -> int:
    """Reads the held groups of checkpoint `rollout_id` under `--load`; the next producer generates them first.

    Call after the data source restored its cursor (`data_source.load(rollout_id)`).

    Returns:
        The number of groups restored (0 without `--load` or when the checkpoint holds none).

    Raises:
        ValueError: the file exists but is not a valid state.
    """
    global _restored
    path, _restored = _read_held(args, rollout_id)
    if path is None:
        if args.load:
            logger.info("fully-async rollout: no held groups at %s (a checkpoint of another rollout function)",
                        state_path(save_root(args.load), rollout_id))  # fmt: skip
        return 0
    logger.info("fully-async rollout: %d held group(s) from %s are generated first", len(_restored), path)
    return len(_restored)


def load_state_into_buffer(args: SlimeArgs, data_source: DataSource, rollout_id: int) -> int:
    """A fully-async checkpoint resumed with another rollout function: its held groups go into the data source's buffer.

    Their prompts were drawn before the save (the cursor is past them), so a resume without the fully-async rollout
    function, which never read the file, lost them without a word. `data_source.add_samples` puts them in the
    buffer the default rollout serves first (after groups already buffered), as the fully-async producer would.
    Call after `data_source.load(rollout_id)`.

    Returns:
        The number of groups handed over (0 without `--load` or a held-groups file).

    Raises:
        ValueError: the file is not a valid state, or the data source keeps no buffer (names the file, the count
            and the flags that resume it).
    """
    path, held = _read_held(args, rollout_id)
    if not held:
        return 0
    try:
        data_source.add_samples(held)
    except (RuntimeError, NotImplementedError) as e:
        raise ValueError(
            f"{path}: the checkpoint holds {len(held)} group(s) the fully-async rollout had drawn and not trained, "
            f"which --data-source-path {args.data_source_path} cannot buffer ({e}); resume with "
            "--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async, or a data source "
            "with a buffer "
            "(the default RolloutDataSourceWithBuffer)"
        ) from e
    logger.info(
        "%s: %d group(s) the fully-async rollout had drawn and not trained go into the data source's buffer (this "
        "run's --rollout-function-path is another), served before new prompts", path, len(held),
    )  # fmt: skip
    return len(held)
