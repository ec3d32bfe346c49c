"""Stop strings of the agent adapter's calls: which apply to a call, and where the generated text is cut.

Used by `slime_rollout.agent.openai_adapter`: a session's `sampling_defaults["stop"]` is checked once
(`stop_strings`), each call takes its own `stop` or the session's (`call_stops`), and the reply's content ends
before the first stop string the engine stopped at (`cut_at_stop`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slime_rollout.agent.openai_wire import ChatRequest
    from slime_rollout.agent.trajectory import AgentSession

__all__ = ["call_stops", "cut_at_stop", "stop_strings"]


def stop_strings(value: Any, session_id: str) -> list[str]:
    """SGLang's `stop` (None, a string or a list of strings) as a list; a string was spread into its characters.

    Raises:
        ValueError: `value` is of another type (names the session).
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return [v for v in value if v]
    raise ValueError(
        f"agent session {session_id!r}: sampling_defaults['stop'] must be a string or a list of strings, "
        f"got {value!r:.80}"
    )


def call_stops(session: AgentSession, chat: ChatRequest) -> list[str]:
    """The stop strings of one call: the call's own `stop` when it sets one, else the session's defaults.

    A call's list replaces the defaults, as in OpenAI's API (the caller's list is the call's) and the original's
    adapter (`sp["stop"] = body["stop"]` over the session defaults); adding them stopped an agent's call at a run
    stop string it never asked for.
    """
    return list(chat.stop) if chat.stop else list(session.sampling_defaults.get("stop") or [])


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, str]:
    """`text` up to its first stop string (OpenAI leaves the stop sequence out), and that stop string ("" if none).

    At the same position the longest stop string is the one reported (`</tool_call>` over `</tool`).
    """
    found = [(text.find(s), -len(s), s) for s in stops if s and s in text]
    if not found:
        return text, ""
    at, _, stop = min(found)
    return text[:at], stop
