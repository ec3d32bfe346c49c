"""Kept path of the documented plugin `--custom-generate-function-path slime_rollout.multi_turn.generate`."""

from slime_rollout.generation.multi_turn import env_reward, generate  # noqa: F401
