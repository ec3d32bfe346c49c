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
running loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
import uuid
from typing import Any

from slime_core.sample import Sample, Status
from slime_rollout import async_utils
from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput, wrap_rollout_output
from slime_rollout.filters import normalize_filter_output
from slime_rollout.generate import abort_all, build_sampling_params
from slime_rollout.generate import generate as default_generate
from slime_rollout.metrics import compute_rollout_metrics, flatten_groups
from slime_rollout.plugins import accepts_kwarg, call_maybe_async, load_function
from slime_rollout.rewards import async_rm, batched_async_rm

logger = logging.getLogger(__name__)

__all__ = [
    "RolloutState",
    "create_data_source",
    "generate_and_rm",
    "generate_and_rm_group",
    "generate_rollout",
    "generate_rollout_async",
    "run_rollout",
]

_ABORT_RETRY_S = 3.0


def num_engines(args: Any) -> int:
    """Number of engines behind the client (`rollout_num_gpus // rollout_num_gpus_per_engine`, at least 1)."""
    urls = getattr(args, "rollout_engine_urls", None)
    if urls:
        return len(urls)
    gpus = getattr(args, "rollout_num_gpus", None) or 0
    per_engine = getattr(args, "rollout_num_gpus_per_engine", 1) or 1
    return max(int(gpus) // int(per_engine), 1)


@dataclasses.dataclass(kw_only=True)
class RolloutState:
    """Per-rollout shared state of the generate tasks (created inside the running loop).

    Attributes:
        semaphore: bounds concurrent engine requests.
        sampling_params: the base SGLang sampling params.
        aborted: set once the rollout has enough groups; tasks not yet started return ABORTED samples.
        evaluation: eval rollout (eval sampling params, no sample abort).
        rollout_id: id of the rollout (passed to hooks).
    """

    semaphore: asyncio.Semaphore
    sampling_params: dict[str, Any]
    aborted: bool = False
    evaluation: bool = False
    rollout_id: int | None = None

    @classmethod
    def create(cls, args: Any, *, rollout_id: int | None, evaluation: bool = False) -> RolloutState:
        """Builds the state from `sglang_server_concurrency`, the engine count and the sampling flags."""
        concurrency = int(getattr(args, "sglang_server_concurrency", 512)) * num_engines(args)
        return cls(
            semaphore=asyncio.Semaphore(concurrency),
            sampling_params=build_sampling_params(args, evaluation=evaluation),
            evaluation=evaluation,
            rollout_id=rollout_id,
        )


def _generate_fn(args: Any, sample: Sample) -> Any:
    if sample.generate_function_path:
        return load_function(sample.generate_function_path, flag="sample.generate_function_path")
    path = getattr(args, "custom_generate_function_path", None)
    return load_function(path, flag="--custom-generate-function-path") if path else default_generate


async def _run_hooks(args: Any, sample: Sample, state: RolloutState) -> Sample:
    for path in getattr(args, "rollout_sample_hook_path", None) or []:
        hook = load_function(path, flag="--rollout-sample-hook-path")
        out = await call_maybe_async(hook, args, sample, evaluation=state.evaluation, rollout_id=state.rollout_id)
        if out is not None:
            sample = out
    return sample


async def generate_and_rm(
    args: Any, sample: Sample, state: RolloutState, sampling_params: dict[str, Any] | None = None
) -> Sample | list[Sample]:
    """Generates one sample (unless already finished), runs the sample hooks and scores it.

    Args:
        args: run config.
        sample: the sample; finished (COMPLETED/TRUNCATED) samples from the partial-rollout buffer
            are not generated again.
        state: the rollout's shared state.
        sampling_params: overrides `state.sampling_params` (eval datasets).

    Returns:
        The sample, or the list a custom generate function returned (fan-out). Rewards are set unless
        `--group-rm` is on or the sample was ABORTED.
    """
    params = sampling_params if sampling_params is not None else state.sampling_params
    result: Sample | list[Sample] = sample
    if not (sample.status in (Status.COMPLETED, Status.TRUNCATED) and sample.response_length > 0):
        async with state.semaphore:
            if state.aborted:
                sample.status = Status.ABORTED
                return sample
            fn = _generate_fn(args, sample)
            kwargs = {"evaluation": state.evaluation} if accepts_kwarg(fn, "evaluation") else {}
            result = await fn(args, sample, params, **kwargs)
    if isinstance(result, list):
        result = [await _run_hooks(args, s, state) for s in result]
    else:
        result = await _run_hooks(args, result, state)
    if getattr(args, "group_rm", False) and not state.evaluation:
        return result
    todo = [s for s in (result if isinstance(result, list) else [result]) if s.status is not Status.ABORTED]
    todo = [s for s in todo if s.reward is None]
    if todo:
        rewards = await batched_async_rm(args, todo) if isinstance(result, list) else [await async_rm(args, todo[0])]
        for s, reward in zip(todo, rewards, strict=True):
            s.reward = reward
    return result


async def generate_and_rm_group(args: Any, group: list[Sample], state: RolloutState) -> list[Any]:
    """Generates and scores one prompt group concurrently (group reward with `--group-rm`).

    With `--sglang-enable-deterministic-inference`, sample j of the group is sampled with
    `sampling_seed = rollout_seed + j`.
    """
    for sample in group:
        if sample.session_id is None:
            sample.session_id = uuid.uuid4().hex
    params: list[dict[str, Any] | None] = [None] * len(group)
    if (getattr(args, "sglang_args", None) or {}).get("enable_deterministic_inference"):
        # Reproducible sampling (original): sample j of every group uses seed rollout_seed + j.
        seed = int(getattr(args, "rollout_seed", 42))
        params = [dict(state.sampling_params, sampling_seed=seed + j) for j in range(len(group))]
    results = list(
        await asyncio.gather(*(generate_and_rm(args, s, state, p) for s, p in zip(group, params, strict=True)))
    )
    if getattr(args, "group_rm", False) and not state.aborted:
        flat = flatten_groups([results])
        if all(s.status is not Status.ABORTED for s in flat) and any(s.reward is None for s in flat):
            for s, reward in zip(flat, await batched_async_rm(args, flat), strict=True):
                s.reward = reward
    return results


def _group_sort_key(group: list[Any]) -> int:
    index = flatten_groups([group])[0].index
    return index if index is not None else 0


def _has_aborted(group: list[Any]) -> bool:
    return any(s.status is Status.ABORTED for s in flatten_groups([group]))


async def _abort_and_drain(
    args: Any, state: RolloutState, pending: set[asyncio.Task[Any]], rollout_id: int
) -> list[list[Sample]]:
    """Aborts in-flight requests, waits for every task, and returns the groups to re-queue (partial rollout)."""
    state.aborted = True
    leftovers: list[list[Sample]] = []
    if pending:
        await abort_all(args)
    partial = bool(getattr(args, "partial_rollout", False))
    error: BaseException | None = None
    while pending:
        done, pending = await asyncio.wait(pending, timeout=_ABORT_RETRY_S)
        if not done and pending:
            # A request that reached the engine after the abort: abort again (original retries every 3 s).
            await abort_all(args)
        for task in done:
            if task.exception() is not None:
                # Keep draining so nothing is left running; raise the first error afterwards.
                error = error or task.exception()
                continue
            group = task.result()
            if not partial:
                continue
            if any(isinstance(item, list) for item in group):
                logger.warning("partial rollout: dropping a fanned-out group (custom generate returned a list)")
                continue
            for sample in group:
                if sample.response_length > 0 and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            leftovers.append(group)
    if error is not None:
        raise error
    return leftovers


async def generate_rollout_async(
    args: Any, rollout_id: int, data_source: Any
) -> tuple[RolloutFnTrainOutput, list[list[Sample]]]:
    """One training rollout on the running loop.

    Args:
        args: reads `rollout_batch_size`, `n_samples_per_prompt`, `over_sampling_batch_size`,
            `dynamic_sampling_filter_path`, `partial_rollout`, `rollout_sample_filter_path`,
            `rollout_all_samples_process_path` (+ what generate, rewards and metrics read).
        rollout_id: id of this rollout.
        data_source: a `slime_core.protocols.DataSource`.

    Returns:
        `(output, leftovers)`: `rollout_batch_size` accepted groups sorted by sample index with metrics,
        and the unfinished groups to return to the data source (empty without `--partial-rollout`).

    Raises:
        ValueError: a group of the wrong size or a misconfigured batch size.
        RuntimeError: the data source ran dry.
    """
    start = time.perf_counter()
    target = int(args.rollout_batch_size)
    over = int(getattr(args, "over_sampling_batch_size", None) or target)
    if over < target:
        raise ValueError(f"--over-sampling-batch-size {over} must be >= --rollout-batch-size {target}")
    n = int(getattr(args, "n_samples_per_prompt", 1))
    filter_path = getattr(args, "dynamic_sampling_filter_path", None)
    filter_fn = load_function(filter_path, flag="--dynamic-sampling-filter-path") if filter_path else None
    state = RolloutState.create(args, rollout_id=rollout_id)

    pending: set[asyncio.Task[Any]] = set()
    data: list[list[Any]] = []
    all_groups: list[list[Any]] = []
    requeue: list[list[Sample]] = []
    drops: collections.Counter[str] = collections.Counter()
    try:
        while len(data) < target:
            while len(data) + len(pending) < target:
                groups = data_source.get_samples(over)
                if not groups:
                    raise RuntimeError("data source returned no samples")
                pending.update(asyncio.create_task(generate_and_rm_group(args, g, state)) for g in groups)
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                group = task.result()
                all_groups.append(group)
                if len(group) != n:
                    raise ValueError(f"group of {len(group)} samples, expected --n-samples-per-prompt {n}")
                if _has_aborted(group):
                    # Aborted by the engine itself (e.g. around a weight update), not by us.
                    if getattr(args, "partial_rollout", False) and not any(isinstance(x, list) for x in group):
                        requeue.append(group)
                    else:
                        drops["aborted"] += 1
                    continue
                if filter_fn is not None:
                    verdict = normalize_filter_output(filter_fn(args, group))
                    if not verdict.keep:
                        drops[verdict.reason or "filtered"] += 1
                        continue
                if len(data) < target:
                    data.append(group)
    finally:
        # Also on errors: never leave requests running on the engines or tasks on the loop.
        leftovers = await _abort_and_drain(args, state, pending, rollout_id)
    # Deterministic buffer order (by sample index) whatever order the aborted tasks finished in.
    leftovers = sorted(requeue + leftovers, key=_group_sort_key)

    data.sort(key=_group_sort_key)
    if getattr(args, "rollout_sample_filter_path", None):
        load_function(args.rollout_sample_filter_path, flag="--rollout-sample-filter-path")(args, data)
    if getattr(args, "rollout_all_samples_process_path", None):
        fn = load_function(args.rollout_all_samples_process_path, flag="--rollout-all-samples-process-path")
        fn(args, all_groups, data_source)
    metrics = compute_rollout_metrics(args, data, rollout_time=time.perf_counter() - start, drop_counts=drops)
    logger.info(
        "rollout %d: %d groups accepted, %d dropped, %d re-queued in %.1fs",
        rollout_id,
        len(data),
        sum(drops.values()),
        len(leftovers),
        metrics["perf/rollout_time"],
    )
    return RolloutFnTrainOutput(samples=data, metrics=metrics), leftovers


def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """The default `--rollout-function-path` (original signature).

    Args:
        args: run config.
        rollout_id: id of this rollout.
        data_source: the prompt source; unfinished groups go back into it (`add_samples`).
        evaluation: run the eval datasets instead (`slime_rollout.eval.eval_rollout`).

    Returns:
        `RolloutFnTrainOutput`, or `RolloutFnEvalOutput` when `evaluation`.
    """
    if evaluation:
        from slime_rollout.eval import eval_rollout

        return eval_rollout(args, rollout_id)
    output, leftovers = async_utils.run(generate_rollout_async(args, rollout_id, data_source))
    if leftovers:
        data_source.add_samples(leftovers)
    return output


def create_data_source(args: Any) -> Any:
    """Instantiates `--data-source-path` (default `RolloutDataSourceWithBuffer`) with `args`."""
    path = getattr(args, "data_source_path", None) or "slime_rollout.data_source.RolloutDataSourceWithBuffer"
    return load_function(path, flag="--data-source-path")(args)


def run_rollout(
    args: Any, rollout_id: int, data_source: Any, *, evaluation: bool = False
) -> RolloutFnTrainOutput | RolloutFnEvalOutput:
    """What the rollout manager calls: the configured rollout function plus debug dump/replay.

    `--load-debug-rollout-data` replays a dump instead of generating (training rollouts only);
    `--rollout-function-path` / `--eval-function-path` replace the rollout function; legacy bare return
    values are wrapped; `--save-debug-rollout-data` dumps the result; `--custom-rollout-log-function-path` /
    `--custom-eval-rollout-log-function-path` see the result and decide its metrics (`slime_rollout.log_hooks`).
    """
    from slime_rollout import debug_dump, log_hooks

    if not evaluation and getattr(args, "load_debug_rollout_data", None):
        samples = debug_dump.load_debug_rollout_data(args, rollout_id)
        return RolloutFnTrainOutput(samples=debug_dump.regroup(samples), metrics=None)
    path = getattr(args, "rollout_function_path", None) or "slime_rollout.rollout.generate_rollout"
    flag = "--rollout-function-path"
    if evaluation and getattr(args, "eval_function_path", None):
        path, flag = args.eval_function_path, "--eval-function-path"
    fn = load_function(path, flag=flag)
    start = time.perf_counter()
    output = wrap_rollout_output(fn(args, rollout_id, data_source, evaluation=evaluation), evaluation=evaluation)
    rollout_time = time.perf_counter() - start
    if isinstance(output, RolloutFnEvalOutput):
        samples = [s for d in output.data.values() for s in d.get("samples", [])]
        output.metrics = log_hooks.apply_eval_log_function(args, rollout_id, output.data, output.metrics)
    else:
        samples = flatten_groups(output.samples)
        output.metrics = log_hooks.apply_rollout_log_function(args, rollout_id, samples, output.metrics, rollout_time)
    if getattr(args, "save_debug_rollout_data", None):
        debug_dump.save_debug_rollout_data(args, rollout_id, samples, evaluation=evaluation)
    return output
