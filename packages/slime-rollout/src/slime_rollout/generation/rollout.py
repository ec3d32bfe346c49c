"""The default rollout (original `slime.rollout.sglang_rollout.generate_rollout`).

Flow of one training rollout::

    data_source.get_samples(over_sampling_batch_size)      # groups of n_samples_per_prompt
      └─ one asyncio task per group: generate → sample hooks → reward (per sample or --group-rm)
    as groups finish: dynamic filter (--dynamic-sampling-filter-path) → accept until rollout_batch_size
    top up with more groups while accepted + in flight < rollout_batch_size
    then: abort the surplus on the engines, drain every task (nothing left running), and with
    --partial-rollout return the unfinished groups to the data source buffer.

Concurrency is bounded by a semaphore of `sglang_server_concurrency × number of engines` requests.
`generate_rollout` is the synchronous entry point; `generate_rollout_async` can be awaited from a
running loop. One group's generate → hooks → reward is `slime_rollout.generation.group_rollout`.

The `args` these functions take is the plugin view of the run (`slime_core.config.PluginArgs`: the frozen
config plus the engine addresses); it is handed unchanged to the rollout's plugins (data source, generate,
reward, filters, hooks), which have the original slime signatures.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import numbers
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slime_core.error_text import preview
from slime_core.protocols import DataSource
from slime_core.sample import Sample, Status
from slime_rollout.base_types import (
    RolloutFnEvalOutput,
    RolloutFnTrainOutput,
    check_fan_out_rollout_ids,
    wrap_rollout_output,
)
from slime_rollout.generation.eval import dataset_metrics, eval_rollout
from slime_rollout.generation.filters import call_dynamic_filter, should_drop_dynamic_filter_output
from slime_rollout.generation.generate import abort_all
from slime_rollout.generation.group_rollout import (
    RolloutState,
    checked_groups,
    generate_and_rm,
    generate_and_rm_group,
    num_engines,
)
from slime_rollout.generation.opd import score_teacher
from slime_rollout.generation.sampling_rounds import SamplingRounds, drop_reasons
from slime_rollout.plugins import load_function
from slime_rollout.rewards.math import num_undecided
from slime_rollout.runtime import async_utils, debug_dump, log_hooks
from slime_rollout.runtime.deadlines import (
    call_plugin_with_deadline,
    call_plugin_with_deadline_sync,
    plugin_bounds,
    rollout_function_bounds,
)
from slime_rollout.runtime.goodput import rollout_token_fates
from slime_rollout.runtime.metrics import compute_rollout_metrics, flatten_groups

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "RolloutState",
    "create_data_source",
    "generate_and_rm",
    "generate_and_rm_group",
    "generate_rollout",
    "generate_rollout_async",
    "num_engines",
    "run_rollout",
]

_ABORT_RETRY_S = 3.0


def _group_sort_key(group: list[Any]) -> int:
    index = flatten_groups([group])[0].index
    return index if index is not None else 0


def _has_aborted(group: list[Any]) -> bool:
    return any(s.status is Status.ABORTED for s in flatten_groups([group]))


def _mark_partial(group: list[Sample], rollout_id: int) -> list[Sample]:
    """`group`, its samples holding a response stamped `metadata["start_rollout_id"]` (first rollout that generated).

    As the original's `abort` does for every group going back to the buffer; applied to the groups the engine aborted
    during the rollout too (they missed it: a partial response with no start rollout).
    """
    for sample in group:
        if sample.response_length > 0 and "start_rollout_id" not in sample.metadata:
            sample.metadata["start_rollout_id"] = rollout_id
    return group


async def _abort_or_cancel(args: SlimeArgs, pending: set[asyncio.Task[Any]]) -> Exception | None:
    """Aborts the engines' requests; when the abort itself fails (a dead engine), cancels `pending` instead.

    Returns:
        The abort's error (raised by the caller once every task is drained), or None.
    """
    try:
        await abort_all(args)
    except Exception as e:  # noqa: BLE001 - returned to the caller, which raises it after draining
        # The engines cannot be told to stop: stop waiting on them (a cancelled request closes its connection,
        # which ends it on SGLang too), or the drain below would wait on each task's own retries.
        for task in pending:
            task.cancel()
        return e
    return None


async def _abort_and_drain(
    args: SlimeArgs,
    state: RolloutState,
    pending: set[asyncio.Task[Any]],
    rollout_id: int,
    dropped: list[list[Any]] | None = None,
) -> list[list[Sample]]:
    """Aborts in-flight requests, waits for every task, and returns the groups to re-queue (partial rollout).

    The groups not re-queued are appended to `dropped` (their tokens are thrown away: goodput accounting).
    """
    state.aborted = True
    leftovers: list[list[Sample]] = []
    dropped = [] if dropped is None else dropped
    abort_error = await _abort_or_cancel(args, pending) if pending else None
    error: BaseException | None = None
    partial = args.partial_rollout
    while pending:
        done, pending = await asyncio.wait(pending, timeout=_ABORT_RETRY_S)
        if not done and pending and abort_error is None:
            # A request that reached the engine after the abort: abort again (original retries every 3 s).
            abort_error = await _abort_or_cancel(args, pending)
        for task in done:
            if task.cancelled():  # cut short after a failed abort: its group goes with the abort's error
                continue
            if task.exception() is not None:
                # Keep draining so nothing is left running; raise the first error afterwards.
                error = error or task.exception()
                continue
            group = task.result()
            if not partial:
                dropped.append(group)
                continue
            if any(isinstance(item, list) for item in group):
                logger.warning("partial rollout: dropping a fanned-out group (custom generate returned a list)")
                dropped.append(group)
                continue
            leftovers.append(_mark_partial(group, rollout_id))
    error = error or abort_error
    if error is not None:
        raise error
    return leftovers


def _exclude_empty_responses(args: SlimeArgs, rollout_id: int, groups: list[list[Any]]) -> int:
    """Marks samples that came back with no response token as not trained on, and says so (never silently).

    A custom generate function may return a sample without generating anything (the engine also gives nothing
    when the prompt leaves no room in the context). Such a sample keeps its place in its group (its reward takes
    part in the group's normalization) but has nothing to train on: `remove_sample` makes that explicit. The count
    is the `rollout/num_empty_responses` metric.

    Returns:
        The number of empty responses.
    """
    empty = [s for s in flatten_groups(groups) if s.response_length == 0 and s.status is not Status.ABORTED]
    for sample in empty:
        sample.remove_sample = True
    if empty:
        source = args.custom_generate_function_path or "the default generate function"
        logger.warning(
            "rollout %d: %d samples have an empty response (from %s; samples %s); they are not trained on",
            rollout_id,
            len(empty),
            source,
            [s.index for s in empty[:8]],
        )
    return len(empty)


def _report_env_failures(rollout_id: int, groups: list[list[Any]]) -> int:
    """One log line per rollout for the samples an env's `step` failed (FAILED, removed; `metadata["env_error"]`).

    Each failure is also one warning where it happens (`slime_rollout.generation.multi_turn`); the count is the
    `rollout/env_failed_samples` metric.

    Returns:
        The number of such samples among `groups`.
    """
    failed = [s for s in flatten_groups(groups) if s.status is Status.FAILED and "env_error" in s.metadata]
    if failed:
        errors = collections.Counter(s.metadata["env_error"].split(":", 1)[0] for s in failed)
        logger.warning(
            "rollout %d: %d of %d samples failed in their env and are not trained on (samples %s; %s)",
            rollout_id,
            len(failed),
            len(flatten_groups(groups)),
            [s.index for s in failed[:8]],
            ", ".join(f"{n} {kind}" for kind, n in errors.most_common()),
        )
    return len(failed)


async def generate_rollout_async(
    args: SlimeArgs, rollout_id: int, data_source: DataSource | Callable[[int], list[list[Sample]]]
) -> tuple[RolloutFnTrainOutput, list[list[Sample]]]:
    """One training rollout on the running loop.

    Args:
        args: the plugin view; reads `rollout_batch_size`, `n_samples_per_prompt`, `over_sampling_batch_size`,
            `dynamic_sampling_filter_path`, `dynamic_sampling_max_empty_rounds`, `partial_rollout`,
            `rollout_sample_filter_path`, `rollout_all_samples_process_path` (+ what generate, rewards and metrics
            read).
        rollout_id: id of this rollout.
        data_source: a `slime_core.protocols.DataSource`, or the original's `Callable[[int], list[list[Sample]]]`
            (its `generate_rollout` passes `data_source.get_samples`, and custom rollout functions copied from it
            do); `--rollout-all-samples-process-path` gets that callable (a data source's `get_samples`), as there.

    Returns:
        `(output, leftovers)`: `rollout_batch_size` accepted groups sorted by sample index with metrics,
        and the unfinished groups to return to the data source (empty without `--partial-rollout`).

    Raises:
        ValueError: a group of the wrong size or a misconfigured batch size.
        TypeError: `data_source` is neither a data source nor a callable.
        RuntimeError: the data source ran dry, or `--dynamic-sampling-max-empty-rounds` refills in a row kept
            no group.
    """
    take, source_name = _sample_getter(data_source)
    start = time.perf_counter()
    undecided_before = num_undecided()
    target, over, n = args.rollout_batch_size, args.over_sampling_batch_size, args.n_samples_per_prompt
    if over < target:  # validation ensures it; the plugin view is writable, so check again
        raise ValueError(f"--over-sampling-batch-size {over} must be >= --rollout-batch-size {target}")
    filter_path = args.dynamic_sampling_filter_path
    filter_fn = load_function(filter_path, flag="--dynamic-sampling-filter-path") if filter_path else None
    state = RolloutState.create(args, rollout_id=rollout_id)

    pending: set[asyncio.Task[Any]] = set()
    data: list[list[Any]] = []
    all_groups: list[list[Any]] = []
    requeue: list[list[Sample]] = []
    drops: collections.Counter[str] = collections.Counter()
    rounds = SamplingRounds(args, rollout_id, target)
    discarded: dict[str, list[list[Any]]] = {"filtered": [], "aborted": [], "surplus": []}  # goodput accounting
    submitted = 0
    order: dict[asyncio.Task[Any], int] = {}
    done: set[asyncio.Task[Any]] = set()
    try:
        while len(data) < target:
            while len(data) + len(pending) < target:
                rounds.next_round(len(data), drops, len(requeue))
                # A custom data source or --buffer-filter-path is the user's sync code: bounded, off the loop.
                what = f"{source_name}({over}) (rollout {rollout_id})"
                groups = await call_plugin_with_deadline(take, over, what=what, **plugin_bounds(args))
                if not groups:
                    raise RuntimeError(
                        f"rollout {rollout_id}: {what} returned no groups, {len(data)}/{target} kept "
                        f"(dropped: {drop_reasons(drops, len(requeue))}); the data source ran dry"
                    )
                groups = checked_groups(groups, what, n)
                for g in groups:
                    task = asyncio.create_task(generate_and_rm_group(args, g, state, prompt_position=submitted))
                    order[task] = submitted
                    pending.add(task)
                    submitted += 1
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # Groups that finished together are decided in submission order (a set's order is arbitrary).
            for position, task in enumerate(sorted(done, key=order.pop)):
                group = task.result()
                all_groups.append(group)
                if len(group) != n:
                    raise ValueError(f"group of {len(group)} samples, expected --n-samples-per-prompt {n}")
                if _has_aborted(group):
                    # Aborted by the engine itself (e.g. around a weight update), not by us.
                    if args.partial_rollout and not any(isinstance(x, list) for x in group):
                        requeue.append(_mark_partial(group, rollout_id))
                    else:
                        drops["aborted"] += 1
                        discarded["aborted"].append(group)
                    continue
                if filter_fn is not None:
                    # A filter sees the group's samples; a fan-out group (entries that are lists) is flattened,
                    # so plugins written for `list[Sample]` work on it too.
                    verdict = await call_dynamic_filter(args, filter_fn, group)
                    # Groups that could still fill the batch: accepted, generating, and the undecided ones of `done`.
                    candidates = len(data) + len(pending) + len(done) - position
                    if should_drop_dynamic_filter_output(
                        verdict, remaining_batch_size=candidates, target_data_size=target
                    ):
                        drops[verdict.reason or "filtered"] += 1
                        discarded["filtered"].append(group)
                        continue
                if len(data) < target:
                    data.append(group)
                else:
                    discarded["surplus"].append(group)
    except BaseException as error:
        # Groups that finished with the one that raised: their errors are this one's siblings, not news (unread,
        # asyncio logged each at garbage collection as "Task exception was never retrieved", in a later test or step).
        for task in done:
            if not task.cancelled():
                task.exception()
        # Also on errors: never leave requests running on the engines or tasks on the loop. The cleanup meets the
        # same broken engine (its abort failed after retries) and must not replace the error that explains it.
        try:
            await _abort_and_drain(args, state, pending, rollout_id, discarded["aborted"])
        except Exception as cleanup_error:  # noqa: BLE001 - reported, and the first error is raised
            logger.warning("rollout %d: the clean-up after %s failed too: %s", rollout_id, type(error).__name__,
                           " ".join(str(cleanup_error).split())[:300])  # fmt: skip
        raise
    leftovers = await _abort_and_drain(args, state, pending, rollout_id, discarded["aborted"])
    # Deterministic buffer order (by sample index) whatever order the aborted tasks finished in.
    leftovers = sorted(requeue + leftovers, key=_group_sort_key)

    data.sort(key=_group_sort_key)
    _exclude_empty_responses(args, rollout_id, data)
    _report_env_failures(rollout_id, data)
    await run_end_of_rollout_plugins(args, rollout_id, data, all_groups, data_source)
    metrics = compute_rollout_metrics(args, data, rollout_time=time.perf_counter() - start, drop_counts=drops)
    metrics.update(rollout_token_fates(data, discarded, requeued=leftovers))
    metrics["perf/reward_time"] = state.reward_seconds
    # Math gradings counted as wrong for want of a verdict (timed out, too costly, a crashed worker), each also
    # one warning: a rising count means the grading budget or --rm-num-workers does not fit the answers.
    metrics["rollout/num_reward_undecided"] = float(num_undecided() - undecided_before)
    logger.info(
        "rollout %d: %d groups accepted, %d dropped, %d re-queued in %.1fs",
        rollout_id,
        len(data),
        sum(drops.values()),
        len(leftovers),
        metrics["perf/rollout_time"],
    )
    return RolloutFnTrainOutput(samples=data, metrics=metrics), leftovers


def _sample_getter(data_source: Any) -> tuple[Callable[[int], Any], str]:
    """`(get_samples, its name in messages)` of a data source, or of the original's bare `n -> groups` callable.

    Raises:
        TypeError: neither (names what was given).
    """
    if callable(getattr(data_source, "get_samples", None)):
        return data_source.get_samples, f"{type(data_source).__name__}.get_samples"
    if callable(data_source):
        return data_source, getattr(data_source, "__qualname__", type(data_source).__name__)
    raise TypeError(
        f"generate_rollout_async: the data source must be a DataSource (get_samples(n)) or a callable n -> groups "
        f"(the original passes data_source.get_samples), got {type(data_source).__name__} {preview(data_source)}"
    )


async def run_end_of_rollout_plugins(
    args: SlimeArgs,
    rollout_id: int,
    data: list[list[Any]],
    all_groups: list[list[Any]],
    data_source: DataSource | Callable[[int], list[list[Sample]]],
) -> None:
    """Runs the end-of-rollout plugins, each bounded by `--plugin-timeout-secs` in a worker thread.

    `--rollout-sample-filter-path` is `fn(args, data)`, `--rollout-all-samples-process-path`
    `fn(args, all_groups, data_source)`, both with the groups sorted by sample index (`all_groups`: every group that
    finished, kept, filtered out, aborted or surplus; it was in finishing order, the original sorts it). The
    `data_source` it gets is the callable `n -> groups` (a data source's bound `get_samples`), as the original's
    `generate_rollout` hands it on (the hook got the data source object here). They are
    sync user code: called on the event loop, one that never returned froze the run with no word. A sample filter
    that returns something (a filtered list) is warned about: only `remove_sample` marks are read.

    Raises:
        DeadlineExceeded: one ran past `--plugin-timeout-secs` (the message names it and the rollout).
        Exception: what one raised.
    """
    all_groups = sorted(all_groups, key=_group_sort_key)  # as the original hands them over
    if args.rollout_sample_filter_path:
        path = args.rollout_sample_filter_path
        fn = load_function(path, flag="--rollout-sample-filter-path")
        what = f"--rollout-sample-filter-path {path} (rollout {rollout_id})"
        returned = await call_plugin_with_deadline(fn, args, data, what=what, **plugin_bounds(args))
        if returned is not None:  # `return [g for g in data if ...]` filtered nothing, silently
            samples = flatten_groups(data)
            logger.warning(
                "rollout %d: --rollout-sample-filter-path %s returned a %s, which is not read (as in the original): "
                "it filters by setting sample.remove_sample = True in place (%d of %d samples are marked)",
                rollout_id, path, type(returned).__name__, sum(bool(s.remove_sample) for s in samples), len(samples),
            )  # fmt: skip
    if args.rollout_all_samples_process_path:
        path = args.rollout_all_samples_process_path
        fn = load_function(path, flag="--rollout-all-samples-process-path")
        what = f"--rollout-all-samples-process-path {path} (rollout {rollout_id})"
        take, _ = _sample_getter(data_source)
        await call_plugin_with_deadline(fn, args, all_groups, take, what=what, **plugin_bounds(args))


def generate_rollout(
    args: SlimeArgs, rollout_id: int, data_source: DataSource, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """The default `--rollout-function-path` (original signature).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`).
        rollout_id: id of this rollout.
        data_source: the prompt source; unfinished groups go back into it (`add_samples`).
        evaluation: run the eval datasets instead (`slime_rollout.generation.eval.eval_rollout`).

    Returns:
        `RolloutFnTrainOutput`, or `RolloutFnEvalOutput` when `evaluation`.
    """
    if evaluation:
        return eval_rollout(args, rollout_id)
    output, leftovers = async_utils.run(generate_rollout_async(args, rollout_id, data_source))
    if leftovers:
        data_source.add_samples(leftovers)
    return output


# run_rollout computes the metrics of other functions' outputs; these built-ins compute their own (read there).
generate_rollout.computes_metrics = True  # type: ignore[attr-defined]


def create_data_source(args: SlimeArgs) -> DataSource:
    """Instantiates `--data-source-path` (default `RolloutDataSourceWithBuffer`) as `cls(args)`.

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`), kept by the data source.
    """
    return load_function(args.data_source_path, flag="--data-source-path")(args)


def _eval_samples(data: Any, what: str) -> list[Sample]:
    """The samples of an eval output `{name: {"rewards", "truncated", "samples"}}`, checked."""
    out: list[Sample] = []
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise TypeError(f"{what} returned {type(entry).__name__} for dataset {name!r}, not a dict of rewards, "
                            "truncated and samples")  # fmt: skip
        out += flatten_groups(entry.get("samples", []), what, f"[{name!r}]['samples']")
    return out


def _eval_metrics(args: SlimeArgs, data: dict[str, Any], what: str) -> dict[str, float]:
    """`eval/*` metrics of a custom eval function's output (`eval.dataset_metrics` per dataset).

    Raises:
        TypeError: a dataset without a list of numeric `rewards` (names `what` and the dataset).
    """
    metrics: dict[str, float] = {}
    for name, entry in data.items():
        rewards = entry.get("rewards")
        if not isinstance(rewards, list | tuple) or not all(
            isinstance(r, numbers.Real) and math.isfinite(r) for r in rewards
        ):
            raise TypeError(f"{what} returned {preview(rewards)} as the rewards of eval dataset {name!r}, not a list "
                            "of finite numbers")  # fmt: skip
        if not rewards:
            logger.warning("%s: eval dataset %r has no rewards; it has no eval/%s metric this time", what, name, name)
            continue
        metrics.update(dataset_metrics(args, name, dict(entry, rewards=list(rewards)), args.n_samples_per_eval_prompt))
    return metrics


def run_rollout(
    args: SlimeArgs, rollout_id: int, data_source: DataSource | None, *, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """What the rollout manager calls: the configured rollout function plus debug dump/replay.

    `--load-debug-rollout-data` replays a dump instead of generating (training rollouts only; only the
    `--custom-rollout-log-function-path` metrics are reported for it, as in the original);
    `--rollout-function-path` / `--eval-function-path` replace the rollout function, which runs in a worker thread
    under `--rollout-timeout-secs` (the log functions under `--plugin-timeout-secs`); legacy bare return
    values are wrapped; `--save-debug-rollout-data` dumps the result; `--custom-rollout-log-function-path` /
    `--custom-eval-rollout-log-function-path` see the result and decide its metrics (`slime_rollout.runtime.log_hooks`).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`), passed to the rollout function and the hooks.
        rollout_id: id of this rollout (of the training rollout an eval follows).
        data_source: the prompt source (None when the rollout function needs none).
        evaluation: run the eval rollout.

    Returns:
        The rollout function's output (wrapped) with the metrics the log hooks decided.

    Raises:
        DeadlineExceeded: the rollout function ran past `--rollout-timeout-secs`, or a log function past
            `--plugin-timeout-secs` (the message names its flag, import path and the rollout).
        slime_core.plugins.PluginError: a function that cannot be imported.
        Exception: what the rollout function or a log function raised.
    """
    if not evaluation and args.load_debug_rollout_data:
        start = time.perf_counter()
        samples = debug_dump.load_debug_rollout_data(args, rollout_id)
        # As the original's log_rollout_data: the custom log function sees a replayed rollout too (with no metrics of
        # the rollout's own; it was skipped here, so a replay for the sake of its metrics logged none).
        metrics = log_hooks.apply_rollout_log_function(args, rollout_id, samples, None, time.perf_counter() - start)
        return RolloutFnTrainOutput(samples=debug_dump.regroup(samples), metrics=metrics)
    path, flag = args.rollout_function_path, "--rollout-function-path"
    # The plugin view holds the rollout function's path for an unset --eval-function-path; name the flag given.
    if evaluation and args.eval_function_path and args.eval_function_path != args.rollout_function_path:
        path, flag = args.eval_function_path, "--eval-function-path"
    fn = load_function(path, flag=flag)
    start = time.perf_counter()
    # Bounded like every other user call: a rollout function that never returns failed nothing and logged nothing.
    what = f"{flag} {path} ({'eval' if evaluation else 'rollout'} {rollout_id})"
    value = call_plugin_with_deadline_sync(
        fn, args, rollout_id, data_source, evaluation=evaluation, what=what, **rollout_function_bounds(args)
    )
    output = wrap_rollout_output(value, evaluation=evaluation, what=what)
    rollout_time = time.perf_counter() - start
    # The built-ins (marked `computes_metrics`) compute their metrics themselves; another function's are computed from
    # its output as the original's log_rollout_data / log_eval_rollout_data do: they were left out, so a custom
    # --eval-function-path returning {name: {"rewards", ...}} logged no eval/ curve. As there, a computed entry wins
    # over the function's own of the same name (`log_dict = {**extra}; log_dict |= computed`): a function's
    # `eval/<name>` or `rollout/response_len/mean` replaced the original's value under the original's name.
    own = getattr(fn, "computes_metrics", False)
    if isinstance(output, RolloutFnEvalOutput):
        samples = _eval_samples(output.data, what)
        if not own:
            output.metrics = {**(output.metrics or {}), **_eval_metrics(args, output.data, what)}
        output.metrics = log_hooks.apply_eval_log_function(args, rollout_id, output.data, output.metrics)
    else:
        samples = flatten_groups(output.samples, what, "samples")
        check_fan_out_rollout_ids(output.samples, what)
        # --opd-type sglang: samples a custom rollout function (or --group-rm) left without teacher log-probs.
        async_utils.run(score_teacher(args, samples))
        if not own:
            defaults = compute_rollout_metrics(args, output.samples, rollout_time=rollout_time)
            output.metrics = {**(output.metrics or {}), **defaults}
        output.metrics = log_hooks.apply_rollout_log_function(args, rollout_id, samples, output.metrics, rollout_time)
    if args.save_debug_rollout_data:
        debug_dump.save_debug_rollout_data(args, rollout_id, samples, evaluation=evaluation)
    return output
