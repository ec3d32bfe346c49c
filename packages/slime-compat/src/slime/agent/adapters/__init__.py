"""The original's `slime.agent.adapters`: `OpenAIAdapter` (`slime_rollout.agent.OpenAIAdapter`)."""

from slime.agent.adapters.openai import OpenAIAdapter

__all__ = ["OpenAIAdapter"]
