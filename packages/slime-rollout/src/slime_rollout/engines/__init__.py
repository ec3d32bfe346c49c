"""Inference engines: launch SGLang or the CPU reference engine, and the reference engine itself.

Modules, in import order: `process` (engine subprocesses) <- `router` (sglang-router) <- `launch`
(`launch_engines`, `EngineGroup`); `reference` is the CPU engine server.
"""

from slime_rollout.engines.launch import EngineGroup, launch_engines

__all__ = ["EngineGroup", "launch_engines"]
