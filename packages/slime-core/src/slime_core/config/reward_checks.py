"""Cross-flag rules of the reward flags that need no reward registry (`--rm-type` with `--rm-url`).

Which `--rm-type` names exist is the reward registry's business; this module only checks what the flags say of
each other, so that `--dry-run` refuses a run that would otherwise die at its first reward call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["REMOTE_RM_TYPES", "check_reward_flags"]

# The built-in reward types that post each response to a reward server at `--rm-url`.
REMOTE_RM_TYPES = ("remote_rm", "boxed_remote_rm")


def check_reward_flags(args: SlimeArgs) -> None:
    """Refuses a remote `--rm-type` without `--rm-url` (a `--custom-rm-path` function scores instead of it).

    Raises:
        ConfigError: one line naming `--rm-type` and `--rm-url`.
    """
    if args.rm_type in REMOTE_RM_TYPES and not args.rm_url and args.custom_rm_path is None:
        raise ConfigError(
            f"--rm-type {args.rm_type} posts each response to a reward server, but --rm-url is not set: give "
            "--rm-url http://host:port/path (or score with --custom-rm-path)"
        )
