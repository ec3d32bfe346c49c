"""The original's `slime.agent.adapters.openai`: the OpenAI Chat Completions adapter.

`OpenAIAdapter(tokenizer=..., sglang_url=..., tool_parser=..., reasoning_parser=..., max_turns_per_sid=...)`,
`open_session`, `finish_session(sid, base_sample=..., reward=..., extra_metadata=...)`, `drop_session` and `app`
(the aiohttp application) as in the original; `await adapter.start()` serves it on the running loop. Differences:
a call for a session that was not opened is refused (HTTP 404) instead of opening one, `stream: true` is refused,
and `fork_threshold_tokens` / `debug_callback` are not taken.
"""

from slime_rollout.agent.openai_adapter import OpenAIAdapter

__all__ = ["OpenAIAdapter"]
