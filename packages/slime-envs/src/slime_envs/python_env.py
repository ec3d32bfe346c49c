"""`python` environment (ReTool): a sandboxed `code_interpreter` tool.

The model calls `<tool_call>{"name": "code_interpreter", "arguments": {"code": "..."}}</tool_call>`;
the code runs in `slime_envs.sandbox` (bubblewrap namespaces as an unprivileged uid, seccomp, no network,
read-only runtime, private tmpfs, time/memory/process/output limits) and its output or error is the tool
response. A turn without a tool call is the final answer; scoring (math grading) is left to the reward
function on the rollout side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from slime_envs.base import ToolEnv
from slime_envs.sandbox import SandboxConfig, SandboxUnavailableError, check_sandbox, run_python

__all__ = ["PythonEnv"]


class PythonEnv(ToolEnv):
    """Code interpreter environment.

    Args:
        max_tool_calls: total code executions per episode.
        max_calls_per_turn: code executions per model turn.
        max_response_chars: `ToolEnv`'s cut of one response (the sandbox's `max_output_chars` cuts first).
        tool_timeout_s: `ToolEnv`'s deadline of one call, off by default: the sandbox's `timeout_s` bounds a run.
        **sandbox: `SandboxConfig` fields (`timeout_s`, `memory_mb`, `max_processes`, `max_output_chars`, ...).

    Raises:
        pydantic.ValidationError: an unknown or invalid sandbox setting.
        slime_envs.sandbox.SandboxUnavailableError: the sandbox cannot run on this machine (the message
            names what is missing); raised here, once, rather than as an error observation on every call. If it
            stops working later, `step` raises it (the sample fails), never shows it to the model.
    """

    infrastructure_errors = (SandboxUnavailableError,)

    tool_specs = [
        {
            "type": "function",
            "function": {
                "name": "code_interpreter",
                "description": "Run Python code and return what it prints (stdout and errors).",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "Python source to execute."}},
                    "required": ["code"],
                },
            },
        }
    ]

    def __init__(
        self,
        *,
        max_tool_calls: int = 16,
        max_calls_per_turn: int = 4,
        max_response_chars: int = 16_000,
        tool_timeout_s: float | None = None,
        **sandbox: Any,
    ) -> None:
        super().__init__(
            max_tool_calls=max_tool_calls,
            max_calls_per_turn=max_calls_per_turn,
            max_response_chars=max_response_chars,
            tool_timeout_s=tool_timeout_s,
        )
        self.sandbox_config = SandboxConfig(**sandbox)
        check_sandbox()
        self.results: list[Any] = []

    def tool_functions(self) -> dict[str, Callable[..., Awaitable[str]]]:
        """`code_interpreter(code)`."""
        return {"code_interpreter": self._run}

    async def _run(self, code: str) -> str:
        if not isinstance(code, str) or not code.strip():
            return "Error: 'code' must be a non-empty string of Python source."
        result = await run_python(code, self.sandbox_config)
        self.results.append(result)
        return result.to_observation()
