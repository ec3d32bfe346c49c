"""Protocols that packages and user plugins meet through.

Trainers (`slime_train_*`) implement `TrainBackend` (and `slime_core.train_step.StepBackend`, what the
shared RL step needs from them) and, for PPO, `CriticBackend` (and `slime_core.critic.CriticStepBackend`);
the rollout layer implements `WeightUpdater` and `DataSource`; `slime_envs` implements `Env`. The apps wire
them together. Plugin callables keep the original slime signatures (`RewardFn`, `GenerateFn`,
`DynamicFilterFn`) and receive the config as `args` (the `slime_core.config.PluginArgs` view, a `SlimeArgs`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.sample import Sample

__all__ = [
    "CompileWarmUp",
    "CriticBackend",
    "DataSource",
    "DynamicFilterFn",
    "DynamicFilterOutput",
    "Env",
    "EnvStep",
    "GenerateFn",
    "RewardFn",
    "TrainBackend",
    "WeightUpdater",
]


@runtime_checkable
class CompileWarmUp(Protocol):
    """A running compile warm-up (`TrainBackend.start_compile_warm_up`): graphs compiled beside the trainer's start."""

    def pending(self) -> bool:
        """Whether it still compiles (steps then run the compiled layers eagerly)."""
        ...

    def eager(self) -> Any:
        """A context manager under which a step runs the compiled layers eagerly."""
        ...

    def wait(self) -> dict[str, Any] | None:
        """Waits for it to end; its report (graphs, seconds), or None when it failed (the step then compiles)."""
        ...

    def release(self) -> None:
        """Lets a gated warm-up go on to the accelerator."""
        ...

    def stop(self) -> None:
        """Ends it early (the rank shuts down before its first step)."""
        ...


@runtime_checkable
class TrainBackend(Protocol):
    """A training backend: one instance per rank, torch.distributed already set up by the caller.

    `train` runs the shared RL step (`slime_core.train_step.train_on_rollout`); the backend supplies its
    forward passes, collectives and optimizer.

    Attributes:
        compile_layers_flag: set by `init`: the flag under which it compiled the decoder layers (they compile at
            the first forward, e.g. "--fsdp-compile-layers"), None when they run eagerly. The value `init` used,
            so the driver names the first step from it instead of restating the backend's rule.
    """

    compile_layers_flag: str | None

    @staticmethod
    def start_compile_warm_up(cfg: SlimeArgs, gated: bool = False) -> CompileWarmUp | None:
        """Starts compiling the model's graphs before `init`, while the engines start; None: nothing to warm.

        A backend without a warm-up returns None. `gated`: colocated, the warm-up prepares on the CPU and touches
        the accelerator only after `CompileWarmUp.release()` (once the engines are up and released their memory).
        """
        ...

    def init(self, cfg: SlimeArgs, *, with_ref: bool) -> int:
        """Builds model/optimizer from the frozen config, loads `--load` if given; returns the start rollout id."""
        ...

    def compute_log_probs(self, batch: RolloutBatch, *, model: str = "actor") -> list[torch.Tensor]:
        """Per-sample response log-probs `[L_i]` float32 at the rollout temperature (`model`: actor|ref)."""
        ...

    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """Runs `num_steps_per_rollout` optimizer steps on `batch`; returns `train/*` metrics."""
        ...

    def save(self, rollout_id: int, *, commit: bool = True) -> None:
        """Writes a resumable checkpoint atomically (temp dir, then rename).

        `commit`: also name it in the `--save` folder's tracker, the point a resume starts from; False leaves that
        to `commit_save`, so that the driver's own part of the checkpoint (`run_state_<id>.json`) is written before.
        """
        ...

    def commit_save(self, rollout_id: int) -> None:
        """Names the checkpoint `save(rollout_id, commit=False)` wrote in the tracker (collective; rank 0 writes)."""
        ...

    def save_hf(self, path: str | pathlib.Path) -> None:
        """Exports a Hugging Face checkpoint (`--save-hf`) atomically; collective, rank 0 writes."""
        ...

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel rank (model-parallel ranks of one DP group train on the same batch)."""
        ...

    def named_hf_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Yields buckets of full tensors under Hugging Face names for weight sync (collective call)."""
        ...

    def sleep(self) -> None:
        """Frees accelerator memory (colocated mode)."""
        ...

    def wake_up(self) -> None:
        """Restores what `sleep` freed."""
        ...


