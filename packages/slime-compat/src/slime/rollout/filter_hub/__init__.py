"""`slime.rollout.filter_hub`: dynamic-sampling filters (original module path)."""
