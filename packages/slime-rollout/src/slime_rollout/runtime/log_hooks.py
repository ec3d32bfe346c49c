"""The original's custom metric loggers, `--custom-rollout-log-function-path` and its eval twin.

Signatures (as in the original slime)::

    fn(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool     # training rollouts
    fn(rollout_id, args, data, extra_metrics) -> bool                              # eval rollouts

`samples` is the flat list of the rollout's samples, `data` the eval output `{name: {"rewards", "truncated",
"samples"}}`, and the metrics dict is the rollout's (the default metrics plus what the rollout function
reported). The function may add or change entries in place. Returning True skips the default logging: then
only the entries the function added or changed are logged (the original logs nothing and leaves logging to the
function; here the metrics sink lives in the driver process, so additions are the way to log).

Each call runs in a worker thread under `--plugin-timeout-secs` (`slime_rollout.runtime.deadlines`): a logger stuck
on a network write fails the rollout with its flag and path named instead of stalling it with no word.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.sample import Sample
from slime_rollout.plugins import load_function
from slime_rollout.runtime.deadlines import call_plugin_with_deadline_sync, plugin_bounds

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["apply_eval_log_function", "apply_rollout_log_function"]


def _run(
    args: SlimeArgs,
    rollout_id: int,
    path: str | None,
    flag: str,
    metrics: dict[str, Any] | None,
    call: Callable[[Callable, dict[str, Any]], Any],
) -> dict[str, Any] | None:
    """Calls the hook at `path` (named by `flag`) through `call(fn, metrics)`; returns the metrics to log."""
    if not path:
        return metrics
    fn = load_function(path, flag=flag)
    metrics = dict(metrics or {})
    before = dict(metrics)
    what = f"{flag} {path} (rollout {rollout_id})"
    if not call_plugin_with_deadline_sync(call, fn, metrics, what=what, **plugin_bounds(args)):
        return metrics
    return {k: v for k, v in metrics.items() if k not in before or before[k] != v}


def apply_rollout_log_function(
    args: SlimeArgs, rollout_id: int, samples: Sequence[Sample], metrics: dict[str, Any] | None, rollout_time: float
) -> dict[str, Any] | None:
    """Runs `--custom-rollout-log-function-path` (if set) on a training rollout.

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`), passed to the function; reads
            `custom_rollout_log_function_path`.
        rollout_id: id of the rollout.
        samples: all samples of the rollout, flat.
        metrics: the rollout's metrics (None when the rollout function reported none); passed to the
            function as `rollout_extra_metrics` (a dict, changed in place).
        rollout_time: wall-clock seconds of the rollout function.

    Returns:
        The metrics to log: all of them, or with a True return only those the function added or changed.

    Raises:
        slime_core.plugins.PluginError: the function cannot be imported.
        DeadlineExceeded: it ran past `--plugin-timeout-secs` (the message names its flag, path and the rollout).
    """
    return _run(
        args,
        rollout_id,
        args.custom_rollout_log_function_path,
        "--custom-rollout-log-function-path",
        metrics,
        lambda fn, m: fn(rollout_id, args, list(samples), m, rollout_time),
    )


def apply_eval_log_function(
    args: SlimeArgs, rollout_id: int, data: dict[str, dict[str, Any]], metrics: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Runs `--custom-eval-rollout-log-function-path` (if set) on an eval rollout.

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`), passed to the function; reads
            `custom_eval_rollout_log_function_path`.
        rollout_id: the training rollout the eval follows.
        data: per dataset `{"rewards", "truncated", "samples"}`.
        metrics: the eval metrics (`eval/*`), passed as `extra_metrics` (a dict, changed in place).

    Returns:
        The metrics to log (see `apply_rollout_log_function`).

    Raises:
        slime_core.plugins.PluginError: the function cannot be imported.
        DeadlineExceeded: it ran past `--plugin-timeout-secs` (the message names its flag, path and the rollout).
    """
    return _run(
        args,
        rollout_id,
        args.custom_eval_rollout_log_function_path,
        "--custom-eval-rollout-log-function-path",
        metrics,
        lambda fn, m: fn(rollout_id, args, data, m),
    )
