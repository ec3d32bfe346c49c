"""Plugin plumbing for the rollout: original slime import paths mapped onto this package.

Loading itself is `slime_core.plugins.load_function`; here the paths of the original slime
(`slime.rollout.sglang_rollout.generate_rollout`, ...) are translated first so existing launch
scripts keep working.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slime_core.plugins import PATH_ALIASES, PluginError, call_maybe_async
from slime_core.plugins import load_function as _core_load_function

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "ORIGINAL_PATH_ALIASES",
    "accepts_kwarg",
    "call_maybe_async",
    "declares_parameter",
    "eval_function",
    "load_function",
]

ORIGINAL_PATH_ALIASES: dict[str, str] = {
    "slime.rollout.sglang_rollout.generate_rollout": "slime_rollout.generation.rollout.generate_rollout",
    "slime.rollout.sglang_rollout.generate": "slime_rollout.generation.generate.generate",
    "slime.rollout.sglang_rollout.eval_rollout": "slime_rollout.generation.eval.eval_rollout",
    "slime.rollout.data_source.RolloutDataSourceWithBuffer": "slime_rollout.data.source.RolloutDataSourceWithBuffer",
    "slime.rollout.data_source.RolloutDataSource": "slime_rollout.data.source.RolloutDataSource",
    "slime.rollout.data_source.pop_first": "slime_rollout.data.buffer_filter.pop_first",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std": (
        "slime_rollout.generation.filters.check_reward_nonzero_std"
    ),
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback": (
        "slime_rollout.generation.filters.check_reward_nonzero_std_with_fallback"
    ),
    "slime.rollout.rm_hub.async_rm": "slime_rollout.rewards.async_rm",
    "slime.rollout.rm_hub.batched_async_rm": "slime_rollout.rewards.batched_async_rm",
    "slime.rollout.sft_rollout.generate_rollout": "slime_rollout.data.sft.generate_sft_rollout",
    "slime.rollout.on_policy_distillation.reward_func": "slime_rollout.generation.opd.reward_func",
    "slime.rollout.on_policy_distillation.post_process_rewards": "slime_rollout.generation.opd.post_process_rewards",
}
# This package's plugin paths before its modules moved into sub-packages (issue 28): earlier defaults of
# --rollout-function-path / --data-source-path, kept in saved run configs and users' scripts.
FLAT_PATH_ALIASES: dict[str, str] = {
    "slime_rollout.rollout.generate_rollout": "slime_rollout.generation.rollout.generate_rollout",
    "slime_rollout.generate.generate": "slime_rollout.generation.generate.generate",
    "slime_rollout.eval.eval_rollout": "slime_rollout.generation.eval.eval_rollout",
    "slime_rollout.data_source.RolloutDataSourceWithBuffer": "slime_rollout.data.source.RolloutDataSourceWithBuffer",
    "slime_rollout.data_source.RolloutDataSource": "slime_rollout.data.source.RolloutDataSource",
    "slime_rollout.filters.check_reward_nonzero_std": "slime_rollout.generation.filters.check_reward_nonzero_std",
    "slime_rollout.filters.check_reward_nonzero_std_with_fallback": (
        "slime_rollout.generation.filters.check_reward_nonzero_std_with_fallback"
    ),
    "slime_rollout.sft.generate_sft_rollout": "slime_rollout.data.sft.generate_sft_rollout",
    "slime_rollout.opd.reward_func": "slime_rollout.generation.opd.reward_func",
    "slime_rollout.opd.post_process_rewards": "slime_rollout.generation.opd.post_process_rewards",
}
ORIGINAL_PATH_ALIASES.update(FLAT_PATH_ALIASES)
PATH_ALIASES.update(ORIGINAL_PATH_ALIASES)  # also for paths slime-core loads (--custom-reward-post-process-path)


def load_function(path: str, *, flag: str = "plugin") -> Callable[..., Any]:
    """Imports the callable at `path` (original slime paths translated via `ORIGINAL_PATH_ALIASES`).

    Args:
        path: `package.module.attr` or `package.module:attr`.
        flag: the flag that named it, for error messages.

    Raises:
        slime_core.plugins.PluginError: the module or attribute cannot be found.
    """
    return _core_load_function(ORIGINAL_PATH_ALIASES.get(path, path), flag=flag)


def eval_function(cfg: SlimeArgs) -> tuple[str, Callable[..., Any]] | None:
    """The function that runs this run's evals, as `run_rollout` picks it, for the checks made before the run.

    Args:
        cfg: run config; reads `eval_prompt_data`, `eval_config`, `eval_function_path`, `rollout_function_path`.

    Returns:
        `(path, function)`: `--eval-function-path`, else `--rollout-function-path`; None when the run has no eval
        datasets, or the path cannot be imported (the app's plugin check names that one).
    """
    if not (cfg.eval_prompt_data or cfg.eval_config):
        return None
    flag, path = ("--eval-function-path", cfg.eval_function_path) if cfg.eval_function_path else (
        "--rollout-function-path", cfg.rollout_function_path)  # fmt: skip
    try:
        return path, load_function(path, flag=flag)
    except PluginError:
        return None


@functools.lru_cache(maxsize=256)
def accepts_kwarg(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` takes a keyword argument `name` (or **kwargs); cached (asked once per sample)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


@functools.lru_cache(maxsize=256)
def declares_parameter(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn`'s signature names a parameter `name` (**kwargs does not count); cached (asked once per sample).

    The original passes `evaluation=` to a custom generate function only so (`"evaluation" in
    inspect.signature(fn).parameters`): one taking `**kwargs` gets none, and may forward them to a call that takes
    no `evaluation`.
    """
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
