"""Loading user plugins given as import paths (`--custom-rm-path my_pkg.rewards.score`).

Plugins keep the original slime signatures (e.g. `async def custom_rm(args, sample) -> float`);
`call_maybe_async` lets callers accept both sync and async implementations.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from functools import cache
from typing import Any

__all__ = [
    "BUILTIN_FALLBACKS",
    "PATH_ALIASES",
    "PluginError",
    "call_maybe_async",
    "forget_loaded_plugins",
    "load_function",
]

logger = logging.getLogger(__name__)

#: Import paths of the original slime's functions → where they live in this version. The packages that
#: provide them add their entries on import (e.g. `slime_rollout.plugins`), so an original launch script's
#: path resolves wherever a plugin is loaded (the reward post-process hook is loaded here, in slime-core).
PATH_ALIASES: dict[str, str] = {}

#: Functions of the original's `examples/` that this version has built in: used when the example's module is not
#: importable (the original's launch script names it relative to the original's checkout), so the script runs
#: unchanged from this one; a copy of the original file on PYTHONPATH still wins.
BUILTIN_FALLBACKS: dict[str, str] = {
    "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp": (
        "slime_core.algorithms.mis.compute_mis_weights_with_cp"
    ),
}


class PluginError(ImportError):
    """A plugin import path could not be resolved; the message names the flag and what was missing.

    Attributes:
        missing_dependency: the module the plugin's own module failed to import (this process lacks a
            package the plugin needs), or None when the plugin path itself is wrong.
    """

    missing_dependency: str | None = None


def _split_path(path: str, flag: str) -> tuple[str, str]:
    if not isinstance(path, str) or not path.strip():
        raise PluginError(f"{flag}: expected an import path like 'package.module.function', got {path!r}")
    path = path.strip()
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise PluginError(
            f"{flag}: {path!r} is not an import path; use 'package.module.function' or 'package.module:function'"
        )
    return module_name, attr


def _origin(error: BaseException) -> str:
    """`" at FILE:LINE"`: where an import failed, or "".

    The deepest frame in the user's code (not importlib's machinery, the standard library or installed packages),
    else the deepest frame: a `json.loads` failing in a plugin names the plugin's line, not `json/decoder.py`.
    """
    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen ")]
    libraries = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    # The original's `slime` namespace (slime-compat) is library code too, also when installed editable: a module it
    # does not carry fails inside its stub, and the line to name is the plugin's import of it.
    compat = sys.modules.get("slime")
    libraries.update(os.path.join(p, "") for p in getattr(compat, "__path__", []))
    own = [f for f in frames if not f.filename.startswith(tuple(libraries))]
    frame = (own or frames or [None])[-1]
    return f" at {frame.filename}:{frame.lineno}" if frame is not None else ""


@cache
def _load(path: str, flag: str) -> Any:
    module_name, attr_path = _split_path(path, flag)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # Distinguish "the plugin module is missing" from "the plugin module imports something missing".
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            if path in BUILTIN_FALLBACKS:
                logger.info("%s %s: module %r not found; using the built-in %s", flag, path, module_name,
                            BUILTIN_FALLBACKS[path])  # fmt: skip
                return _load(BUILTIN_FALLBACKS[path], flag)
            if module_name.startswith("slime."):  # the original's namespace: slime-compat, not the user's PYTHONPATH
                why = (
                    "slime-compat, which provides the original's `slime` namespace, is not installed"
                    if e.name == "slime"
                    else f"slime-compat has no {e.name!r}; MIGRATION.md 'Plugins' lists the modules it carries"
                )
                message = f"{flag}: {path!r} is the original slime's; this version does not provide it ({why})"
                raise PluginError(message) from e
            raise PluginError(
                f"{flag}: module {module_name!r} not found (from {path!r}); is the directory holding it on "
                "PYTHONPATH? (the run's workers get the launching shell's)"
            ) from e
        error = PluginError(f"{flag}: importing module {module_name!r} failed{_origin(e)}: {e}")
        error.missing_dependency = e.name
        raise error from e
    except (Exception, SystemExit) as e:  # a module calling sys.exit() at import ended the run with no word
        raise PluginError(
            f"{flag}: importing module {module_name!r} failed{_origin(e)}: {type(e).__name__}: {e}"
        ) from e
    obj: Any = module
    for part in attr_path.split("."):  # `module:Class.method` style nested attributes.
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise PluginError(f"{flag}: module {module_name!r} has no attribute {attr_path!r} (from {path!r})") from e
    return obj


def forget_loaded_plugins() -> None:
    """Empties `load_function`'s per-path cache: the next load imports from `sys.modules` (or afresh) again.

    For a process that re-imports plugin modules (tests that put stand-ins on `sys.path` and drop them from
    `sys.modules`): without it, a path loaded before returns the function of the module object it loaded then.
    """
    _load.cache_clear()


def load_function(path: str, *, flag: str) -> Callable[..., Any]:
    """Imports the callable named by `path` (cached per path; `forget_loaded_plugins` empties the cache).

    Args:
        path: `package.module.attr` or `package.module:attr` (the attribute may be dotted after `:`,
            e.g. `pkg.mod:Class.method`); an original slime path of `PATH_ALIASES` is translated first, and one of
            `BUILTIN_FALLBACKS` whose module is not importable loads the built-in function instead.
        flag: The flag that gave the path (e.g. `--custom-rm-path`), used in error messages.

    Returns:
        The callable (function or class).

    Raises:
        PluginError: (an `ImportError`) the path is malformed, the module is missing or fails to
            import (also by `sys.exit()`; the message names the file and line it failed at), the attribute is
            missing, or the object is not callable. The original exception is chained as `__cause__`.
    """
    obj = _load(PATH_ALIASES.get(path, path), flag)
    if not callable(obj):
        raise PluginError(f"{flag}: {path!r} is a {type(obj).__name__}, not a callable")
    return obj


async def call_maybe_async(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Calls `fn` and awaits the result when it is awaitable (sync and async plugins alike)."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result
