"""Inference engines: launching SGLang or the CPU reference engine, and the reference engine itself."""

from slime_rollout.engines.launch import EngineGroup, launch_engines

__all__ = ["EngineGroup", "launch_engines"]
