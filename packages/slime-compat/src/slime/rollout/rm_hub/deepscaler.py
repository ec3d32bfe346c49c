"""`slime.rollout.rm_hub.deepscaler`: the DeepScaleR grader (original module path)."""

from slime_rollout.rewards.math import deepscaler_reward

__all__ = ["get_deepscaler_rule_based_reward"]


def get_deepscaler_rule_based_reward(response: str, label: object) -> int:
    r"""1 if the last `\boxed{}` after `</think>` (else `###Response`) equals the label, else 0."""
    return int(deepscaler_reward(response, label))
