"""`slime.rollout.filter_hub.dynamic_sampling_filters`: the built-in group filters (original module path)."""

from slime_rollout.generation.filters import check_reward_nonzero_std, check_reward_nonzero_std_with_fallback

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]
