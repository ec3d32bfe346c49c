"""Finding environments by name: built-ins, the `slime.envs` entry-point group, or import paths.

A third-party package adds an environment by declaring, in its `pyproject.toml`::

    [project.entry-points."slime.envs"]
    my_env = "my_pkg.envs:MyEnv"

and `make_env("my_env", **kwargs)` then builds `MyEnv(**kwargs)`. Any callable returning an `Env`
works (a class or a factory function). `register_env` does the same in-process (tests, notebooks).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

from slime_core.protocols import Env

__all__ = ["ENTRY_POINT_GROUP", "available_envs", "get_env_factory", "make_env", "register_env"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "slime.envs"

# Built-ins resolve even where the package's entry-point metadata is not installed (source checkouts).
_BUILTIN = {
    "search": "slime_envs.search:SearchEnv",
    "python": "slime_envs.python_env:PythonEnv",
    "calculator": "slime_envs.calculator:CalculatorEnv",
}
_REGISTRY: dict[str, Callable[..., Env]] = {}


def register_env(name: str) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    """Decorator registering an env class/factory under `name` in this process.

    Raises:
        ValueError: `name` is already registered.
    """

    def decorator(factory: Callable[..., Env]) -> Callable[..., Env]:
        if name in _REGISTRY:
            raise ValueError(f"env {name!r} is already registered ({_REGISTRY[name]!r})")
        _REGISTRY[name] = factory
        return factory

    return decorator


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_envs() -> list[str]:
    """Names resolvable by `make_env` (registered, entry points and built-ins)."""
    return sorted(set(_REGISTRY) | set(_entry_points()) | set(_BUILTIN))


def _import_path(path: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise KeyError(path)
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None


def get_env_factory(name: str) -> Callable[..., Env]:
    """The class/factory for `name`: registered → entry point → built-in → `module:attr` / `module.attr`.

    Raises:
        KeyError: unknown name, listing the known ones.
        ImportError: an import path or entry point that does not import.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    entry_points = _entry_points()
    if name in entry_points:
        return entry_points[name].load()
    if name in _BUILTIN:
        return _import_path(_BUILTIN[name])
    if "." in name or ":" in name:
        return _import_path(name)
    raise KeyError(f"unknown env {name!r} (--env-path); known: {available_envs()} or an import path module:attr")


def make_env(name: str, **kwargs: Any) -> Env:
    """Builds an environment by name with keyword options.

    Raises:
        KeyError, ImportError: see `get_env_factory`.
        TypeError: the result does not implement the `Env` protocol (`reset`, async `step`).
    """
    env = get_env_factory(name)(**kwargs)
    if not isinstance(env, Env):
        raise TypeError(
            f"env {name!r} built {type(env).__name__}, which lacks reset()/step() of slime_core.protocols.Env"
        )
    return env
