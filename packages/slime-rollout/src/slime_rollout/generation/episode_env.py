"""The environment of a multi-turn episode: built by name and reset (`build_env`), and what its step returns checked.

`slime_rollout.generation.multi_turn.generate` drives the episode; it re-exports `build_env`, `env_factory` and
`checked_env_step` (their import path for plugins). Environments are found through the `slime.envs` entry points
(slime-envs, third-party packages) or an import path, so this package never imports slime-envs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slime_core.error_text import preview
from slime_core.jsonl import describe_json_error
from slime_core.lone_surrogates import replace_lone_surrogates
from slime_core.protocols import Env, EnvStep
from slime_rollout.runtime.deadlines import call_plugin_with_deadline, plugin_bounds

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs
    from slime_core.sample import Sample

logger = logging.getLogger(__name__)

__all__ = ["build_env", "checked_env_step", "encodable", "env_factory", "env_name"]


def _as_dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({describe_json_error(e, line=True)})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: must be a JSON object / mapping, got {type(value).__name__}")
    return dict(value)


def env_factory(name: str) -> Any:
    """Env class/factory by name: a `slime.envs` entry point, else an import path `module:attr`.

    slime-envs and third-party packages declare their environments in the `slime.envs` entry-point group,
    so slime-rollout finds them without importing slime-envs.

    Raises:
        KeyError: an unknown name (lists the installed entry points).
        slime_core.plugins.PluginError: an import path that does not resolve.
        ImportError: an entry point whose module does not import.
    """
    import importlib.metadata

    from slime_core.plugins import load_function

    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group="slime.envs")}
    if name in entry_points:
        return entry_points[name].load()
    if "." in name or ":" in name:
        return load_function(name, flag="--env-path")
    raise KeyError(
        f"unknown env {name!r} (--env-path); installed: {sorted(entry_points)} "
        "(pip install slime-envs for search/python/calculator) or an import path module:attr"
    )


def env_name(args: SlimeArgs, sample: Sample) -> str:
    """The env of a sample's episode: `sample.metadata["env"]`, else `--env-path` ("" when neither is set)."""
    return str(sample.metadata.get("env") or args.env_path or "")


async def build_env(args: SlimeArgs, sample: Sample) -> Env:
    """Builds and resets the environment of one sample.

    The factory and `reset` are the user's sync code: each runs in a worker thread under `--plugin-timeout-secs`, so
    one that never returns fails the rollout naming the env and the sample instead of freezing the event loop.

    The name is `sample.metadata["env"]`, else `args.env_path`; options are, later ones winning,
    `args.custom_config["env_kwargs"]` (the `--custom-config-path` YAML) and `sample.metadata["env_kwargs"]`
    (dicts or JSON strings).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`).
        sample: the sample whose episode starts.

    Returns:
        The environment, reset with the sample's prompt, label and metadata.

    Raises:
        ValueError: no environment configured, or malformed options.
        KeyError: unknown name (lists the installed `slime.envs` entry points).
        ImportError: an entry point or import path that does not import.
        TypeError: the factory's result does not implement `slime_core.protocols.Env`.
        DeadlineExceeded: the factory or `reset` ran past `--plugin-timeout-secs`.
        Exception: what the factory or `reset` raised.
    """
    name = env_name(args, sample)
    if not name:
        raise ValueError(
            "multi-turn generate needs an environment: set --env-path (e.g. search, python, calculator) "
            "or metadata['env'] in the dataset"
        )
    kwargs = _as_dict(args.custom_config.get("env_kwargs"), "--custom-config-path key env_kwargs")
    kwargs.update(_as_dict(sample.metadata.get("env_kwargs"), f"sample {sample.index} metadata['env_kwargs']"))
    factory = env_factory(name)
    bounds = plugin_bounds(args)
    # partial: the env's own options may use any name, `what` and `flag` included.
    make = functools.partial(factory, **kwargs)
    env = await call_plugin_with_deadline(make, what=f"env {name!r} construction for sample {sample.index}", **bounds)
    if not isinstance(env, Env):
        raise TypeError(f"env {name!r} built {type(env).__name__}, which lacks reset()/step() of slime_core Env")
    what = f"env {name!r} reset for sample {sample.index}"
    reset = functools.partial(env.reset, prompt=sample.prompt, label=sample.label, metadata=sample.metadata)
    await call_plugin_with_deadline(reset, what=what, **bounds)
    return env


def encodable(step: EnvStep, what: str) -> EnvStep:
    """`step` with lone surrogates in its texts replaced by U+FFFD (counted in a warning).

    A tool result holding one (a search hit's bad JSON escape, a tool echoing a model's) cannot be tokenized: the
    Hugging Face tokenizer raised `TypeError`, ending the rollout.
    """
    observation, num = replace_lone_surrogates(step.observation)
    responses = step.tool_responses
    if responses is not None:
        fixed = [replace_lone_surrogates(r) for r in responses]
        responses, num = [r for r, _ in fixed], sum(n for _, n in fixed)  # what is tokenized (not `observation`)
    if not num:
        return step
    logger.warning("%s: %d lone surrogate(s) in the observation replaced by U+FFFD (not encodable text)", what, num)
    return dataclasses.replace(step, observation=observation, tool_responses=responses)


def checked_env_step(step: Any, what: str) -> EnvStep:
    """`step` if it is an `EnvStep` whose fields have the documented types, else one error naming the field.

    An env's step that returned the original examples' `(observation, done)` tuple, None, or bytes as its
    observation failed later as a bare `AttributeError`/tokenizer error naming neither the env nor the sample,
    or (None) ended the episode as COMPLETED; a string `tool_responses` was rendered as one tool message per
    character.

    Args:
        step: what the env's `step` returned.
        what: names the env and the sample (`env 'search' step for sample 3`).

    Returns:
        `step`.

    Raises:
        TypeError: not an `EnvStep`; `observation` not a str, `done` not a bool, `info` not a mapping,
            `tool_responses` not None or a list of str, `reward` not None or a real number.
        ValueError: a reward that is NaN or infinite.
    """
    if not isinstance(step, EnvStep):
        raise TypeError(
            f"{what} returned {type(step).__name__} {preview(step)}, not a slime_core.protocols.EnvStep"
            "(observation=str, done=bool, reward=float | None, info=dict, tool_responses=list[str] | None)"
        )
    checks = [
        ("observation", isinstance(step.observation, str), "a str"),
        ("done", isinstance(step.done, bool), "a bool"),
        ("info", isinstance(step.info, Mapping), "a dict"),
        (
            "tool_responses",
            step.tool_responses is None
            or (isinstance(step.tool_responses, list | tuple) and all(isinstance(r, str) for r in step.tool_responses)),
            "None or a list of str (one per tool call)",
        ),
        ("reward", step.reward is None or isinstance(step.reward, numbers.Real), "None or a number"),
    ]
    for field, ok, wanted in checks:
        if not ok:
            value = getattr(step, field)
            raise TypeError(f"{what} returned EnvStep.{field} = {type(value).__name__} {preview(value)}, not {wanted}")
    if step.reward is not None and not math.isfinite(step.reward):
        raise ValueError(f"{what} returned EnvStep.reward = {step.reward!r}, not a finite number")
    return step
