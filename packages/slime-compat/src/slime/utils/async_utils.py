"""`slime.utils.async_utils`: `run(coro)` on the rollout's background event loop (original module path)."""

from slime_rollout.runtime.async_utils import run

__all__ = ["run"]
