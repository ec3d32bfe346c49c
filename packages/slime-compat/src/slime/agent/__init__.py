"""The original's `slime.agent`: only its OpenAI adapter (`slime.agent.adapters.openai`) is provided.

The Anthropic adapter, harnesses (Claude Code, Codex), sandbox, parsing, trajectory manager and `aiohttp_threaded`
are not: importing one raises a `ModuleNotFoundError` of one line naming it and the MIGRATION.md paragraph that says
what to use instead (`slime.agent._not_carried`).
"""
