"""The original's `slime.agent` modules this slime does not carry, and the one-line error importing one raises.

Each such module of the original's tree exists here as a stub whose import calls `refuse(__name__)`, so a plugin
written for the original learns in one line what is missing and where MIGRATION.md says what to use instead, rather
than reading a bare "No module named".
"""

from __future__ import annotations

# Module -> what it was in the original (THUDM/slime `slime/agent/`).
NOT_CARRIED = {
    "slime.agent.adapters.anthropic": "the Anthropic Messages API adapter: AnthropicAdapter",
    "slime.agent.adapters.common": "the adapters' shared base: BaseAdapter, Session, call_sglang_generate",
    "slime.agent.aiohttp_threaded": "the aiohttp-server-in-a-thread helper: run_app_in_thread",
    "slime.agent.harness": "the coding-agent harnesses: ClaudeCodeHarness, CodexHarness, BaseHarness",
    "slime.agent.parsing": "the adapters' tool-use parser: parse_model_output, parse_tool_uses",
    "slime.agent.sandbox": "the E2B sandbox: Sandbox, E2BSandbox, exec_and_wait",
    "slime.agent.trajectory": "the adapters' trajectory manager: TrajectoryManager",
}

MIGRATION_ROW = "MIGRATION.md 'Plugins', paragraph 'Not carried from slime.agent'"


def refuse(module: str) -> None:
    """Raises the error for importing `module`, one of `NOT_CARRIED`.

    Raises:
        ModuleNotFoundError: always; `name` is `module`, so plugin loaders read it as a missing module, and the
            message starts as Python's own ("No module named ...").
    """
    raise ModuleNotFoundError(
        f"No module named {module!r}: this slime does not carry it (in the original slime: {NOT_CARRIED[module]}); "
        f"{MIGRATION_ROW} says what to use instead",
        name=module,
    )
