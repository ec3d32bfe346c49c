"""One open registry per extension point: names → capability records, fed by entry points.

Every choice a user makes by name (`--train-backend`, `--rollout-engine`, `--rm-type`, `--advantage-estimator`,
...) is looked up in a `Registry`. An entry is a frozen record (`Entry` or a subclass carrying that kind's
capabilities) declared by the package that provides it, in its `pyproject.toml`::

    [project.entry-points."slime.train_backends"]
    my_backend = "my_pkg.spec:MY_BACKEND"        # a slime_core.extensions.TrainBackendSpec

Lookup order: in-process registrations (`register`, for tests and notebooks), then entry points, then the
built-in fallbacks (`name -> "module:attr"` of the provider's record, used where the providers' entry-point
metadata is not installed: a source checkout on `PYTHONPATH`, as on the GPU machines). Names are listed
without importing anything (`names()` reads entry-point metadata only); a record is imported on first `get`.

Example:
    >>> reg = Registry("slime.demo", flag="--demo", kind="demo", entry_type=Entry)
    >>> _ = reg.register(Entry(name="a", factory=dict))
    >>> reg.get("a").load()
    <class 'dict'>
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import logging
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "DuplicateNameError",
    "Entry",
    "Problem",
    "Registry",
    "UnknownNameError",
    "resolve_path",
    "source_entry_points",
]


class UnknownNameError(KeyError, ValueError):
    """A name no registry entry has: a `KeyError` like every slime registry's, and a `ValueError` (bad config)."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError would quote the message


class DuplicateNameError(ValueError):
    """Two installed distributions declare the same name in one entry-point group."""


