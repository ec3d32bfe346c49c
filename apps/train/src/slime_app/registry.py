"""Training backends and weight-sync transports by name: built-ins, entry points, in-process registrations.

`--train-backend NAME` and `--weight-sync NAME` are looked up here, the way `slime_envs.registry` finds
environments. A third-party package adds one by declaring, in its `pyproject.toml`::

    [project.entry-points."slime.train_backends"]
    my_backend = "my_pkg.backend:MyBackend"          # called with no arguments, returns a TrainBackend

    [project.entry-points."slime.critic_backends"]
    my_backend = "my_pkg.backend:MyCritic"           # the PPO critic of that backend, a CriticBackend

    [project.entry-points."slime.weight_updaters"]
    my_transport = "my_pkg.sync:make_updater"        # called as factory(cfg, client), returns a WeightUpdater

Built-ins are `module:attr` strings imported only when their name is asked for (`fsdp` never imports
Megatron), and they resolve where the packages' entry-point metadata is not installed (a source checkout
on `PYTHONPATH`, as on the GPU machines). The config still restricts the flags to the built-in names
(`Literal` fields in `slime_core.config.cluster`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from typing import Any

__all__ = ["CRITIC_BACKENDS", "TRAIN_BACKENDS", "WEIGHT_UPDATERS", "Registry", "UnknownNameError"]


class UnknownNameError(KeyError, ValueError):
    """A name no registry entry has: a `KeyError` like every slime registry's, and a `ValueError` (bad config)."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError would quote the message


class Registry:
    """Names → factories: in-process registrations, then entry points of `group`, then the built-ins.

    Args:
        group: the entry-point group, e.g. `"slime.train_backends"`.
        flag: the command-line flag that selects a name (named in errors), e.g. `"--train-backend"`.
        kind: what a name stands for, in errors, e.g. `"backend"`.
        builtins: `name -> "module:attr"` of the built-in factories (imported lazily).

    Example:
        >>> TRAIN_BACKENDS.names()
        ['fsdp', 'megatron']
        >>> TRAIN_BACKENDS.get("fsdp")  # the class slime_train_fsdp.FSDPTrainBackend
        <class 'slime_train_fsdp.backend.FSDPTrainBackend'>
    """

    def __init__(self, group: str, *, flag: str, kind: str, builtins: dict[str, str]):
        self.group = group
        self.flag = flag
        self.kind = kind
        self._builtins = dict(builtins)
        self._registered: dict[str, Callable[..., Any]] = {}

    def register(self, name: str, factory: Callable[..., Any]) -> None:
        """Registers `factory` under `name` in this process (tests, notebooks).

        Raises:
            ValueError: `name` is already registered in this process.
        """
        if name in self._registered:
            raise ValueError(f"{self.flag} {name!r} is already registered ({self._registered[name]!r})")
        self._registered[name] = factory

    def unregister(self, name: str) -> None:
        """Removes an in-process registration (no-op when absent)."""
        self._registered.pop(name, None)

    def _entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        return {ep.name: ep for ep in importlib.metadata.entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Every name `get` resolves, sorted."""
        return sorted(set(self._registered) | set(self._entry_points()) | set(self._builtins))

    def get(self, name: str) -> Callable[..., Any]:
        """The factory for `name`: registered → entry point → built-in.

        Raises:
            UnknownNameError: (a `KeyError` and a `ValueError`) unknown name; the message names the flag and
                lists the known names.
            ImportError: the factory's module does not import (e.g. an extra that is not installed).
        """
        if name in self._registered:
            return self._registered[name]
        entry_points = self._entry_points()
        if name in entry_points:
            return entry_points[name].load()
        if name in self._builtins:
            module_name, _, attr = self._builtins[name].partition(":")
            return getattr(importlib.import_module(module_name), attr)
        raise UnknownNameError(f"{self.flag}: unknown {self.kind} {name!r} (known: {', '.join(self.names())})")


#: `--train-backend`: a factory called with no arguments that returns a `slime_core.protocols.TrainBackend`.
TRAIN_BACKENDS = Registry(
    "slime.train_backends",
    flag="--train-backend",
    kind="backend",
    builtins={
        "fsdp": "slime_train_fsdp:FSDPTrainBackend",
        "megatron": "slime_train_megatron:MegatronTrainBackend",
    },
)

#: The PPO critic of `--train-backend NAME`: a factory called with no arguments that returns a
#: `slime_core.protocols.CriticBackend`.
CRITIC_BACKENDS = Registry(
    "slime.critic_backends",
    flag="--train-backend",
    kind="critic backend",
    builtins={
        "fsdp": "slime_train_fsdp:FSDPCriticBackend",
        "megatron": "slime_train_megatron:MegatronCriticBackend",
    },
)

#: `--weight-sync` (after validation resolved `auto`): `factory(cfg, client)` returning an object with
#: `update(buckets, weight_version)`; `client` is a `slime_rollout.engines.client.RolloutClient` of the engines.
WEIGHT_UPDATERS = Registry(
    "slime.weight_updaters",
    flag="--weight-sync",
    kind="transport",
    builtins={
        "tensor": "slime_rollout.weight_sync.updaters:TensorWeightUpdater",
        "disk": "slime_rollout.weight_sync.updaters:DiskWeightUpdater",
        "distributed": "slime_app.weights:distributed_weight_updater",
        "lora": "slime_rollout.weight_sync.lora:LoraWeightUpdater",
    },
)
