"""Protocols that packages and user plugins meet through.

Trainers (`slime_train_*`) implement `TrainBackend` (and `slime_core.train_step.StepBackend`, what the
shared RL step needs from them); the rollout layer implements `WeightUpdater` and `DataSource`;
`slime_envs` implements `Env`. The apps wire them together. Plugin callables keep the original slime
signatures (`RewardFn`, `GenerateFn`, `DynamicFilterFn`) and receive the config as `args` (the
`slime_core.config.PluginArgs` view, a `SlimeArgs`).
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
class TrainBackend(Protocol):
    """A training backend: one instance per rank, torch.distributed already set up by the caller.

    `train` runs the shared RL step (`slime_core.train_step.train_on_rollout`); the backend supplies its
    forward passes, collectives and optimizer.
    """

    def init(self, cfg: SlimeArgs, *, with_ref: bool) -> int:
        """Builds model/optimizer from the frozen config, loads `--load` if given; returns the start rollout id."""
        ...

    def compute_log_probs(self, batch: RolloutBatch, *, model: str = "actor") -> list[torch.Tensor]:
        """Per-sample response log-probs `[L_i]` float32 at the rollout temperature (`model`: actor|ref)."""
        ...

    def train(self, rollout_id: int, batch: RolloutBatch) -> dict[str, float]:
        """Runs `num_steps_per_rollout` optimizer steps on `batch`; returns `train/*` metrics."""
        ...

    def save(self, rollout_id: int) -> None:
        """Writes a resumable checkpoint atomically (temp dir, then rename)."""
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
class WeightUpdater(Protocol):
    """Pushes trainer weights into inference engines and bumps their `weight_version`."""

    def update(self, buckets: Iterator[list[tuple[str, torch.Tensor]]], weight_version: str) -> None:
        """Sends all buckets, then checks that every engine reports `weight_version`."""
        ...


@runtime_checkable
class DataSource(Protocol):
    """Where prompts come from (`--data-source-path`); groups of `n_samples_per_prompt` samples."""

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` prompt groups (partial-rollout leftovers first)."""
        ...

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Returns unfinished groups to the buffer (partial rollout)."""
        ...

    def save(self, rollout_id: int) -> None:
        """Persists the cursor (epoch, offset, buffer) next to the checkpoint."""
        ...

    def load(self, rollout_id: int) -> None:
        """Restores the cursor saved by `save`."""
        ...

    def __len__(self) -> int:
        """Number of prompts in one epoch."""
        ...


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
        info: free-form details (tool name, errors) for metrics and debugging.
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