def resolve_path(path: str | Callable[..., Any], *, what: str) -> Any:
    """Imports `"module:attr"` (or returns `path` when it is already an object).

    Args:
        path: an import path `"module:attr"` or the object itself.
        what: names the path in errors (e.g. `"--train-backend fsdp factory"`).

    Raises:
        ImportError: the module does not import (the message names `what`).
        AttributeError: the module has no such attribute.
        ValueError: `path` is a string without a `:`.
    """
    if not isinstance(path, str):
        return path
    module_name, sep, attr = path.partition(":")
    if not sep or not attr:
        raise ValueError(f"{what}: expected 'module:attr', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"{what}: cannot import {module_name} ({e})", name=e.name) from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"{what}: module {module_name} has no attribute {attr!r}") from None


def source_entry_points(package: str, group: str) -> dict[str, str]:
    """The `group` entry points that the `pyproject.toml` of `package`'s source tree declares, imports nothing.

    A registry's built-in fallback reads them so that a provider lists its entries once (its `pyproject.toml`)
    and a source checkout on `PYTHONPATH` (no dist-info) still finds them. The layout is the workspace's:
    `packages/<dist>/src/<package>/` next to `packages/<dist>/pyproject.toml`.

    Args:
        package: the provider's top-level import name, e.g. `"slime_rollout"` (located, not imported).
        group: the entry-point group, e.g. `"slime.rewards"`.

    Returns:
        `name -> "module:attr"`; empty when the package is not on the path or ships no `pyproject.toml`
        (an installed wheel: its dist-info carries the entry points).

    Raises:
        ValueError: the `pyproject.toml` is not valid TOML (the message names the file).
    """
    spec = importlib.util.find_spec(package)  # a top-level name: locates without importing
    if spec is None or spec.origin is None:
        logger.debug("%s is not importable here: no source entry points for %s", package, group)
        return {}
    source = Path(spec.origin).parent  # <dist>/src/<package>/__init__.py
    pyproject = source.parent.parent / "pyproject.toml"
    if source.parent.name != "src" or not pyproject.is_file():
        return {}
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{pyproject}: not valid TOML ({e})") from e
    return dict(project.get("entry-points", {}).get(group, {}))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """One finding of a pre-launch check.

    Attributes:
        message: what is wrong and what to do, naming the flag (e.g. `"--lora-rank needs ..."`).
        severity: `"error"` stops the launch; `"note"` is logged.
        exception: the exception class the launch raises for this error (`FileNotFoundError` for a missing
            path, `ValueError` for bad config or data).
    """

    message: str
    severity: str = "error"
    exception: type[Exception] = ValueError

    def __post_init__(self) -> None:
        if self.severity not in ("error", "note"):
            raise ValueError(f"Problem.severity must be 'error' or 'note', got {self.severity!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """The record every registry entry carries; a kind's subclass adds its capabilities.

    Attributes:
        name: the value the user passes (e.g. `--train-backend NAME`).
        factory: the object the name stands for, or its import path `"module:attr"` (imported on `load`).
        preflight: optional `fn(cfg) -> list[Problem]` (or its import path) checking the flags this entry owns
            before anything starts; run by the app's preflight.
    """

    name: str
    factory: str | Callable[..., Any] | None = None
    preflight: str | Callable[..., Any] | None = None

    def load(self) -> Any:
        """The factory (imported on first use when given as `"module:attr"`).

        Raises:
            ImportError / AttributeError: the path does not resolve (message names the entry).
            ValueError: the entry has no factory.
        """
        if self.factory is None:
            raise ValueError(f"{self.name!r} has no factory")
        return resolve_path(self.factory, what=f"{self.name!r} factory")

    def check(self, cfg: Any) -> list[Problem]:
        """Runs this entry's `preflight` hook on `cfg` (no hook: no problems).

        Raises:
            TypeError: the hook returned something other than a list of `Problem`.
        """
        if self.preflight is None:
            return []
        problems = resolve_path(self.preflight, what=f"{self.name!r} preflight")(cfg)
        if not isinstance(problems, list) or not all(isinstance(p, Problem) for p in problems):
            raise TypeError(f"{self.name!r} preflight must return a list of Problem, got {problems!r:.200}")
        return problems


class Registry[E]:
    """Names → records of one extension point.

    Args:
        group: the entry-point group, e.g. `"slime.train_backends"`.
        flag: the flag that selects a name (named in errors), e.g. `"--train-backend"`.
        kind: what a name stands for, in errors, e.g. `"train backend"`.
        entry_type: the record class (any frozen class with a `name`); when it is an `Entry`, an entry point
            may also name a bare factory, wrapped as `entry_type(name=..., factory=obj)` with default
            (most conservative) capabilities.
        builtins: `name -> "module:attr"` of the built-in records, used when no entry point has the name.
    """

    def __init__(
        self, group: str, *, flag: str, kind: str, entry_type: type[E], builtins: dict[str, str] | None = None
    ) -> None:
        self.group = group
        self.flag = flag
        self.kind = kind
        self.entry_type = entry_type
        self._builtins = dict(builtins or {})
        self._registered: dict[str, E] = {}
        self._loaded: dict[str, E] = {}
        # Read once per process: scanning every installed distribution takes ~15 ms, and the config checks
        # names each time it is built.
        self._installed: dict[str, importlib.metadata.EntryPoint] | None = None

    def refresh(self) -> None:
        """Forgets the entry points read and the records loaded (after installing a package in this process)."""
        self._installed = None
        self._loaded.clear()

    def register(self, entry: E) -> E:
        """Registers `entry` in this process and returns it.

        Raises:
            ValueError: the name is already registered in this process.
            TypeError: `entry` is not an `entry_type`.
        """
        if not isinstance(entry, self.entry_type):
            raise TypeError(f"{self.group}: expected a {self.entry_type.__name__}, got {entry!r:.200}")
        name: str = entry.name  # type: ignore[attr-defined]  # every record has a name
        if entry.name in self._registered:
            raise ValueError(f"{self.flag} {name!r} is already registered ({self._registered[name]!r})")
        self._registered[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Removes an in-process registration (no-op when absent)."""
        self._registered.pop(name, None)
        self._loaded.pop(name, None)

    def _entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        if self._installed is None:
            self._installed = self._read_entry_points()
        return self._installed

    def _read_entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        found: dict[str, importlib.metadata.EntryPoint] = {}
        for ep in importlib.metadata.entry_points(group=self.group):
            other = found.get(ep.name)
            if other is not None and other.value != ep.value:
                raise DuplicateNameError(
                    f"{self.group}: {ep.name!r} is declared by two installed distributions: "
                    f"{_dist_name(other)} ({other.value}) and {_dist_name(ep)} ({ep.value}); uninstall one"
                )
            found[ep.name] = ep
        return found

    def names(self) -> list[str]:
        """Every name `get` resolves, sorted (reads entry-point metadata; imports nothing)."""
        return sorted(set(self._registered) | set(self._entry_points()) | set(self._builtins))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def check_name(self, name: str) -> None:
        """Raises `UnknownNameError` unless `name` is registered (imports nothing).

        Raises:
            UnknownNameError: the message names the flag, lists the registered names and the entry-point group
                a package adds one to.
        """
        if name not in self:
            raise UnknownNameError(
                f"{self.flag}: unknown {self.kind} {name!r} (registered: {', '.join(self.names())}; a package adds "
                f'one under [project.entry-points."{self.group}"])'
            )

    def get(self, name: str) -> E:
        """The record of `name`: registered → entry point → built-in; loaded once per process.

        Raises:
            UnknownNameError: unknown name (see `check_name`).
            ImportError: the record's module does not import (e.g. an extra that is not installed).
            TypeError: the entry point names neither a record nor a callable, or a record of another name.
        """
        if name in self._registered:
            return self._registered[name]
        if name in self._loaded:
            return self._loaded[name]
        entry_points = self._entry_points()
        if name in entry_points:
            ep = entry_points[name]
            source = f"entry point {self.group}:{name} of {_dist_name(ep)} ({ep.value})"
            try:
                obj = ep.load()
            except ImportError as e:
                raise ImportError(f"{self.flag} {name}: {source} does not import ({e})", name=e.name) from e
        elif name in self._builtins:
            source = f"built-in {self._builtins[name]}"
            obj = resolve_path(self._builtins[name], what=f"{self.flag} {name}")
        else:
            self.check_name(name)
            raise AssertionError("unreachable")  # check_name raised
        entry = self._coerce(name, obj, source)
        self._loaded[name] = entry
        return entry

    def _coerce(self, name: str, obj: Any, source: str) -> E:
        if isinstance(obj, self.entry_type):
            if obj.name != name:  # type: ignore[attr-defined]
                raise TypeError(f"{source}: the record is named {obj.name!r}, not {name!r}")  # type: ignore[attr-defined]
            return obj
        if issubclass(self.entry_type, Entry) and callable(obj) and not isinstance(obj, Entry):
            if self.entry_type is not Entry:  # a plain Entry has no capabilities to default: nothing to say
                logger.info("%s names a bare factory: default capabilities of %s", source, self.entry_type.__name__)
            return self.entry_type(name=name, factory=obj)
        raise TypeError(f"{source}: expected a {self.entry_type.__name__} or a callable, got {obj!r:.200}")


def _dist_name(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"distribution {dist.name}" if dist is not None else "an unknown distribution"
