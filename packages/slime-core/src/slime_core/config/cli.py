"""`parse_args`: the command line (original slime flag names) and YAML files -> `SlimeArgs`.

The argparse parser is generated from the `SlimeArgs` fields, so flags and config fields cannot
drift apart. Precedence, lowest first: field defaults, `--config file.yaml`, command-line flags,
`--custom-config-path file.yaml` (the original's "override any attribute" file).

Pass-through flags are collected instead of parsed:

* `--sglang-<field> [value...]` -> `args.sglang_args[<field>]` (`True` when no value follows),
* `--router-<field> [value...]` -> `args.router_args[<field>]`,
* known Megatron-LM flags (`megatron_flags.MEGATRON_FLAGS`) -> raw tokens in `args.megatron_args`.

Any other flag is an error: one of Megatron-LM's (`megatron_lm_flags`) says so, and what to use instead where there
is an equivalent; anything else is "unknown flag", with the closest slime flag when one is close.

Run `python -m slime_core.config --help` to list every flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import types
import typing
from collections.abc import Sequence
from functools import cache
from typing import Any, Literal, NoReturn

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from slime_core.config.args import SlimeArgs, config_error_from_validation
from slime_core.config.base import ConfigError, field_to_flag
from slime_core.config.megatron_flags import MEGATRON_FLAGS
from slime_core.config.megatron_lm_flags import unsupported_megatron_lm_flag
from slime_core.config.unsupported import (
    UNSUPPORTED,
    UNSUPPORTED_FLAG_DEFAULTS,
    UNSUPPORTED_FLAGS,
    unsupported_flag_note,
)

__all__ = ["YamlConfig", "build_parser", "load_yaml_config", "parse_args"]

PassThrough = dict[str, str | bool | list[str]]


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises `ConfigError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _add_field(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, field: FieldInfo) -> None:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    flags = [field_to_flag(name), *extra.get("aliases", [])]
    help_text = (field.description or "").replace("%", "%%")
    if name in UNSUPPORTED:
        help_text = f"NOT IMPLEMENTED ({UNSUPPORTED[name]}). ".replace("%", "%%") + help_text
    if not field.is_required() and field.default not in (None, False, [], {}):
        help_text += f" (default: {field.default})".replace("%", "%%")
    if extra.get("registry"):
        from slime_core.extensions import registered_names

        names = ", ".join(registered_names(extra["registry"]))
        help_text += f" Registered: {names} (entry-point group {extra['registry']})."
    annotation = _unwrap_optional(field.annotation)
    origin = typing.get_origin(annotation)
    kwargs: dict[str, Any] = {"dest": name, "help": help_text}
    if annotation is bool:
        # store_true like the original; tri-state or default-on booleans also get a --no-<flag>.
        kwargs["action"] = "store_true" if field.default is False else argparse.BooleanOptionalAction
    elif origin is list:
        (item,) = typing.get_args(annotation)
        kwargs.update(nargs=extra.get("nargs", "+"), action="extend")
        if typing.get_origin(item) is Literal:
            kwargs["choices"] = typing.get_args(item)
        else:
            kwargs["type"] = item
    elif origin is dict or annotation is dict:
        kwargs["type"] = str  # A JSON object string; the field validator parses it.
        kwargs["metavar"] = "JSON"
    elif origin is Literal:
        choices = typing.get_args(annotation)
        kwargs.update(choices=choices, type=type(choices[0]))
    else:
        kwargs["type"] = annotation
    parser.add_argument(*flags, **kwargs)


@cache
def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for every command-line `SlimeArgs` field (flags not given stay absent)."""
    parser = _RaisingParser(
        prog="slime",
        # argparse's generated usage line lists all ~250 flags (180 lines); the grouped help below has them.
        usage="slime [--config RUN.yaml] [FLAG VALUE ...]",
        description="slime RL post-training. --sglang-*, --router-* and Megatron-LM flags are passed through.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--config", help="YAML file of config fields (dash or underscore keys); flags override it.")
    for group in reversed(SlimeArgs.__bases__):  # one help section per concern, in reading order
        section = parser.add_argument_group(group.__name__, (group.__doc__ or "").split("\n")[0])
        for name, field in group.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("cli", True):
                _add_field(section, name, field)
    # Original flags that are no field here are refused in one line by `_split_argv`; listed so that `--help` shows
    # every original flag, these too, with what to use instead.
    section = parser.add_argument_group(
        "Not implemented", "Original flags this version does not implement: one given stops the run in one line."
    )
    for flag in sorted(UNSUPPORTED_FLAGS):
        note = f"NOT IMPLEMENTED ({unsupported_flag_note(flag)})."
        section.add_argument(flag, dest=f"unsupported{flag}", nargs="?", metavar="VALUE", help=note.replace("%", "%%"))
    return parser


def _is_flag(token: str) -> bool:
    return (token.startswith("--") and len(token) > 2) or token == "-h"


def _suggest(name: str, known: Sequence[str]) -> str:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def _store_passthrough(target: PassThrough, key: str, inline: str | None, values: list[str]) -> None:
    key = key.replace("-", "_")
    if inline is not None:
        target[key] = inline
    elif not values:
        target[key] = True
    else:
        target[key] = values[0] if len(values) == 1 else list(values)


