"""The original's `slime.agent.adapters`: `OpenAIAdapter` (`slime_rollout.agent.OpenAIAdapter`).

`AnthropicAdapter` and `BaseAdapter` are not carried: asking for one raises the one-line error of its module
(`slime.agent._not_carried`).
"""

import importlib

from slime.agent.adapters.openai import OpenAIAdapter

__all__ = ["OpenAIAdapter"]

# The original's other names here, and the module that held each.
_NOT_CARRIED = {"AnthropicAdapter": "slime.agent.adapters.anthropic", "BaseAdapter": "slime.agent.adapters.common"}


def __getattr__(name: str):
    """Imports the stub module of a name that is not carried, which raises its ModuleNotFoundError."""
    if name in _NOT_CARRIED:
        importlib.import_module(_NOT_CARRIED[name])
    raise AttributeError(f"module 'slime.agent.adapters' has no attribute {name!r}")
