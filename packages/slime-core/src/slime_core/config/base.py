"""Shared pieces of the run config: the error type, the group base model and flag-name helpers.

Every concern (cluster, rollout, algorithm, ...) is a pydantic model deriving from `ArgsGroup`;
`slime_core.config.args.SlimeArgs` inherits all of them so that attributes stay flat
(`args.rollout_batch_size`), as user plugins of the original slime expect.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ArgsGroup",
    "ConfigError",
    "arg",
    "field_to_flag",
    "flag_to_field",
    "non_default",
    "parse_json_dict",
    "warn_once",
    "warnings_silenced",
]

logger = logging.getLogger(__name__)

_WARNED: set[str] = set()
_SILENCED: contextvars.ContextVar[bool] = contextvars.ContextVar("slime_config_warnings_silenced", default=False)


class ConfigError(ValueError):
    """A bad run configuration; the message is one line and names the offending flag (or file and line)."""


class ArgsGroup(BaseModel):
    """Base of every config group: unknown keys are errors, attributes are plain Python values.

    Floats must be finite: `--rollout-temperature inf` or `--kl-loss-coef nan` passed every range check (`nan` fails
    none, `inf` passes `gt=0`) and turned the math into NaN or uniform noise; no flag means anything by them.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def arg(
    default: Any = None,
    help: str = "",
    *,
    cli: bool = True,
    aliases: tuple[str, ...] = (),
    registry: str | None = None,
    nargs: str | None = None,
    **kwargs: Any,
) -> Any:
    """Declares a config field; `help` becomes the field description and the `--flag` help text.

    Args:
        default: Default value (as in the original slime).
        help: One-sentence help text.
        cli: False for fields not generated as a command-line flag (pass-through collections).
        aliases: Extra option strings for the flag (e.g. `("--async",)`).
        registry: the entry-point group whose names the value must be (`slime_core.extensions`); the CLI's
            help lists the registered names. The field's validator calls `check_registered`.
        nargs: a list flag's argparse `nargs` ("+" when None); "*" where the original takes the flag with no value.
        **kwargs: Passed to `pydantic.Field` (e.g. `gt=0`).

    Returns:
        A pydantic `FieldInfo`.
    """
    extra = kwargs.pop("json_schema_extra", {}) or {}
    if not cli:
        extra["cli"] = False
    if aliases:
        extra["aliases"] = list(aliases)
    if registry:
        extra["registry"] = registry
    if nargs:
        extra["nargs"] = nargs
    return Field(default, description=help, json_schema_extra=extra or None, **kwargs)


def check_registered(value: str, *, group: str, flag: str) -> str:
    """Returns `value` when the registry of entry-point group `group` has it (imports no provider).

    Raises:
        ConfigError: an unregistered name; the message names the flag, lists the registered names and says which
            entry-point group a package adds one to.
    """
    from slime_core.extensions import registry_for_group  # extensions imports no config module

    try:
        registry_for_group(group).check_name(value)
    except KeyError as e:
        message = str(e.args[0])
        raise ConfigError(message if message.startswith(flag) else f"{flag}: {message}") from None
    return value


def field_to_flag(name: str) -> str:
    """`rollout_batch_size` -> `--rollout-batch-size`."""
    return "--" + name.replace("_", "-")


def non_default(args: Any, names: Iterable[str]) -> list[str]:
    """The fields of `names` that `args` sets to something other than their default, in order.

    The one test of "is this flag set?" for every check of the config (unsupported flags, estimator flags, flags of
    a feature that is off). A field with a `default_factory` (a list or dict flag) is compared with what the
    factory makes, not with pydantic's "no default" marker, which no value equals.

    Args:
        args: the config: a pydantic model (its class's fields and defaults are read), or validation's writable
            view of a `SlimeArgs` (`SlimeArgs`' fields).
        names: field names of that model.

    Raises:
        AttributeError: a name that is not a field of the model.
    """
    from slime_core.config.args import SlimeArgs  # the class (`args` may be validation's writable view)

    fields = type(args).model_fields if isinstance(args, BaseModel) else SlimeArgs.model_fields
    return [n for n in names if getattr(args, n) != fields[n].get_default(call_default_factory=True)]


def flag_to_field(flag: str) -> str:
    """`--rollout-batch-size` (or `rollout-batch-size`) -> `rollout_batch_size`."""
    return flag.lstrip("-").replace("-", "_")


def parse_json_dict(value: Any, *, flag: str) -> Any:
    """Parses a JSON object given as a string on the command line (`--train-env-vars '{"A": "1"}'`).

    Args:
        value: A dict (from YAML or Python), a JSON string, or None.
        flag: Flag name for the error message.

    Returns:
        The dict (or None).

    Raises:
        ConfigError: The string is not valid JSON or not a JSON object.
    """
    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value) if value.strip() else {}
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag}: not valid JSON ({e.msg} at char {e.pos}): {value!r}") from e
    if not isinstance(parsed, dict):
        raise ConfigError(f"{flag}: expected a JSON object, got {type(parsed).__name__}: {value!r}")
    return parsed


def warn_once(key: str, message: str) -> None:
    """Logs `message` as a warning the first time `key` is seen in this process.

    Config objects are re-validated wherever they are deserialized (every Ray worker), so warnings
    about settings that have no effect would otherwise repeat.
    """
    if key in _WARNED or _SILENCED.get():
        return
    _WARNED.add(key)
    logger.warning(message)


@contextlib.contextmanager
def warnings_silenced(silenced: bool) -> Iterator[None]:
    """Within the block, `warn_once` says nothing (and remembers nothing) when `silenced` is true.

    For checks whose warnings concern training only, in a run that trains nothing (`--num-rollout 0`, an eval-only
    run): their advice does not apply there.
    """
    token = _SILENCED.set(silenced)
    try:
        yield
    finally:
        _SILENCED.reset(token)