@runtime_checkable
class CriticBackend(Protocol):
    """The PPO critic's training backend (`--advantage-estimator ppo`): one instance per rank.

    `train_critic` runs the shared critic step (`slime_core.critic.train_critic_on_rollout`); the backend supplies
    the value forward, collectives and optimizer (`slime_core.critic.CriticStepBackend`).

    Attributes:
        compile_layers_flag: set by `init`, as `TrainBackend.compile_layers_flag`: the flag under which it compiled
            the value model's decoder layers (they compile in the critic's first step), None when they run eagerly.
    """

    compile_layers_flag: str | None

    def init(self, cfg: SlimeArgs) -> int:
        """Builds the value model from the critic's config (`slime_core.critic.critic_config`); returns the start id."""
        ...

    def compute_values(self, batch: RolloutBatch) -> list[torch.Tensor]:
        """Per-sample values `[L_i]` float32 of the response tokens."""
        ...

    def train_critic(self, rollout_id: int, batch: RolloutBatch) -> tuple[dict[str, float], list[torch.Tensor]]:
        """Trains on `batch`; returns `train/critic-*` metrics and the values before the update."""
        ...

    def save(self, rollout_id: int) -> None:
        """Writes a resumable critic checkpoint atomically."""
        ...

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel rank."""
        ...

    def sleep(self) -> None:
        """Frees accelerator memory (the critic shares GPUs with the actor or the engines)."""
        ...

    def wake_up(self) -> None:
        """Restores what `sleep` freed."""
        ...


@runtime_checkable
class WeightUpdater(Protocol):
    """Pushes trainer weights into inference engines and bumps their `weight_version`."""

    def update(self, buckets: Iterator[list[tuple[str, torch.Tensor]]], weight_version: str) -> None:
        """Sends all buckets, then checks that every engine reports `weight_version`."""
        ...


@runtime_checkable
class DataSource(Protocol):
    """Where prompts come from (`--data-source-path`); groups of `n_samples_per_prompt` samples.

    A class that subclasses this protocol explicitly inherits its method bodies: they raise `NotImplementedError`
    naming the method, so one left out fails where it is called (an empty body returned None: a missing
    `add_samples` silently lost the groups a partial rollout handed back). The original's abstract base class is
    `slime.rollout.data_source.DataSource` (slime-compat).
    """

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` prompt groups (partial-rollout leftovers first)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_samples (--data-source-path)")

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Returns unfinished groups to the buffer (partial rollout)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement add_samples (--data-source-path)")

    def save(self, rollout_id: int) -> None:
        """Persists the cursor (epoch, offset, buffer) next to the checkpoint."""
        raise NotImplementedError(f"{type(self).__name__} does not implement save (--data-source-path)")

    def load(self, rollout_id: int) -> None:
        """Restores the cursor saved by `save`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement load (--data-source-path)")

    def __len__(self) -> int:
        """Number of prompts in one epoch."""
        raise NotImplementedError(f"{type(self).__name__} does not implement __len__ (--data-source-path)")


class RewardFn(Protocol):
    """`--custom-rm-path`: `async def custom_rm(args, sample) -> float | dict`."""

    async def __call__(self, args: SlimeArgs, sample: Sample) -> float | dict[str, Any]:
        """Scores one finished sample."""
        ...


class GenerateFn(Protocol):
    """`--custom-generate-function-path`: `async def generate(args, sample, sampling_params) -> Sample | list`."""

    async def __call__(self, args: SlimeArgs, sample: Sample, sampling_params: dict[str, Any]) -> Sample | list[Sample]:
        """Generates the response of one sample (possibly several turns)."""
        ...


@dataclasses.dataclass(slots=True)  # positional too: original filters write DynamicFilterOutput(keep, reason)
class DynamicFilterOutput:
    """Result of a dynamic-sampling filter.

    Attributes:
        keep: whether the group enters the batch.
        reason: why it was dropped (logged as `rollout/dynamic_filter/drop_{reason}`).
        keep_when_insufficient: keep a rejected group anyway when dropping it would leave fewer groups (accepted
            plus still generating) than the batch needs, instead of sampling another round.
    """

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False


class DynamicFilterFn(Protocol):
    """`--dynamic-sampling-filter-path`: `fn(args, group) -> DynamicFilterOutput | bool`."""

    def __call__(self, args: SlimeArgs, samples: list[Sample]) -> DynamicFilterOutput | bool:
        """Decides whether a finished group is kept."""
        ...


@dataclasses.dataclass(kw_only=True, slots=True)
class EnvStep:
    """What an environment returns for one model turn.

    Attributes:
        observation: text to append as masked (non-trainable) tokens; empty when done without output.
        done: the episode is over (final answer given or turn budget spent).
        reward: optional reward decided by the environment.
        info: free-form details (tool name, errors) for metrics and debugging. One key is read by the rollout's
            metrics: `num_backend_errors` (int), the tool calls of this step whose backend (a retrieval server, an
            API) failed, so that the model was shown an error in place of the result
            (`rollout/env_backend_error_samples` counts the samples with one).
        tool_responses: contents of tool messages (one per call) for chat-template tool calling; when
            given, the generate function renders them as `tool` messages with the tokenizer's chat
            template instead of appending `observation` verbatim (`observation` is then their plain
            text, for logging).
    """

    observation: str
    done: bool
    reward: float | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    tool_responses: list[str] | None = None


@runtime_checkable
class Env(Protocol):
    """A multi-turn tool environment (registered under the `slime.envs` entry-point group).

    Optional attribute read by generate functions: `stop: list[str]`, extra stop strings that end a
    model turn at a tool boundary (e.g. `</search>`), kept in the output (`no_stop_trim`).
    """

    def reset(self, *, prompt: Any, label: Any, metadata: Mapping[str, Any]) -> None:
        """Starts an episode for one sample."""
        ...

    async def step(self, model_turn: str) -> EnvStep:
        """Consumes one model turn (text with tool calls or a final answer)."""
        ...
