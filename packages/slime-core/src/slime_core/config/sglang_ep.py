"""`--sglang-ep-size` against each engine's tensor-parallel size, refused before the run where SGLang would stop.

slime starts every engine with `--tp-size T` (`T = --rollout-num-gpus-per-engine / --sglang-pp-size`) and passes
`--sglang-ep-size` (or its aliases `--sglang-expert-parallel-size`, `--sglang-ep`) through unchanged, as the original
does; neither the original nor SGLang 0.5.16's `ServerArgs` compares the two. SGLang's `initialize_model_parallel`
cuts the `T` ranks into expert-parallel groups of `EP` ranks (`moe_tp_size = T // EP // moe_dp_size`): with an `EP`
that does not divide `T` some ranks fall into no group (`EP > T` gives `moe_tp_size = 0` and no group at all), and
every engine stopped minutes into its start-up without naming a flag. The other combinations below stop on bare
asserts of `ServerArgs.__post_init__` (`sglang/srt/server_args.py` of 0.5.16):

* `--sglang-moe-dp-size M > 1`: `T % M == 0`, `--sglang-pp-size 1`, and with `EP > 1`, `EP × M == T`;
* `--sglang-moe-runner-backend flashinfer_cutlass` / `flashinfer_cutedsl`: `EP` is 1 or `T`;
* `--sglang-enable-eplb`: `EP > 1` (unless `--sglang-elastic-ep-join-mode scale`).

An all-to-all backend that spans the engine (`--sglang-moe-a2a-backend deepep`, `mooncake`, ...) makes SGLang set
`EP = T` itself, whatever was given (`arg_groups/overrides.py: _a2a_ep_size`): a different `--sglang-ep-size` is
then not used, which is said once as a warning (the original's scripts run that way, so it is not refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slime_core.config.base import ConfigError, warn_once

__all__ = ["A2A_BACKENDS_SPANNING_THE_ENGINE", "check_expert_parallel"]

#: `--moe-a2a-backend` values for which SGLang 0.5.16 sets `ep_size = tp_size` (`_A2A_EP_SPANNING_BACKENDS`).
A2A_BACKENDS_SPANNING_THE_ENGINE = frozenset({"megamoe", "deepep", "mooncake", "nixl", "ascend_fuseep", "flashinfer",
                                              "mori"})  # fmt: skip
# Option strings of one ServerArgs field (its name first, then its aliases in 0.5.16), as `sglang_field` keys them.
_EP_NAMES = ("ep_size", "expert_parallel_size", "ep")
_MOE_DP_NAMES = ("moe_dp_size", "moe_data_parallel_size")
# Runner backends whose ServerArgs check is `assert ep_size in [1, tp_size]`.
_EP_ONE_OR_TP_RUNNERS = ("flashinfer_cutlass", "flashinfer_cutedsl")


def _size(sglang_args: Mapping[str, Any], names: tuple[str, ...]) -> tuple[int, str]:
    """`(value, flag)` of the first of `names` given (1 and the first name's flag when none is).

    Raises:
        ConfigError: the value is not a positive integer, naming the flag.
    """
    for name in names:
        if name in sglang_args:
            flag, value = f"--sglang-{name.replace('_', '-')}", sglang_args[name]
            text = str(value).strip()
            if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
                raise ConfigError(f"{flag}: expected a positive integer, got {value!r}")
            return int(text), flag
    return 1, f"--sglang-{names[0].replace('_', '-')}"


def check_expert_parallel(sglang_args: Mapping[str, Any], *, gpus_per_engine: int, pp: int) -> None:
    """Refuses the expert-parallel sizes an SGLang 0.5.16 engine of `gpus_per_engine / pp` TP ranks stops on.

    See the module docstring for the rules and where SGLang enforces them.

    Args:
        sglang_args: the pass-through flags keyed by `ServerArgs` field (`SlimeArgs.sglang_args`).
        gpus_per_engine: `--rollout-num-gpus-per-engine`.
        pp: `--sglang-pp-size` (already checked to divide `gpus_per_engine`).

    Raises:
        ConfigError: the first broken rule, in one line naming `--sglang-ep-size` (as it was spelled) and
            `--rollout-num-gpus-per-engine` / `--sglang-pp-size` or the other flag involved.
    """
    tp = gpus_per_engine // pp
    engine = f"each engine's tensor-parallel size {tp} (--rollout-num-gpus-per-engine {gpus_per_engine} / "
    engine += f"--sglang-pp-size {pp})"
    ep, ep_flag = _size(sglang_args, _EP_NAMES)
    moe_dp, moe_dp_flag = _size(sglang_args, _MOE_DP_NAMES)
    a2a = str(sglang_args.get("moe_a2a_backend", "none"))
    if a2a in A2A_BACKENDS_SPANNING_THE_ENGINE:
        if ep != 1 and ep != tp:
            warn_once(
                "sglang_ep_size_a2a",
                f"{ep_flag} {ep} is not used: with --sglang-moe-a2a-backend {a2a} SGLang sets the expert-parallel "
                f"size to {engine}",
            )
        ep = tp
    elif tp % ep:
        raise ConfigError(
            f"{ep_flag} {ep} must divide {engine}: SGLang splits an engine's TP ranks into expert-parallel groups of "
            "that size"
        )
    if moe_dp > 1:
        if tp % moe_dp:
            raise ConfigError(f"{moe_dp_flag} {moe_dp} must divide {engine}")
        if pp > 1:
            raise ConfigError(f"{moe_dp_flag} {moe_dp} needs --sglang-pp-size 1, got {pp} (SGLang asserts it)")
        if ep > 1 and ep * moe_dp != tp:
            raise ConfigError(
                f"{ep_flag} {ep} × {moe_dp_flag} {moe_dp} must equal {engine}: SGLang runs an engine's experts over "
                "its TP ranks as EP × MoE-DP groups"
            )
    runner = str(sglang_args.get("moe_runner_backend", "auto"))
    if runner in _EP_ONE_OR_TP_RUNNERS and ep not in (1, tp):
        raise ConfigError(
            f"{ep_flag} {ep} with --sglang-moe-runner-backend {runner}: SGLang runs that backend only with an "
            f"expert-parallel size of 1 or {engine}"
        )
    eplb = sglang_args.get("enable_eplb") is True or str(sglang_args.get("enable_eplb", "")).lower() == "true"
    if eplb and ep == 1 and str(sglang_args.get("elastic_ep_join_mode", "")) != "scale":
        raise ConfigError(
            f"--sglang-enable-eplb needs {ep_flag} > 1 (expert-parallel load balancing moves experts between the "
            f"engine's EP ranks; SGLang asserts it), with {engine}"
        )
