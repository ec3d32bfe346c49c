"""`slime.rollout`: the original's rollout entry points, data sources, filters and rewards for plugins."""
