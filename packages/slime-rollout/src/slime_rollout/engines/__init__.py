"""Inference engines: launch SGLang or the CPU reference engine, talk to them, and the reference engine itself.

Modules, in import order: `wire` (weight-update request bodies and payloads, shared with the trainer side),
`transport` (retrying HTTP) and `probe` (one health probe: ok, down, timed out, unhealthy) <- `client`
(`EngineClient`, `RolloutClient`) <- `pool` (which engines serve, re-queue of failed requests) and `health` (engine
health); `plugin_http` (the original's `post`/`get` for plugins);
`process` (engine subprocesses) <- `router` (sglang-router) <- `launch` (by engine kind: `launch_engines`,
`EngineGroup`); `weight_checksum` (SGLang's per-parameter checksum, both ends); `reference` is
the CPU engine server.
"""

from slime_rollout.engines.launch import EngineGroup, launch_engines

__all__ = ["EngineGroup", "launch_engines"]
