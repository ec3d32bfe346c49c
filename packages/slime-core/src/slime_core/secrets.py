"""Credentials in the config and in command lines: which flags hold one, and how they are shown (`REDACTED`).

Where the config or an engine's command line leaves the process or reaches a log (the W&B run config, the
`--dry-run` listing, the engine launch line), `--wandb-key` and any pass-through `...api-key` flag (SGLang's
`--api-key`/`--admin-api-key`, given as `--sglang-api-key`) are replaced, never their names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["REDACTED", "SECRET_FIELDS", "is_secret_name", "redact_argv", "redact_mapping"]

REDACTED = "REDACTED"

#: Config fields holding credentials.
SECRET_FIELDS: tuple[str, ...] = ("wandb_key",)


def is_secret_name(name: str) -> bool:
    """Whether a field or flag name (dashes or underscores, with or without leading `--`) holds a credential."""
    key = name.lstrip("-").replace("-", "_")
    return key in SECRET_FIELDS or key.endswith("api_key")


def redact_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `values` (field or flag name → value) with every set credential replaced by `REDACTED`."""
    return {k: REDACTED if is_secret_name(k) and v not in (None, False, "") else v for k, v in values.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A copy of a command line with the value of every credential flag (`--api-key X`, `--api-key=X`) replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("--") and "=" in arg and is_secret_name(arg.split("=", 1)[0]):
            out.append(f"{arg.split('=', 1)[0]}={REDACTED}")
        else:
            out.append(arg)
            hide_next = arg.startswith("--") and is_secret_name(arg)
    return out
