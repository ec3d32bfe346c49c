"""The SGLang server flags slime sets itself, and the check that no `--sglang-*` pass-through flag reaches them.

slime launches each engine with `--model-path`, `--tp-size` (= `--rollout-num-gpus-per-engine`), `--port`, ... and
appends the `--sglang-*` flags after them (`slime_rollout.engines.launch.sglang`). SGLang parses that command line with
argparse, where the last value wins and an option may be given by any other option string of the same field (an
alias) or by an unambiguous prefix (argparse's `allow_abbrev`, on in SGLang 0.5.16). So `--sglang-tp 4` or
`--sglang-tensor-parallel-size 4` would silently override the engine size slime planned its GPUs for.

Rule: a pass-through name is refused when it is an option string of a field slime sets (its own name or an alias,
per SGLang 0.5.16's `ServerArgs`) or a proper prefix of one. In SGLang 0.5.16 no other option string is a prefix
of one of these, so a refused prefix is either expanded to slime's flag or rejected by SGLang as ambiguous.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from slime_core.config.base import ConfigError

__all__ = [
    "MANAGED_SGLANG_FIELDS",
    "SGLANG_FIELD_ALIASES",
    "check_managed_sglang_flags",
    "managed_sglang_field",
    "sglang_field",
    "sglang_fields",
    "sglang_flag_value",
]

# ServerArgs fields slime computes itself (slime_rollout.engines.launch.sglang.build_sglang_command).
MANAGED_SGLANG_FIELDS = frozenset(
    {
        "model_path",
        "tp_size",
        "port",
        "nccl_port",
        "base_gpu_id",
        "random_seed",
        "enable_memory_saver",
        "skip_server_warmup",
        "nnodes",
        "node_rank",
        "dist_init_addr",
    }
)

# The other option strings of those fields in SGLang 0.5.16 (`Arg(aliases=[...])` in sglang/srt/server_args.py).
SGLANG_FIELD_ALIASES = {
    "model_path": ("model",),
    "tp_size": ("tensor_parallel_size",),
    "dist_init_addr": ("nccl_init_addr",),
}

# option name (underscores, no dashes) -> the field it sets
_OPTIONS = {name: field for field in MANAGED_SGLANG_FIELDS for name in (field, *SGLANG_FIELD_ALIASES.get(field, ()))}


def sglang_field(key: str) -> str:
    """The `ServerArgs` field of a pass-through key: `sglang-context-length`, `context-length` -> `context_length`.

    The keys of `sglang_args` are spelled as the CLI or a config file gave them (dashes or underscores, with or
    without the `sglang` prefix).
    """
    return key.replace("-", "_").removeprefix("sglang_")


def sglang_fields(sglang_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """`sglang_args` keyed by field (`sglang_field`): `{"context-length": "40"}` -> `{"context_length": "40"}`."""
    return {sglang_field(k): v for k, v in (sglang_args or {}).items()}


def sglang_flag_value(sglang_args: Mapping[str, Any] | None, field: str) -> Any:
    """The value of the pass-through flag setting `field`, as the original's `args.sglang_<field>` holds it.

    The original parses SGLang's flags with SGLang's own argparse types; here they are kept as given (command-line
    strings). A number is given back as a number (`"2"` -> 2, `"0.7"` -> 0.7), so that `args.sglang_dp_size or 1`
    multiplies and compares as there; a switch is True, a list stays a list, any other text is the text.

    Args:
        sglang_args: `SlimeArgs.sglang_args`.
        field: the `ServerArgs` field (`tool_call_parser`).

    Raises:
        KeyError: the flag was not given (the original would hold SGLang's default, which this package does not know).
    """
    value = sglang_fields(sglang_args)[field]
    if isinstance(value, str):
        for number in (int, float):
            try:
                return number(value)
            except ValueError:
                pass
    return value


def _option_key(name: str) -> str:
    """`--sglang-tp-size=4` -> `tp_size`."""
    return sglang_field(name.split("=", 1)[0].removeprefix("--"))


def managed_sglang_field(name: str) -> str | None:
    """The field slime sets that the pass-through option `name` would set, else None.

    Args:
        name: an option name with or without `--`/`--sglang-`, dashes or underscores, an `=value` suffix allowed
            (`tp`, `--sglang-tensor-parallel-size`, `tp_size=4`).

    Returns:
        The managed `ServerArgs` field (`tp_size`), or None when `name` is not one of its option strings nor a
        prefix of one.
    """
    key = _option_key(name)
    if not key:
        return None
    if key in _OPTIONS:
        return _OPTIONS[key]
    matches = sorted({field for option, field in _OPTIONS.items() if option.startswith(key)})
    return matches[0] if matches else None


def check_managed_sglang_flags(names: Iterable[str]) -> None:
    """Refuses pass-through `--sglang-*` names that would set a flag slime sets itself (see the module doc).

    Args:
        names: the keys of `sglang_args` (or CLI tokens).

    Raises:
        ConfigError: one line naming the flag, the field it reaches and what to use instead.
    """
    for name in names:
        field = managed_sglang_field(name)
        if field is None:
            continue
        key = _option_key(name)
        flag = "--sglang-" + key.replace("_", "-")
        how = "SGLang's" if key == field else "an alias of" if key in _OPTIONS else "an abbreviation of"
        hint = " (set the engine size with --rollout-num-gpus-per-engine)" if field == "tp_size" else ""
        raise ConfigError(
            f"{flag}: {how} --{field.replace('_', '-')}, which slime sets itself for every engine and cannot be "
            f"passed through{hint}"
        )
