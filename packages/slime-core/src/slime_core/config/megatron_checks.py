"""Applies `MEGATRON_FLAG_RULES` to a config: the Megatron flags it passes, judged for its `--train-backend`.

Called by validation. Architecture flags (`check`) are compared with the HF config by preflight
(`slime_core.config.architecture`), which needs the file; everything else is decided here from the flags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slime_core.config.base import ConfigError, warn_once
from slime_core.config.megatron_flags import MEGATRON_FLAG_RULES
from slime_core.extensions import train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["check_megatron_flags", "megatron_flag_values"]


def megatron_flag_values(tokens: list[str]) -> dict[str, Any]:
    """`["--num-layers", "36", "--swiglu", "--x=1"]` -> `{"--num-layers": "36", "--swiglu": True, "--x": "1"}`.

    A flag followed by several values maps to their list; the last occurrence of a flag wins (as in argparse).
    """
    values: dict[str, Any] = {}
    flag: str | None = None
    for token in tokens:
        if token.startswith("--"):
            name, eq, inline = token.partition("=")
            flag = None if eq else name  # an inline value takes no following tokens
            values[name] = inline if eq else True
        elif flag is not None:
            current = values[flag]
            if current is True:
                values[flag] = token
            else:
                values[flag] = [*current, token] if isinstance(current, list) else [current, token]
    return values


def _same_value(value: Any, neutral: str) -> bool:
    if neutral == "off":
        return value is False
    if isinstance(value, bool) or isinstance(value, list):
        return False
    try:
        return float(value) == float(neutral)
    except ValueError:
        return str(value) == neutral


def check_megatron_flags(args: SlimeArgs) -> None:
    """Rejects Megatron flags the run's backend does not implement; maps FSDP recompute; logs no-op flags once.

    Args:
        args: the config under validation (writable: FSDP's `gradient_checkpointing` may be derived here).

    Raises:
        ConfigError: a flag whose rule for this backend is `error`, or a `neutral` flag with another value;
            the message names the flag and says what to use instead.
    """
    backend = args.train_backend
    native = train_backend_spec(args).megatron_native
    values = megatron_flag_values(list(args.megatron_args))
    noop = []
    for flag, value in values.items():
        rule = MEGATRON_FLAG_RULES.get(flag)
        if rule is None:
            # Only a raw `megatron_args` list (YAML, code) holds flags outside the table: the Megatron backend's own
            # parser judges them (and rejects the ones it does not know); FSDP has nothing to do with them.
            if not native:
                raise ConfigError(f"megatron_args: {flag} is not a Megatron flag slime knows (MIGRATION.md)")
            continue
        kind = rule.megatron if native else rule.fsdp
        if kind == "error":
            raise ConfigError(f"{flag} is not implemented with --train-backend {backend} ({rule.note}); remove it")
        if kind == "neutral" and not _same_value(value, rule.neutral or ""):
            given = flag if value is True else f"{flag} {' '.join(value) if isinstance(value, list) else value}"
            raise ConfigError(
                f"{given} is not implemented with --train-backend {backend}, only {rule.neutral} ({rule.note})"
            )
        if kind == "noop":
            noop.append(flag)
    if not native:
        _fsdp_recompute(args, values)
    if noop:
        warn_once(
            f"megatron_noop_{backend}",
            f"--train-backend {backend}: Megatron flags with no effect on math or memory here (kernel choices, "
            f"Megatron's pretraining loop; MIGRATION.md): {' '.join(sorted(noop))}",
        )


_RECOMPUTE = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers")


def _fsdp_recompute(args: SlimeArgs, values: dict[str, Any]) -> None:
    """Megatron's full recompute of every layer is FSDP's `--gradient-checkpointing`; anything else is an error."""
    granularity = values.get("--recompute-granularity")
    if granularity is None:
        return  # without a granularity Megatron recomputes nothing either; method/num-layers are inert
    method = values.get("--recompute-method", "uniform")
    num_layers = values.get("--recompute-num-layers", "1")
    if granularity == "full" and method == "uniform" and str(num_layers) == "1":
        args.gradient_checkpointing = True
        return
    given = " ".join(f"{flag} {values[flag]}" for flag in _RECOMPUTE if flag in values)
    raise ConfigError(
        f"{given} is not implemented with --train-backend fsdp (FSDP recomputes whole layers only: "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1, i.e. "
        "--gradient-checkpointing)"
    )
