"""The original's `slime.agent`: only its OpenAI adapter (`slime.agent.adapters.openai`) is provided.

The Anthropic adapter, harnesses (Claude Code, Codex), sandboxes and `aiohttp_threaded` are not; importing them
fails with `ModuleNotFoundError` and `MIGRATION.md` says what to use instead.
"""
