"""Engine processes: start them by engine kind, wait until they serve, and hold them as a group.

Modules: `common` (`EngineKind`, what the launcher needs of a kind) <- `sglang` (SGLang command line and
environment), `reference` (the CPU reference engine's command line) <- `launcher` (`EngineLauncher`: one engine by
index) <- `group` (`EngineGroup`, `launch_engines`, `attach_router`).
"""

from slime_rollout.engines.launch.common import EngineKind, needs_weights_backup
from slime_rollout.engines.launch.group import EngineGroup, attach_router, launch_engines
from slime_rollout.engines.launch.launcher import ENGINE_KINDS, EngineLauncher, engine_env, engine_kind
from slime_rollout.engines.launch.reference import build_reference_command
from slime_rollout.engines.launch.sglang import (
    build_sglang_command,
    engine_python,
    lora_server_args,
    sglang_passthrough,
)
from slime_rollout.engines.wire import nccl_cumem_enable

__all__ = [
    "ENGINE_KINDS",
    "EngineGroup",
    "EngineKind",
    "EngineLauncher",
    "attach_router",
    "build_reference_command",
    "build_sglang_command",
    "engine_env",
    "engine_kind",
    "engine_python",
    "launch_engines",
    "lora_server_args",
    "nccl_cumem_enable",  # defined in slime_rollout.engines.wire (both ends of a weight update need it)
    "needs_weights_backup",
    "sglang_passthrough",
]
