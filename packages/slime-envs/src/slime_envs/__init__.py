"""slime-envs: multi-turn tool environments (search, sandboxed python, calculator) and tool-call parsing.

Environments implement `slime_core.protocols.Env` and are found by name with `make_env` (built-ins,
the `slime.envs` entry-point group, or an import path).
"""

from slime_envs.parsing import ParsedTurn, ToolCall, extract_answer, parse_tag_action, parse_tool_calls
from slime_envs.registry import available_envs, get_env_factory, make_env, register_env
from slime_envs.rewards import em_with_format, exact_match, f1_score, normalize_answer

__version__ = "0.1.0"

__all__ = [
    "ParsedTurn",
    "ToolCall",
    "available_envs",
    "em_with_format",
    "exact_match",
    "extract_answer",
    "f1_score",
    "get_env_factory",
    "make_env",
    "normalize_answer",
    "parse_tag_action",
    "parse_tool_calls",
    "register_env",
]
