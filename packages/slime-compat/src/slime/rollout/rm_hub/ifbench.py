"""`slime.rollout.rm_hub.ifbench`: IFBench instruction following (original module path).

Importing it fetches nothing (the original `git clone`s allenai/IFBench at import); IFBench's `evaluation_lib` must be
importable when a response is scored (`slime_rollout.rewards.ifbench`).
"""

from __future__ import annotations

from typing import Any

from slime_rollout.rewards.ifbench import ifbench_reward

__all__ = ["compute_ifbench_reward"]


def compute_ifbench_reward(response: str | None, label: Any, metadata: dict[str, Any] | None = None) -> float:
    """1.0 if `response` follows every instruction `metadata` names, else 0.0 (the original signature).

    A None response scores 0.0, as in the original; `label` is not read. Bad metadata raises `ValueError`
    (`slime_rollout.rewards.ifbench.ifbench_reward`).
    """
    if response is None:
        return 0.0
    return ifbench_reward(response, metadata)