def _split_argv(argv: Sequence[str]) -> tuple[list[str], PassThrough, PassThrough, list[str]]:
    """Separates slime flags (for argparse) from SGLang, router and Megatron pass-through flags."""
    parser = build_parser()
    # Includes --no-<flag> of optional booleans; the help-only entries of UNSUPPORTED_FLAGS are refused below.
    slime_flags = set(parser._option_string_actions) - set(UNSUPPORTED_FLAGS)
    slime, sglang, router, megatron = [], {}, {}, []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not _is_flag(token):
            raise ConfigError(f"unexpected value {token!r}: values must follow a --flag")
        end = i + 1
        while end < len(argv) and not _is_flag(argv[end]):
            end += 1
        name, eq, inline = token.partition("=")
        values = list(argv[i + 1 : end])
        if name in slime_flags:
            if values and parser._option_string_actions[name].nargs == 0:
                raise ConfigError(f"{name} is a switch and takes no value, got {' '.join(values)!r}")
            slime += argv[i:end]
        elif name.startswith("--sglang-"):
            _store_passthrough(sglang, name.removeprefix("--sglang-"), inline if eq else None, values)
        elif name.startswith("--router-"):
            _store_passthrough(router, name.removeprefix("--router-"), inline if eq else None, values)
        elif name in MEGATRON_FLAGS:
            megatron += argv[i:end]
        elif name in UNSUPPORTED_FLAGS:
            given = inline if eq else " ".join(values)
            if name in UNSUPPORTED_FLAG_DEFAULTS and given == UNSUPPORTED_FLAG_DEFAULTS[name]:
                i = end  # the original's default, which is what this version does
                continue
            raise ConfigError(f"{name} is not implemented in this version ({unsupported_flag_note(name)}); remove it")
        elif (refusal := unsupported_megatron_lm_flag(name)) is not None:
            # The original passes it to Megatron-LM's parser: not a typo, so no "did you mean" guess.
            raise ConfigError(refusal)
        else:
            known = sorted(slime_flags | MEGATRON_FLAGS)
            raise ConfigError(f"unknown flag {name}{_suggest(name, known)}")
        i = end
    return slime, sglang, router, megatron


def _is_flag_value(value: Any) -> bool:
    """A YAML value a command-line flag can carry: a scalar (or null: a bare flag), or a list of scalars."""
    if isinstance(value, list):
        return all(not isinstance(v, dict | list) for v in value)
    return not isinstance(value, dict)


def _yaml_scalar_to_str(value: Any) -> str | bool | list[str]:
    if isinstance(value, bool):
        return value
    if isinstance(value, list):
        return [str(v) for v in value]
    return str(value)


def _key_lines(path: str, text: str, flag: str) -> dict[str, int]:
    """Line of every top-level key.

    A key given twice (`lr` and `lr`, or `rollout-seed` and `rollout_seed`) is an error naming both lines: PyYAML
    keeps the last value and drops the other without a word.
    """
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is None:
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: expected a mapping of config fields")
    lines: dict[str, int] = {}
    first: dict[str, tuple[str, int]] = {}  # the key as one spelling (underscores) -> (as written, line)
    for key_node, _ in node.value:
        raw, line = str(key_node.value), key_node.start_mark.line + 1
        same = raw.replace("-", "_")
        if same in first:
            was, was_line = first[same]
            raise ConfigError(
                f"{flag} {path}:{line}: key {raw!r} is given twice (first as {was!r} on line {was_line}); keep one"
            )
        first[same] = (raw, line)
        lines[raw] = line
    return lines


@dataclasses.dataclass(kw_only=True, slots=True)
class YamlConfig:
    """A YAML config file split by destination.

    Attributes:
        fields: Values of `SlimeArgs` fields keyed by field name; `sglang-<x>` / `router-<x>` keys are
            merged into `sglang_args` / `router_args`, known Megatron flag names into `megatron_args`.
        unknown: Keys (underscored) that are none of these, with their values.
        where: `"path:line"` of every top-level key (underscored), for error messages.
    """

    fields: dict[str, Any]
    unknown: dict[str, Any]
    where: dict[str, str]


