"""`ToolEnv`: the common loop of chat-template tool environments (Qwen3/Hermes `<tool_call>`).

A subclass declares its tools (`tool_specs` for the chat template, `async` methods that run them)
and optionally a `score` for the final answer. `step` parses the model turn, runs each call and
returns the results as tool messages; a turn without tool calls is the final answer and ends the
episode. Nothing the model writes raises: malformed calls, unknown tools, bad arguments and tool
failures all become `Error: ...` tool responses.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from slime_core.protocols import EnvStep
from slime_envs.parsing import ParsedTurn, ToolCall, parse_tool_calls

__all__ = ["ToolEnv"]

logger = logging.getLogger(__name__)

_CALL_FORMAT_HINT = 'Write each call as <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>.'


class ToolEnv:
    """Base of environments driven by `<tool_call>` blocks.

    Subclasses set `tool_specs` (OpenAI-style function specs, as passed to `apply_chat_template(tools=...)`)
    and implement `tool_functions()`; they may override `score`.

    Args:
        max_tool_calls: total tool calls allowed per episode; calls past it are refused with a message
            asking for the final answer.
        max_calls_per_turn: `<tool_call>` blocks answered per model turn, malformed ones included; the blocks
            after them are not run and get one response together (a turn of 4,000 empty blocks, 8,000 tokens,
            got 4,000 error messages: a 750 KB observation rendered on the rollout loop).
    """

    #: Extra stop strings for generation; the chat template's end-of-turn token already ends a turn.
    stop: list[str] = []
    #: Tool specs for the chat template (`{"type": "function", "function": {name, description, parameters}}`).
    tool_specs: list[dict[str, Any]] = []

    def __init__(self, *, max_tool_calls: int = 16, max_calls_per_turn: int = 4) -> None:
        if max_tool_calls < 0 or max_calls_per_turn < 1:
            raise ValueError(
                f"max_tool_calls must be >= 0 and max_calls_per_turn >= 1, got {max_tool_calls}, {max_calls_per_turn}"
            )
        self.max_tool_calls = max_tool_calls
        self.max_calls_per_turn = max_calls_per_turn
        self.prompt: Any = None
        self.label: Any = None
        self.metadata: Mapping[str, Any] = {}
        self.num_tool_calls = 0

    def tool_functions(self) -> dict[str, Callable[..., Awaitable[str]]]:
        """Maps tool name → `async fn(**arguments) -> str` (the tool's response text)."""
        raise NotImplementedError

    def reset(self, *, prompt: Any, label: Any, metadata: Mapping[str, Any]) -> None:
        """Starts an episode for one sample."""
        self.prompt, self.label, self.metadata = prompt, label, dict(metadata)
        self.num_tool_calls = 0

    def score(self, final_turn: str, parsed: ParsedTurn) -> float | None:
        """Reward of the final answer (None: leave scoring to the reward function)."""
        return None

    async def call_tool(self, call: ToolCall) -> str:
        """Runs one call; every failure is returned as an `Error: ...` message."""
        functions = self.tool_functions()
        fn = functions.get(call.name)
        if fn is None:
            return f"Error: unknown tool '{call.name}'. Available tools: {', '.join(sorted(functions))}."
        try:
            return await fn(**call.arguments)
        except TypeError as e:
            return f"Error: bad arguments for tool '{call.name}': {e}"
        except Exception as e:  # a tool bug must not kill the rollout; the model sees the message
            logger.warning("tool %s failed: %r", call.name, e)
            return f"Error: tool '{call.name}' failed: {type(e).__name__}: {e}"

    async def step(self, model_turn: str) -> EnvStep:
        """Runs the tool calls of `model_turn`, or ends the episode if it has none.

        Args:
            model_turn: decoded text of one model turn.

        Returns:
            An `EnvStep` with one tool response per `<tool_call>` block, in the order written (the result of a
            call, or the error of a malformed block), for the first `max_calls_per_turn` blocks, and one
            response for all the blocks after them; not done. Done, with `score(...)` as reward, when the turn
            has no tool call.
        """
        parsed = parse_tool_calls(model_turn)
        if not parsed.blocks:
            return EnvStep(
                observation="", done=True, reward=self.score(model_turn, parsed), info={"answer": parsed.answer}
            )
        responses = []
        for block in parsed.blocks[: self.max_calls_per_turn]:
            if isinstance(block, str):
                responses.append(f"Error: {block}. {_CALL_FORMAT_HINT}")
            elif self.num_tool_calls >= self.max_tool_calls:
                responses.append(
                    f"Error: the tool-call limit ({self.max_tool_calls}) is reached; give your final answer."
                )
            else:
                self.num_tool_calls += 1
                responses.append(await self.call_tool(block))
        skipped = len(parsed.blocks) - self.max_calls_per_turn
        if skipped > 0:
            responses.append(
                f"Error: at most {self.max_calls_per_turn} tool calls per turn; the {skipped} after them were not run."
            )
        info = {"tool_calls": [c.name for c in parsed.tool_calls], "num_errors": len(parsed.errors)}
        return EnvStep(observation="\n".join(responses), done=False, info=info, tool_responses=responses)
