"""Original slime flags that this version parses but does not implement.

Launch scripts from the original carry these flags, so they stay parseable (and listed in `--help`), but a
flag that changes nothing must not pass silently: setting one to anything but its default is a
`ConfigError` that names the flag and says what to do instead. A flag leaves this table when it is
implemented; `tests/slime-core/test_config_honored.py` checks that every field is either read by some
code or listed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, field_to_flag

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["UNSUPPORTED", "check_unsupported"]

# field name -> why it is not implemented / what to use instead (one clause, shown after the flag).
UNSUPPORTED: dict[str, str] = {}


def check_unsupported(args: SlimeArgs) -> None:
    """Rejects any flag of `UNSUPPORTED` set to a value other than its default.

    Raises:
        ConfigError: the first such flag, e.g. "--use-fault-tolerance is not implemented in this version
            (engine health monitoring ...); remove it".
    """
    fields = type(args).model_fields
    for name, reason in UNSUPPORTED.items():
        if getattr(args, name) != fields[name].get_default(call_default_factory=True):
            raise ConfigError(f"{field_to_flag(name)} is not implemented in this version ({reason}); remove it")
