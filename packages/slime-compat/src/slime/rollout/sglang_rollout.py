"""`slime.rollout.sglang_rollout`: the default rollout and its building blocks (original module path).

`generate_rollout` (the default `--rollout-function-path`) and `generate` (the default generate function)
are this project's (`slime_rollout.generation.rollout`, `slime_rollout.generation.generate`). `GenerateState` and the
`generate_and_rm*` functions are adapters with the original's signatures over `slime_rollout.generation.group_rollout`,
for custom rollout functions that schedule groups themselves and custom generate functions that read
`GenerateState(args).tokenizer` / `.sampling_params`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from typing import Any

from slime.utils.misc import SingletonMeta
from slime.utils.processing_utils import load_processor
from slime_core.config.sglang_flags import sglang_fields
from slime_core.sample import Sample
from slime_rollout.base_types import RolloutFnEvalOutput
from slime_rollout.data.source import get_tokenizer
from slime_rollout.engines.client import get_client
from slime_rollout.generation import group_rollout
from slime_rollout.generation.eval import eval_rollout_async
from slime_rollout.generation.generate import build_sampling_params, generate
from slime_rollout.generation.group_rollout import RolloutState, num_engines
from slime_rollout.generation.rollout import generate_rollout, generate_rollout_async

__all__ = [
    "GenerateState",
    "abort",
    "eval_rollout",
    "generate",
    "generate_and_rm",
    "generate_and_rm_group",
    "generate_rollout",
    "generate_rollout_async",
    "get_model_url",
]


class GenerateState(metaclass=SingletonMeta):
    """The process-wide generation state of the original (one instance per process: `GenerateState(args)`).

    Args:
        args: the plugin view of the run (`slime_core.config.PluginArgs`).

    Attributes:
        args: the run's args.
        tokenizer: the tokenizer of `--hf-checkpoint`.
        processor: `load_processor(--hf-checkpoint)`: the vision-language processor, None for a text-only model.
        semaphore: bounds concurrent engine requests (`--sglang-server-concurrency` × engines).
        sampling_params: SGLang sampling params of training rollouts (from the `--rollout-*` flags).
        group_sampling_seeds: with `--sglang-enable-deterministic-inference`, the seed of sample j of a group.
        dp_counts: requests in flight per engine data-parallel rank (`--sglang-dp-size`).
        dp_rank: the rank the last `dp_rank_context` picked.
        remaining_batch_size: groups submitted by `submit_generate_tasks` since the last `reset`.
        pendings: the tasks `submit_generate_tasks` created.
        aborted: once True, samples not yet generated come back ABORTED.
    """

    def __init__(self, args: Any) -> None:
        self.args = args
        self.tokenizer = get_tokenizer(args.hf_checkpoint)
        self.processor = load_processor(args.hf_checkpoint)  # the geo3k multi-turn example's image prompts
        self.semaphore = asyncio.Semaphore(args.sglang_server_concurrency * num_engines(args))
        self.sampling_params: dict[str, Any] = build_sampling_params(args)
        engine_flags = sglang_fields(args.sglang_args)  # by server field: a config file's `dp-size` missed `dp_size`
        if engine_flags.get("enable_deterministic_inference"):
            self.group_sampling_seeds = [args.rollout_seed + j for j in range(args.n_samples_per_prompt)]
        self.dp_counts, self.dp_rank = [0] * int(engine_flags.get("dp_size", 1) or 1), 0
        # One shared state per kind of rollout; `aborted` below is the flag of both.
        self._states = {
            evaluation: RolloutState(
                semaphore=self.semaphore, sampling_params=self.sampling_params, evaluation=evaluation
            )
            for evaluation in (False, True)
        }
        self.reset()

    @property
    def aborted(self) -> bool:
        """Whether generation was aborted (samples not yet generated return ABORTED)."""
        return self._states[False].aborted

    @aborted.setter
    def aborted(self, value: bool) -> None:
        for state in self._states.values():
            state.aborted = bool(value)

    def state(self, evaluation: bool = False) -> RolloutState:
        """The `slime_rollout.generation.group_rollout.RolloutState` this object stands for."""
        return self._states[evaluation]

    @contextlib.contextmanager
    def dp_rank_context(self) -> Iterator[int]:
        """Picks one of the least-loaded engine DP ranks for the duration of a request."""
        low = min(self.dp_counts)
        rank = random.choice([i for i, count in enumerate(self.dp_counts) if count == low])
        self.dp_counts[rank] += 1
        self.dp_rank = rank
        try:
            yield rank
        finally:
            self.dp_counts[rank] -= 1

    def reset(self) -> None:
        """Clears the submitted tasks and the abort flag (start of a rollout)."""
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task[Any]] = set()
        self.aborted = False

    def submit_generate_tasks(self, samples: list[list[Sample]]) -> None:
        """Starts one `generate_and_rm_group` task per group on the running loop (kept in `pendings`)."""
        for group in samples:
            coro = generate_and_rm_group(self.args, group, sampling_params=dict(self.sampling_params))
            self.pendings.add(asyncio.create_task(coro))
        self.remaining_batch_size += len(samples)


async def generate_and_rm(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
    """Generates one sample (custom generate function or the default), runs the sample hooks, scores it.

    Args:
        args: the plugin view of the run.
        sample: the sample (finished samples are only scored).
        sampling_params: SGLang sampling params for this sample.
        evaluation: part of an eval rollout.

    Returns:
        The sample (or the list a fan-out generate function returned), rewarded unless `--group-rm` or ABORTED.
    """
    state = GenerateState(args).state(evaluation)
    return await group_rollout.generate_and_rm(args, sample, state, sampling_params)


async def generate_and_rm_group(
    args: Any, group: list[Sample], sampling_params: dict[str, Any] | None = None, evaluation: bool = False
) -> list[Any]:
    """Generates and scores one prompt group concurrently (group reward with `--group-rm`).

    Args:
        args: the plugin view of the run.
        group: the `--n-samples-per-prompt` samples of one prompt.
        sampling_params: SGLang sampling params (default: `GenerateState(args).sampling_params`).
        evaluation: part of an eval rollout.

    Returns:
        One entry per sample: the sample, or the list a fan-out generate function returned.
    """
    state = GenerateState(args).state(evaluation)
    if state.aborted:
        return group
    return await group_rollout.generate_and_rm_group(args, group, state, sampling_params)


async def abort(args: Any, rollout_id: int) -> list[list[Any]]:
    """The original's `abort`: stops the generation of `GenerateState(args)` and waits for its tasks.

    Engines abort until idle (`RolloutClient.abort_all`: TimeoutError after 300 s). With `--partial-rollout` the
    tasks' groups are returned (a partly generated sample gets `metadata["start_rollout_id"]`), else [].
    """
    state = GenerateState(args)
    state.aborted = True
    await get_client(args).abort_all()
    done = await asyncio.gather(*state.pendings) if state.pendings else []
    state.pendings = set()
    if not args.partial_rollout:
        return []
    for sample in (s for group in done for s in group if isinstance(s, Sample) and s.response):
        sample.metadata.setdefault("start_rollout_id", rollout_id)
    return list(done)


async def eval_rollout(args: Any, rollout_id: int) -> tuple[RolloutFnEvalOutput, list[list[Sample]]]:
    """Every eval dataset as the original returns it: `(RolloutFnEvalOutput, [])` (was the bare data dict)."""
    return await eval_rollout_async(args, rollout_id), []


def get_model_url(args: Any, model_name: str, endpoint: str = "/generate") -> str:
    """URL of `endpoint` on the router serving `model_name`.

    One engine group serves the policy here (`--sglang-config` multi-model setups are not implemented), so
    every model name resolves to the run's router: `http://{sglang_router_ip}:{sglang_router_port}{endpoint}`.

    Raises:
        ValueError: the run has no router address (several engines without `--use-sglang-router`).
    """
    routers = getattr(args, "sglang_model_routers", None) or {}
    if model_name in routers:
        ip, port = routers[model_name]
        return f"http://{ip}:{port}{endpoint}"
    if args.sglang_router_ip is None or args.sglang_router_port is None:
        raise ValueError("get_model_url: the run has no router address (args.sglang_router_ip/port are None)")
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"
