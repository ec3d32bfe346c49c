"""`ToolEnv`: the common loop of chat-template tool environments (Qwen3/Hermes `<tool_call>`).

A subclass declares its tools (`tool_specs` for the chat template, `async` methods that run them)
and optionally a `score` for the final answer. `step` parses the model turn, runs each call and
returns the results as tool messages; a turn without tool calls is the final answer and ends the
episode. Nothing the model writes raises: malformed calls, unknown tools, bad arguments and tool
failures all become `Error: ...` tool responses.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from slime_core.error_text import preview
from slime_core.protocols import EnvStep
from slime_envs.parsing import ParsedTurn, ToolCall, parse_tool_calls

__all__ = ["ToolEnv"]

logger = logging.getLogger(__name__)

_num_truncated = 0  # tool responses cut to max_response_chars in this process (for the log)


def _count_truncated(num: int, limit: int) -> None:
    """Counts cut tool responses; logs the first and then each time the total passes a power of two."""
    global _num_truncated
    before, _num_truncated = _num_truncated, _num_truncated + num
    if before == 0 or before.bit_length() != _num_truncated.bit_length():
        logger.warning(
            "%d tool response(s) so far were longer than max_response_chars=%d and were cut (the env's option)",
            _num_truncated,
            limit,
        )


def _bad_arguments(fn: Callable[..., Any], arguments: Mapping[str, Any]) -> str | None:
    """Why `fn(**arguments)` cannot be called (a missing, unexpected or doubled argument), or None when it can."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to check (some C callables): the call itself will say
        return None
    try:
        signature.bind(**arguments)
    except TypeError as e:
        return str(e)
    return None


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
        max_response_chars: characters of one tool response shown to the model; a longer one is cut there and
            says so (`... (tool response truncated: N of M characters shown)`), counted in the step's
            `info["num_truncated"]` and logged. A tool that printed 10 MB was passed whole: the observation then
            used up the episode's token budget, cut without a word, and the sample carried the 10 MB in its
            recorded conversation. (The sandboxed `python` tool caps its own output first: `max_output_chars`.)
        tool_timeout_s: seconds one call may take; past it the call is cancelled, logged, and the model gets
            `Error: tool '...' did not answer within N s`. None: no deadline (the `python` env's default: its
            sandbox's `timeout_s` bounds each run, and waiting for a free sandbox is not a hang). A hung tool held
            its episode, and so the rollout, until `--plugin-timeout-secs` (4 h) failed the whole rollout.

    Raises:
        ValueError: a limit out of range.
    """

    #: Extra stop strings for generation; the chat template's end-of-turn token already ends a turn.
    stop: list[str] = []
    #: Tool specs for the chat template (`{"type": "function", "function": {name, description, parameters}}`).
    tool_specs: list[dict[str, Any]] = []
    #: Errors of the machinery a tool runs on (the sandbox cannot start), not of the call: `step` raises them, so
    #: the sample fails instead of showing the model an error it did not cause (and training on it).
    infrastructure_errors: tuple[type[Exception], ...] = ()

    def __init__(
        self,
        *,
        max_tool_calls: int = 16,
        max_calls_per_turn: int = 4,
        max_response_chars: int = 16_000,
        tool_timeout_s: float | None = 600.0,
    ) -> None:
        if max_tool_calls < 0 or max_calls_per_turn < 1 or max_response_chars < 1:
            raise ValueError(
                f"max_tool_calls must be >= 0, max_calls_per_turn and max_response_chars >= 1, got {max_tool_calls}, "
                f"{max_calls_per_turn}, {max_response_chars}"
            )
        if tool_timeout_s is not None and not tool_timeout_s > 0:
            raise ValueError(f"tool_timeout_s must be > 0 or None (no deadline), got {tool_timeout_s}")
        self.tool_timeout_s = tool_timeout_s
        # Per episode: the class's lists are shared by every env of the process, so a subclass that appended to
        # `self.stop` in its __init__ grew the stop strings of every episode (every ToolEnv's, other envs too).
        self.stop = list(type(self).stop)
        self.tool_specs = copy.deepcopy(type(self).tool_specs)
        self.max_tool_calls = max_tool_calls
        self.max_calls_per_turn = max_calls_per_turn
        self.max_response_chars = max_response_chars
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
        """Runs one call; every failure of the call is returned as an `Error: ...` message.

        A `CancelledError` the tool raises of its own (its episode is not being cancelled) is such a failure; the
        episode's own cancellation propagates.

        Raises:
            TypeError: the tool returned something other than a str (its response text): a bug of the tool, named
                here (it failed later as "sequence item 0: expected str instance, int found", naming no tool).
            Exception: one of `infrastructure_errors`, as the tool raised it.
        """
        functions = self.tool_functions()
        fn = functions.get(call.name)
        if fn is None:
            return f"Error: unknown tool '{call.name}'. Available tools: {', '.join(sorted(functions))}."
        # The arguments are checked against the tool's signature before it runs: a TypeError raised inside the
        # tool (its own bug) was shown to the model as "bad arguments", and logged nowhere.
        bad = _bad_arguments(fn, call.arguments)
        if bad is not None:
            return f"Error: bad arguments for tool '{call.name}': {bad}"
        deadline = asyncio.timeout(self.tool_timeout_s)
        try:
            async with deadline:
                result = await fn(**call.arguments)
        except TimeoutError as e:
            if not deadline.expired():  # the tool's own TimeoutError: a failure like any other
                logger.warning("tool %s failed: %r", call.name, e)
                return f"Error: tool '{call.name}' failed: TimeoutError: {e}"
            logger.warning(
                "%s tool %s did not answer within tool_timeout_s=%s s; cancelled, the model sees an error",
                type(self).__name__,
                call.name,
                self.tool_timeout_s,
            )
            return f"Error: tool '{call.name}' did not answer within {self.tool_timeout_s:g} s."
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the episode itself is being cancelled (the rollout aborts it): not the tool's failure
            # The tool's own (an inner request something else cancelled): it escaped `step` as a BaseException and
            # ended the sample as if the rollout had cancelled it.
            logger.warning("tool %s failed: %r", call.name, e)
            return f"Error: tool '{call.name}' failed: CancelledError"
        except self.infrastructure_errors:
            raise
        except Exception as e:  # a tool bug must not kill the rollout; the model sees the message
            logger.warning("tool %s failed: %r", call.name, e)
            return f"Error: tool '{call.name}' failed: {type(e).__name__}: {e}"
        if not isinstance(result, str):
            raise TypeError(
                f"{type(self).__name__} tool '{call.name}' returned {type(result).__name__} {preview(result, 60)}, "
                "not a str (tool_functions() maps names to async functions returning the response text)"
            )
        return result

    def _shown(self, response: str) -> tuple[str, bool]:
        """`response` cut to `max_response_chars` with a note saying so, and whether it was cut."""
        if len(response) <= self.max_response_chars:
            return response, False
        note = f"\n... (tool response truncated: {self.max_response_chars:,} of {len(response):,} characters shown)"
        return response[: self.max_response_chars] + note, True

    async def step(self, model_turn: str) -> EnvStep:
        """Runs the tool calls of `model_turn`, or ends the episode if it has none.

        Args:
            model_turn: decoded text of one model turn.

        Returns:
            An `EnvStep` with one tool response per `<tool_call>` block, in the order written (the result of a
            call, cut to `max_response_chars`, or the error of a malformed block), for the first
            `max_calls_per_turn` blocks, and one response for all the blocks after them; not done. Done, with
            `score(...)` as reward, when the turn has no tool call.

        Raises:
            TypeError: a tool returned something other than a str (`call_tool`).
            Exception: one of `infrastructure_errors` a tool raised (`call_tool`).
        """
        parsed = parse_tool_calls(model_turn)
        if not parsed.blocks:
            return EnvStep(
                observation="", done=True, reward=self.score(model_turn, parsed), info={"answer": parsed.answer}
            )
        responses = []
        num_truncated = 0
        for block in parsed.blocks[: self.max_calls_per_turn]:
            if isinstance(block, str):
                responses.append(f"Error: {block}. {_CALL_FORMAT_HINT}")
            elif self.num_tool_calls >= self.max_tool_calls:
                responses.append(
                    f"Error: the tool-call limit ({self.max_tool_calls}) is reached; give your final answer."
                )
            else:
                self.num_tool_calls += 1
                response, cut = self._shown(await self.call_tool(block))
                responses.append(response)
                num_truncated += cut
        skipped = len(parsed.blocks) - self.max_calls_per_turn
        if skipped > 0:
            responses.append(
                f"Error: at most {self.max_calls_per_turn} tool calls per turn; the {skipped} after them were not run."
            )
        if num_truncated:
            _count_truncated(num_truncated, self.max_response_chars)
        info = {
            "tool_calls": [c.name for c in parsed.tool_calls],
            "num_errors": len(parsed.errors),
            "num_truncated": num_truncated,
        }
        return EnvStep(observation="\n".join(responses), done=False, info=info, tool_responses=responses)
