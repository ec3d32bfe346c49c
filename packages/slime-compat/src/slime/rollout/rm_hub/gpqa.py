"""`slime.rollout.rm_hub.gpqa`: the multiple-choice grader (original module path)."""

from slime_rollout.rewards.gpqa import gpqa_reward as compute_gpqa_reward

__all__ = ["compute_gpqa_reward"]
