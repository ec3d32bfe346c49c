"""`--custom-rollout-log-function-path` / `--custom-eval-rollout-log-function-path` through `run_rollout`."""

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.plugins import PluginError
from slime_core.sample import Sample
from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime_rollout.generation.rollout import run_rollout

CALLS = []


def fixed_rollout(args, rollout_id, data_source, evaluation=False):
    """A rollout function with known samples and metrics."""
    if evaluation:
        data = {"toy": {"rewards": [1.0, 0.0], "truncated": [False, True], "samples": [Sample(index=7)]}}
        return RolloutFnEvalOutput(data=data, metrics={"eval/toy": 0.5})
    groups = [[Sample(index=0, reward=1.0), Sample(index=1, reward=0.0)]]
    return RolloutFnTrainOutput(samples=groups, metrics={"rollout/raw_reward": 0.5, "perf/rollout_time": 2.0})


def log_and_keep_default(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    CALLS.append((rollout_id, args, [s.index for s in samples], dict(rollout_extra_metrics), rollout_time))
    rollout_extra_metrics["custom/acc"] = 0.25
    return False


def log_instead_of_default(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    rollout_extra_metrics["custom/acc"] = 0.25
    rollout_extra_metrics["rollout/raw_reward"] = 0.75  # changed: kept
    return True


def eval_log(rollout_id, args, data, extra_metrics):
    CALLS.append((rollout_id, sorted(data), data["toy"]["rewards"], dict(extra_metrics)))
    extra_metrics["eval/toy-custom"] = 1.0
    return args.skip_default


def _args(skip_default=None, **kw):
    """The plugin view `run_rollout` gets; `skip_default` is an attribute a plugin stashes on it."""
    fields = {"rollout_batch_size": 1, "num_rollout": 1, "rollout_function_path": f"{__name__}.fixed_rollout", **kw}
    args = PluginArgs.from_config(SlimeArgs.from_dict(fields))
    if skip_default is not None:
        args.skip_default = skip_default
    return args


@pytest.fixture(autouse=True)
def _clear_calls():
    CALLS.clear()


def test_without_hook_metrics_pass_through():
    out = run_rollout(_args(), 3, None)
    assert out.metrics == {"rollout/raw_reward": 0.5, "perf/rollout_time": 2.0}


def test_hook_sees_the_original_arguments_and_adds_metrics():
    args = _args(custom_rollout_log_function_path=f"{__name__}.log_and_keep_default")
    out = run_rollout(args, 3, None)
    ((rollout_id, seen_args, indices, metrics, rollout_time),) = CALLS
    assert rollout_id == 3 and seen_args is args and indices == [0, 1]
    assert metrics == {"rollout/raw_reward": 0.5, "perf/rollout_time": 2.0}
    assert isinstance(rollout_time, float) and rollout_time >= 0.0
    assert out.metrics == {"rollout/raw_reward": 0.5, "perf/rollout_time": 2.0, "custom/acc": 0.25}


def test_hook_returning_true_replaces_the_default_metrics():
    out = run_rollout(_args(custom_rollout_log_function_path=f"{__name__}.log_instead_of_default"), 3, None)
    assert out.metrics == {"custom/acc": 0.25, "rollout/raw_reward": 0.75}


@pytest.mark.parametrize(
    ("skip_default", "expected"),
    [(False, {"eval/toy": 0.5, "eval/toy-custom": 1.0}), (True, {"eval/toy-custom": 1.0})],
)
def test_eval_hook(skip_default, expected):
    args = _args(custom_eval_rollout_log_function_path=f"{__name__}.eval_log", skip_default=skip_default)
    out = run_rollout(args, 5, None, evaluation=True)
    assert CALLS == [(5, ["toy"], [1.0, 0.0], {"eval/toy": 0.5})]
    assert out.metrics == expected
    assert run_rollout(_args(custom_eval_rollout_log_function_path=None), 5, None, evaluation=True).metrics == {
        "eval/toy": 0.5
    }


def test_hook_not_called_on_replayed_dumps_and_bad_path_names_the_flag(tmp_path):
    from slime_rollout.runtime.debug_dump import save_debug_rollout_data

    dump = str(tmp_path / "d_{rollout_id}.pt")
    save_debug_rollout_data(_args(save_debug_rollout_data=dump), 0, [Sample(index=0, group_index=0)])
    args = _args(load_debug_rollout_data=dump, custom_rollout_log_function_path=f"{__name__}.log_and_keep_default")
    assert run_rollout(args, 0, None).metrics is None and CALLS == []
    with pytest.raises(PluginError, match="--custom-rollout-log-function-path"):
        run_rollout(_args(custom_rollout_log_function_path=f"{__name__}.missing"), 0, None)
