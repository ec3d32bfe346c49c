"""One prompt group through generate → sample hooks → reward, and the per-rollout state its tasks share.

The training rollout (`slime_rollout.generation.rollout`) and the eval rollout (`slime_rollout.generation.eval`) both
schedule these coroutines (original `sglang_rollout.generate_and_rm` / `generate_and_rm_group` / `GenerateState`).

`args` here is the plugin view (`slime_core.config.PluginArgs`): it is handed on unchanged to the generate,
hook and reward functions, which may be user plugins with the original signatures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slime_core.error_text import preview
from slime_core.sample import Sample, Status, as_status
from slime_rollout.generation.generate import build_sampling_params, mask_offpolicy_prefix
from slime_rollout.generation.generate import generate as default_generate
from slime_rollout.generation.opd import score_teacher
from slime_rollout.generation.plugin_values import check_plugin_sample_values
from slime_rollout.generation.seeds import sample_seed
from slime_rollout.plugins import accepts_kwarg, declares_parameter, load_function
from slime_rollout.rewards import async_rm, batched_async_rm
from slime_rollout.rewards.checks import checked_preset_reward
from slime_rollout.runtime.deadlines import call_plugin_with_deadline, plugin_bounds
from slime_rollout.runtime.metrics import flatten_groups

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["RolloutState", "checked_groups", "generate_and_rm", "generate_and_rm_group", "num_engines", "seeded_params"]


def num_engines(args: SlimeArgs) -> int:
    """Number of engines behind the client.

    Args:
        args: the plugin view; `rollout_engine_urls` when the engines are known, else
            `rollout_num_gpus // rollout_num_gpus_per_engine` (at least 1).
    """
    if args.rollout_engine_urls:
        return len(args.rollout_engine_urls)
    return max((args.rollout_num_gpus or 0) // args.rollout_num_gpus_per_engine, 1)


@dataclasses.dataclass(kw_only=True)
class RolloutState:
    """Per-rollout shared state of the generate tasks (created inside the running loop).

    Attributes:
        semaphore: bounds concurrent engine requests.
        sampling_params: the base SGLang sampling params.
        aborted: set once the rollout has enough groups; tasks not yet started return ABORTED samples.
        evaluation: eval rollout (eval sampling params, no sample abort).
        rollout_id: id of the rollout (passed to hooks).
        reward_seconds: wall seconds spent in reward calls, summed over the concurrent tasks (they overlap
            generation; `perf/reward_time`).
    """

    semaphore: asyncio.Semaphore
    sampling_params: dict[str, Any]
    aborted: bool = False
    evaluation: bool = False
    rollout_id: int | None = None
    reward_seconds: float = 0.0

    @classmethod
    def create(
        cls,
        args: SlimeArgs,
        *,
        rollout_id: int | None,
        evaluation: bool = False,
        sampling_params: dict[str, Any] | None = None,
    ) -> RolloutState:
        """Builds the state: `sglang_server_concurrency × num_engines` requests at a time, the sampling flags.

        `sampling_params`, when given, stands in for the flags' (an eval's datasets resolve their own).
        """
        if sampling_params is None:
            sampling_params = build_sampling_params(args, evaluation=evaluation)
        return cls(
            semaphore=asyncio.Semaphore(args.sglang_server_concurrency * num_engines(args)),
            sampling_params=sampling_params,
            evaluation=evaluation,
            rollout_id=rollout_id,
        )


def _generate_fn(args: SlimeArgs, sample: Sample) -> Callable[..., Any]:
    if sample.generate_function_path:
        return load_function(sample.generate_function_path, flag="sample.generate_function_path")
    path = args.custom_generate_function_path
    return load_function(path, flag="--custom-generate-function-path") if path else default_generate


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def _reward_bounds(args: SlimeArgs) -> dict[str, float]:
    return {"deadline_s": args.rm_timeout_secs, "warn_every_s": args.slow_call_warning_secs}


def _checked_output(out: Any, what: str, *, fan_out: bool, trained: bool = True) -> Any:
    """`out` if a `Sample` (or, with `fan_out`, a non-empty list of distinct ones); else one error naming `what`.

    A string status a plugin assigned ("completed", as the original's tau-bench example writes) becomes its `Status`.
    A plugin that returned something else failed later as `'NoneType' object has no attribute 'reward'`, naming
    neither the plugin nor the sample.

    Raises:
        TypeError: not a Sample (nor, with `fan_out`, a list of Samples).
        ValueError: an empty list, one holding the same Sample object twice, or a status that names none.
    """
    if fan_out and isinstance(out, list) and out and all(isinstance(s, Sample) for s in out):
        if len({id(s) for s in out}) < len(out):
            # One object twice would be trained twice, and every later write to one entry changes the other.
            raise ValueError(f"{what} returned the same Sample object more than once in its list (copy it per entry)")
        for s in out:
            s.status = as_status(s.status, f"{what}: sample {s.index}")
            _validated(s, what, trained=trained)
        return out
    if isinstance(out, Sample):
        # `sample.status = "aborted"` (a string, as the original's tau-bench example writes) compared unequal to
        # every Status: the loop took an aborted sample for a finished one.
        out.status = as_status(out.status, f"{what}: sample {out.index}")
        return _validated(out, what, trained=trained)
    if fan_out and out == []:
        # The rollout sorted groups by their first sample: an empty fan-out failed as a bare IndexError.
        raise ValueError(
            f"{what} returned an empty list: a generate function returns its Sample, or a non-empty list of them "
            "(to drop the sample, return it with remove_sample = True or status ABORTED)"
        )
    wanted = "a Sample or a list of Samples" if fan_out else "a Sample or None"
    raise TypeError(f"{what} returned {type(out).__name__} {preview(out)}, not {wanted}")


def _validated(sample: Sample, what: str, *, trained: bool = True) -> Sample:
    """`sample` if its values and lengths are sound, else one error naming the plugin `what` and the sample.

    Checked here, at the hand-over, the error names the plugin that built the sample; later (the rollout's metrics,
    the trainer's batches) it would name the sample only. Values: `plugin_values.check_plugin_sample_values` (with
    `trained` False, an eval sample's tokens and log-probs, which nothing reads, are not checked); lengths:
    `Sample.validate`.
    """
    try:
        check_plugin_sample_values(sample, trained=trained)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what} returned a sample whose values are wrong: {e}") from None
    try:
        sample.validate()
    except ValueError as e:
        raise ValueError(f"{what} returned a sample whose lengths disagree: {e}") from None
    return sample


def _keep_place(given: Sample, result: Sample | list[Sample]) -> None:
    """Gives a Sample a generate function built afresh the `group_index` and `index` it left unset, from `given`.

    The original groups a rollout's rewards by position (n consecutive samples), so a generate function may return a
    new `Sample(...)` without them (the tau-bench example sets only `index`); here groups are told by `group_index`,
    and a fresh sample among given ones failed the rollout as "samples [None] have no group_index while others have
    one", naming neither the function nor the prompt.
    """
    for out in result if isinstance(result, list) else [result]:
        if out is not given:
            if out.group_index is None:
                out.group_index = given.group_index
            if out.index is None:
                out.index = given.index


def checked_groups(groups: Any, what: str, group_size: int) -> list[list[Sample]]:
    """A data source's `get_samples` value as groups: a list of lists of `group_size` `Sample`s.

    Args:
        groups: what `get_samples` returned.
        what: names the call in errors, e.g. "MySource.get_samples(8) (rollout 3)".
        group_size: `--n-samples-per-prompt`.

    Raises:
        TypeError: not a list of lists of Samples (a flat list of Samples failed as "'Sample' object is not
            iterable" inside a generate task, naming no data source).
        ValueError: a group of another size (it was generated first and refused after), or one Sample object in two
            places (`[sample] * n` instead of copies: its generations would write into one object at once).
    """
    if not isinstance(groups, list | tuple):
        raise TypeError(f"{what} returned {type(groups).__name__}, not a list of groups (lists of Samples)")
    seen: dict[int, int] = {}
    for i, group in enumerate(groups):
        if not isinstance(group, list) or not all(isinstance(s, Sample) for s in group):
            raise TypeError(f"{what}: group {i} is {type(group).__name__} {preview(group)}, not a list of Samples")
        if len(group) != group_size:
            size = len(group)
            raise ValueError(f"{what}: group {i} has {size} samples, expected {group_size} (--n-samples-per-prompt)")
        for s in group:
            if id(s) in seen:
                raise ValueError(
                    f"{what}: group {i} holds sample {s.index}, the same Sample object as in group {seen[id(s)]}: each "
                    "sample must be its own object (copy.deepcopy the prompt's sample, as the original's data source "
                    "does, not [sample] * n)"
                )
            seen[id(s)] = i
    return list(groups)


async def _run_hooks(args: SlimeArgs, sample: Sample, state: RolloutState) -> Sample:
    offered = {"evaluation": state.evaluation, "rollout_id": state.rollout_id}
    for path in args.rollout_sample_hook_path or []:
        hook = load_function(path, flag="--rollout-sample-hook-path")
        what = f"--rollout-sample-hook-path {path} on sample {sample.index}"
        # As the original's _accepted_kwargs: only the keywords the hook takes (`hook(args, sample)` is valid there;
        # it failed here with "got an unexpected keyword argument 'evaluation'").
        kwargs = {name: value for name, value in offered.items() if accepts_kwarg(hook, name)}
        out = await call_plugin_with_deadline(hook, args, sample, what=what, **plugin_bounds(args), **kwargs)
        # A hook may change the sample in place and return None: its lengths are checked either way.
        sample = _checked_output(sample if out is None else out, what, fan_out=False, trained=not state.evaluation)
    return sample


async def generate_and_rm(
    args: SlimeArgs, sample: Sample, state: RolloutState, sampling_params: dict[str, Any] | None = None
) -> Sample | list[Sample]:
    """Generates one sample and runs the sample hooks on it (neither for an already finished one), then scores it.

    Args:
        args: the plugin view; reads `custom_generate_function_path`, `rollout_sample_hook_path`, `group_rm`,
            `plugin_timeout_secs` and `slow_call_warning_secs` (a custom generate function and each hook are
            bounded and logged: `slime_rollout.runtime.deadlines`)
            (+ what generate and the reward read).
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
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        # Here, as in the original's generate_and_rm, so a custom generate function that continues the partial
        # response (not only the default one) trains on none of the older policy's tokens.
        mask_offpolicy_prefix(sample)
    finished = sample.status in (Status.COMPLETED, Status.TRUNCATED) and sample.response_length > 0
    if not finished:
        async with state.semaphore:
            if state.aborted:
                sample.status = Status.ABORTED
                return sample
            fn = _generate_fn(args, sample)
            # As the original: only to a function that names the parameter (not to `**kwargs`, which it may forward).
            kwargs = {"evaluation": state.evaluation} if declares_parameter(fn, "evaluation") else {}
            if fn is default_generate:  # ours: its engine requests are bounded and logged themselves
                result = await fn(args, sample, params, **kwargs)
            else:
                what = f"generate function {_name(fn)} on sample {sample.index}"
                result = await call_plugin_with_deadline(fn, args, sample, params, what=what, **plugin_bounds(args),
                                                         **kwargs)  # fmt: skip
                result = _checked_output(result, what, fan_out=True, trained=not state.evaluation)
                _keep_place(sample, result)
    if isinstance(result, list):
        result = [await _run_hooks(args, s, state) for s in result]
    elif not finished:
        # As the original: a finished sample from the partial-rollout buffer had its hooks run in the rollout that
        # generated it (they ran again here, so a hook that appends or counts did it twice on those samples only).
        result = await _run_hooks(args, result, state)
    for s in result if isinstance(result, list) else [result]:
        if s.reward is not None:  # set by the generate function, a hook or an env: read it under the deadline
            source = f"generate function {_name(_generate_fn(args, sample))} (or a sample hook)"
            s.reward = await checked_preset_reward(s.reward, source=source, sample=s, **_reward_bounds(args))
    if args.group_rm and not state.evaluation:
        return result
    produced = result if isinstance(result, list) else [result]
    if not state.evaluation and any(s.status is Status.ABORTED for s in produced):
        # As the original: an aborted fan-out is not scored at all (its group is not kept); a batch-mode reward got
        # the rest of it, a partial list it was not written for. An eval scores the rest (it reports them).
        return result
    todo = [s for s in produced if s.status is not Status.ABORTED and s.reward is None]
    if todo:
        t0 = time.perf_counter()
        rewards = await batched_async_rm(args, todo) if isinstance(result, list) else [await async_rm(args, todo[0])]
        state.reward_seconds += time.perf_counter() - t0
        for s, reward in zip(todo, rewards, strict=True):
            s.reward = reward
        if not state.evaluation:
            await score_teacher(args, todo)  # --opd-type sglang: while other groups still generate
    return result


def seeded_params(
    args: SlimeArgs, state: RolloutState, sample: Sample, params: dict[str, Any], *, prompt_position: int, position: int
) -> dict[str, Any]:
    """A copy of `params` with the sample's own `sampling_seed` (`generation.seeds.sample_seed`) unless one is set.

    Args:
        args: the plugin view; reads `rollout_seed`.
        state: the rollout's state (rollout id, eval or training).
        sample: the sample; its `group_index` / `index` identify it (positions stand in when they are None).
        params: the sampling params to extend.
        prompt_position: the group's position in the rollout (used when `group_index` is None).
        position: the sample's position in its group (used when `index` is None).
    """
    if params.get("sampling_seed") is not None:
        # A copy all the same, as the original's group copies them per sample: a generate function written for it
        # changes its params in place (`sampling_params["max_new_tokens"] -= sample.response_length`).
        return dict(params)
    prompt = sample.group_index if sample.group_index is not None else prompt_position
    index = sample.index if sample.index is not None else position
    seed = sample_seed(args.rollout_seed, state.rollout_id, prompt, index, evaluation=state.evaluation)
    return dict(params, sampling_seed=seed)


async def generate_and_rm_group(
    args: SlimeArgs,
    group: list[Sample],
    state: RolloutState,
    sampling_params: dict[str, Any] | None = None,
    *,
    prompt_position: int = 0,
) -> list[Any]:
    """Generates and scores one prompt group concurrently (group reward with `--group-rm`).

    Each sample is drawn with its own seed from (`--rollout-seed`, rollout id, prompt index, sample index)
    (`seeded_params`), so the samples do not depend on request order or on which engine serves them.

    Args:
        args: the plugin view; reads `rollout_seed`, `group_rm` (+ what `generate_and_rm` reads).
        group: the `n_samples_per_prompt` samples of one prompt.
        state: the rollout's shared state.
        sampling_params: overrides `state.sampling_params` for this group (original callers pass their own).
        prompt_position: the group's position in the rollout (seeds samples without a `group_index`).

    Returns:
        One entry per sample: the sample, or the list a fan-out generate function returned.
    """
    for sample in group:
        if sample.session_id is None:
            sample.session_id = uuid.uuid4().hex
    base = sampling_params if sampling_params is not None else state.sampling_params
    params = [
        seeded_params(args, state, s, base, prompt_position=prompt_position, position=j) for j, s in enumerate(group)
    ]
    results = list(
        await asyncio.gather(*(generate_and_rm(args, s, state, p) for s, p in zip(group, params, strict=True)))
    )
    if args.group_rm and not state.aborted:
        flat = flatten_groups([results])
        # As the original: the group RM scores every sample, also ones a generate function gave a reward.
        if all(s.status is not Status.ABORTED for s in flat):
            t0 = time.perf_counter()
            rewards = await batched_async_rm(args, flat)
            state.reward_seconds += time.perf_counter() - t0
            for s, reward in zip(flat, rewards, strict=True):
                s.reward = reward
    return results