def load_yaml_config(path: str | os.PathLike[str], *, flag: str = "--config") -> YamlConfig:
    """Reads a YAML config file of `SlimeArgs` fields (keys may use dashes or underscores).

    Args:
        path: YAML file.
        flag: The flag that named the file (for error messages).

    Returns:
        The file's content split into fields, pass-through flags and unknown keys.

    Raises:
        ConfigError: The file is missing, is not valid YAML, or is not a mapping.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot read file ({e.strerror})") from e
    except UnicodeDecodeError as e:  # it said only "'utf-8' codec can't decode byte 0xff in position 23"
        line = e.object[: e.start].count(b"\n") + 1
        raise ConfigError(f"{flag} {path}:{line}: not UTF-8 (byte {e.object[e.start]:#04x}); re-encode it") from None
    try:
        lines = _key_lines(path, text, flag)
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise ConfigError(f"{flag} {where}: invalid YAML ({getattr(e, 'problem', e)})") from e
    config = YamlConfig(fields={}, unknown={}, where={})
    sglang: PassThrough = {}
    router: PassThrough = {}
    megatron: list[str] = []
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        dashed = field_to_flag(key)
        config.where[key] = f"{path}:{lines.get(str(raw_key), '?')}"
        passed_through = key.startswith(("sglang_", "router_")) or dashed in MEGATRON_FLAGS
        if passed_through and key not in SlimeArgs.model_fields and not _is_flag_value(value):
            # A mapping (or a list holding one) became its Python repr on the engine's or Megatron's command line
            # (`--num-layers "{'a': 1}"`), refused there minutes later without the file's name.
            raise ConfigError(
                f"{flag} {config.where[key]}: {dashed} is passed through as a command-line flag: its value must be a "
                f"scalar or a list of scalars, not {type(value).__name__} {value!r:.80}"
            )
        if key in SlimeArgs.model_fields:
            config.fields[key] = value
        elif key.startswith("sglang_"):
            sglang[key.removeprefix("sglang_")] = _yaml_scalar_to_str(value)
        elif key.startswith("router_"):
            router[key.removeprefix("router_")] = _yaml_scalar_to_str(value)
        elif dashed in MEGATRON_FLAGS:
            if value is True or value is None:
                megatron.append(dashed)
            elif value is not False:
                megatron += [dashed, *(map(str, value) if isinstance(value, list) else [str(value)])]
        else:
            config.unknown[key] = value
    if sglang:
        config.fields["sglang_args"] = {**config.fields.get("sglang_args", {}), **sglang}
    if router:
        config.fields["router_args"] = {**config.fields.get("router_args", {}), **router}
    if megatron:
        config.fields["megatron_args"] = [*config.fields.get("megatron_args", []), *megatron]
    return config


# Fields a YAML file fills piece by piece (one key per engine, router or Megatron flag).
_MERGED = ("sglang_args", "router_args", "megatron_args")


def _merged(earlier: Any, later: Any) -> Any:
    """`later` on top of `earlier`.

    Dicts key by key, flag lists one after the other (Megatron's parser keeps the last value of a flag); anything
    else (a malformed value, left to validation) replaces.
    """
    if isinstance(earlier, dict) and isinstance(later, dict):
        return {**earlier, **later}
    if isinstance(earlier, list) and isinstance(later, list):
        return [*earlier, *later]
    return later


def parse_args(argv: Sequence[str] | None = None) -> SlimeArgs:
    """Parses a slime command line (and the YAML files it names) into a validated `SlimeArgs`.

    Args:
        argv: Command-line tokens without the program name; None reads `sys.argv[1:]`.

    Returns:
        The validated config with all derived values filled.

    Raises:
        ConfigError: Unknown flag (with a close-match suggestion; a Megatron-LM flag slime does not carry is named as
            one, with what to use instead where there is an equivalent), bad value, unreadable or invalid
            YAML (with file and line), or a broken validation rule (naming the flags).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    slime_tokens, sglang, router, megatron = _split_argv(argv)
    cli = vars(build_parser().parse_args(slime_tokens))

    values: dict[str, Any] = {}
    where: dict[str, str] = {}  # field -> "file:line" for values that came from a YAML file
    config_path = cli.pop("config", None)
    if config_path is not None:
        config = load_yaml_config(config_path)
        if config.unknown:
            key = next(iter(config.unknown))
            known = [field_to_flag(k).removeprefix("--") for k in SlimeArgs.model_fields]
            dashed = key.replace("_", "-")
            refusal = unsupported_megatron_lm_flag(f"--{dashed}")
            if refusal is not None:
                raise ConfigError(f"--config {config.where[key]}: {refusal}")
            raise ConfigError(f"--config {config.where[key]}: unknown key {dashed!r}{_suggest(dashed, known)}")
        values, where = config.fields, config.where
    values.update(cli)
    for name in cli:
        where.pop(name, None)
    values["sglang_args"] = {**values.get("sglang_args", {}), **sglang}
    values["router_args"] = {**values.get("router_args", {}), **router}
    values["megatron_args"] = [*values.get("megatron_args", []), *megatron]

    custom_path = values.get("custom_config_path")
    if custom_path is not None:
        # Original semantics: this file overrides any attribute; keys that are not slime fields are
        # settings for the user's own plugins and land in args.custom_config.
        custom = load_yaml_config(custom_path, flag="--custom-config-path")
        # Per attribute, as the original's setattr loop: a `sglang-*`, `router-*` or Megatron key overrides that one
        # setting, not every other one given on the command line or in --config.
        for name, value in custom.fields.items():
            values[name] = _merged(values.get(name), value) if name in _MERGED else value
        where.update({k: v for k, v in custom.where.items() if k in custom.fields})
        values["custom_config"] = {**values.get("custom_config", {}), **custom.unknown}
    try:
        return SlimeArgs.model_validate(values)
    except ValidationError as e:
        raise config_error_from_validation(e, where=where) from None
