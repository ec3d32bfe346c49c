"""`--sglang-*` MoE flags on a dense `--hf-checkpoint`: refused before the run, as the Megatron MoE flags are.

A dense model has no experts, so SGLang's expert parallelism (`--sglang-ep-size 2`), its all-to-all backends
(`--sglang-moe-a2a-backend deepep`), expert load balancing (`--sglang-enable-eplb`) and the other MoE options
cannot apply: at best they are ignored (an engine planned for expert parallelism that has none), at worst the engine
fails minutes into start-up. The dry run checked only the Megatron MoE flags; on a machine without SGLang the
pass-through flags were "not checked" at all. This check needs only config.json.

A flag counts when its name is a MoE option of SGLang 0.5.16's `ServerArgs` (it holds `moe`, `eplb` or `deepep`,
starts with `ep_`, or names experts) and its value is not SGLang's default (`--sglang-ep-size 1`,
`--sglang-moe-a2a-backend none` and a `false` switch are accepted: they ask for nothing).
"""

from __future__ import annotations

import re
from typing import Any

from slime_core.config.architecture import is_dense_config

__all__ = ["dense_model_moe_flags"]

_MOE_OPTION = re.compile(r"(?:^|_)(?:moe|eplb|deepep)(?:_|$)|^ep_|expert")
# SGLang 0.5.16's defaults of the MoE options that take a value: passing one asks for nothing.
_DEFAULTS = {
    "ep_size": "1",
    "expert_parallel_size": "1",
    "moe_a2a_backend": "none",
    "moe_runner_backend": "auto",
    "deepep_mode": "auto",
    "ep_num_redundant_experts": "0",
    "init_expert_location": "trivial",
}
_OFF = {"false", "0", "none", ""}


def dense_model_moe_flags(sglang_args: dict[str, Any], hf_config: dict[str, Any]) -> list[str]:
    """The `--sglang-*` MoE flags that ask for something a dense model does not have (see the module doc).

    Args:
        sglang_args: the pass-through flags (`SlimeArgs.sglang_args`: field name -> value, `True` for a switch).
        hf_config: the parsed config.json of `--hf-checkpoint`.

    Returns:
        One `--sglang-<name> <value>` entry per such flag; empty for a MoE model, a model family the architecture
        check does not know, or no such flag.
    """
    if not is_dense_config(hf_config):
        return []
    found = []
    for name, value in sglang_args.items():
        key = name.removeprefix("sglang_")
        if not _MOE_OPTION.search(key):
            continue
        given = " ".join(map(str, value)) if isinstance(value, list) else str(value)
        if value is True:
            given = ""
        elif given.lower() in _OFF or given == _DEFAULTS.get(key):
            continue
        found.append(f"--sglang-{key.replace('_', '-')}{' ' + given if given else ''}")
    return found
