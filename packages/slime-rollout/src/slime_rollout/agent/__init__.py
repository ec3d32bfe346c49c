"""Agent adapters: OpenAI-compatible endpoints in front of the engines that record agent episodes for training.

`OpenAIAdapter` (`openai_adapter`) serves `/v1/chat/completions`; `trajectory` keeps each session's token streams;
`openai_wire` validates requests and frames replies; `output_parsing` reads tool calls and reasoning from the
model's text.
"""

from slime_rollout.agent.openai_adapter import OpenAIAdapter

__all__ = ["OpenAIAdapter"]
