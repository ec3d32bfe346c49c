"""`--custom-rollout-log-function-path` / `--custom-eval-rollout-log-function-path` through `run_rollout`."""

import asyncio
import sys
import threading

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.plugins import PluginError
from slime_core.sample import Sample
from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime_rollout.generation.rollout import run_rollout
from slime_rollout.runtime.deadlines import DeadlineExceeded, PluginExit

CALLS = []


def fixed_rollout(args, rollout_id, data_source, evaluation=False):
    """A rollout function with known samples and metrics."""
    if evaluation:
        data = {"toy": {"rewards": [1.0, 0.0], "truncated": [False, True], "samples": [Sample(index=7)]}}
        return RolloutFnEvalOutput(data=data, metrics={"eval/toy": 0.5})
    groups = [[Sample(index=0, reward=1.0), Sample(index=1, reward=0.0)]]
    return RolloutFnTrainOutput(samples=groups, metrics={"rollout/raw_reward": 0.5, "rollout/tool_calls": 2.0})


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


# What run_rollout computes from fixed_rollout's samples (two empty responses, rewards 1 and 0), as the original's
# log_rollout_data / log_eval_rollout_data do for any rollout function; a computed entry wins over the function's own
# of the same name, as there (`log_dict = {**extra}; log_dict |= computed`).
TRAIN_DEFAULTS = {
    "rollout/raw_reward": 0.5, "rollout/rewards": 0.0, "rollout/num_empty_responses": 2.0,
    "rollout/env_failed_samples": 0.0, "rollout/env_backend_error_samples": 0.0,
    "rollout/response_len/mean": 0.0, "rollout/response_len/median": 0.0, "rollout/response_len/max": 0.0,
    "rollout/response_len/min": 0.0, "rollout/truncated_ratio": 0.0, "perf/tokens_per_gpu_per_sec": 0.0,
    "perf/effective_tokens_per_gpu_per_sec": 0.0, "perf/longest_sample_tokens_per_sec": 0.0,
    "perf/longest_effective_sample_tokens_per_sec": 0.0, "rollout/repetition_frac": 0.0,
}  # fmt: skip
EVAL_DEFAULTS = {
    "eval/toy-truncated_ratio": 0.5, "eval/toy/response_len/mean": 0.0, "eval/toy/response_len/median": 0.0,
    "eval/toy/response_len/max": 0.0, "eval/toy/response_len/min": 0.0, "eval/toy/repetition_frac": 0.0,
    "eval/toy/truncated_ratio": 0.0,
}  # fmt: skip


def _timed(metrics):
    """`metrics` less `perf/rollout_time`, the function's measured wall time (checked to be one)."""
    metrics = dict(metrics)
    assert 0.0 <= metrics.pop("perf/rollout_time") < 60.0
    return metrics


def test_without_hook_metrics_pass_through():
    out = run_rollout(_args(), 3, None)
    assert _timed(out.metrics) == {**TRAIN_DEFAULTS, "rollout/tool_calls": 2.0}


def test_hook_sees_the_original_arguments_and_adds_metrics():
    args = _args(custom_rollout_log_function_path=f"{__name__}.log_and_keep_default")
    out = run_rollout(args, 3, None)
    ((rollout_id, seen_args, indices, metrics, rollout_time),) = CALLS
    assert rollout_id == 3 and seen_args is args and indices == [0, 1]
    assert _timed(metrics) == {**TRAIN_DEFAULTS, "rollout/tool_calls": 2.0}
    assert isinstance(rollout_time, float) and rollout_time >= 0.0
    assert _timed(out.metrics) == {**TRAIN_DEFAULTS, "rollout/tool_calls": 2.0, "custom/acc": 0.25}


def clashing_rollout(args, rollout_id, data_source, evaluation=False):
    """A rollout function whose own metrics reuse names the original computes from its output."""
    if evaluation:
        data = {"toy": {"rewards": [1.0, 0.0], "truncated": [False, True], "samples": [Sample(index=7)]}}
        return RolloutFnEvalOutput(data=data, metrics={"eval/toy": 0.9, "eval/toy-truncated_ratio": 0.0, "eval/x": 3.0})
    groups = [[Sample(index=0, reward=1.0), Sample(index=1, reward=0.0)]]
    metrics = {"rollout/response_len/mean": 99.0, "rollout/truncated_ratio": 0.7, "rollout/tool_calls": 2.0}
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def test_computed_metrics_win_over_the_functions_own_of_the_same_name():
    # The original's log_rollout_data: `log_dict = {**rollout_extra_metrics}` then `|=` the computed statistics;
    # log_eval_rollout_data sets eval/<name> and eval/<name>-truncated_ratio over the function's extra metrics. Here
    # the function's values were logged under those names (eval/toy 0.9 for a mean reward of 0.5).
    path = f"{__name__}.clashing_rollout"
    args = _args(rollout_function_path=path, eval_function_path=path)
    out = _timed(run_rollout(args, 3, None).metrics)
    assert out == {**TRAIN_DEFAULTS, "rollout/tool_calls": 2.0}
    assert out["rollout/response_len/mean"] == 0.0 and out["rollout/truncated_ratio"] == 0.0
    evaluated = run_rollout(args, 3, None, evaluation=True).metrics
    assert evaluated == {**EVAL_DEFAULTS, "eval/toy": 0.5, "eval/x": 3.0}
    assert evaluated["eval/toy-truncated_ratio"] == 0.5


def test_hook_returning_true_replaces_the_default_metrics():
    out = run_rollout(_args(custom_rollout_log_function_path=f"{__name__}.log_instead_of_default"), 3, None)
    assert out.metrics == {"custom/acc": 0.25, "rollout/raw_reward": 0.75}


@pytest.mark.parametrize(
    ("skip_default", "expected"),
    [(False, {**EVAL_DEFAULTS, "eval/toy": 0.5, "eval/toy-custom": 1.0}), (True, {"eval/toy-custom": 1.0})],
)
def test_eval_hook(skip_default, expected):
    args = _args(custom_eval_rollout_log_function_path=f"{__name__}.eval_log", skip_default=skip_default)
    out = run_rollout(args, 5, None, evaluation=True)
    assert CALLS == [(5, ["toy"], [1.0, 0.0], {**EVAL_DEFAULTS, "eval/toy": 0.5})]
    assert out.metrics == expected
    assert run_rollout(_args(custom_eval_rollout_log_function_path=None), 5, None, evaluation=True).metrics == {
        **EVAL_DEFAULTS,
        "eval/toy": 0.5,
    }


def test_hook_called_on_replayed_dumps_and_bad_path_names_the_flag(tmp_path):
    # The original's log_rollout_data calls the custom function before it checks --load-debug-rollout-data (then it
    # logs nothing of its own); it was not called here on a replay, so its metrics were silently missing.
    from slime_rollout.runtime.debug_dump import save_debug_rollout_data

    dump = str(tmp_path / "d_{rollout_id}.pt")
    samples = [Sample(index=0, group_index=0, reward=1.0), Sample(index=1, group_index=0, reward=0.0)]
    save_debug_rollout_data(_args(save_debug_rollout_data=dump), 0, samples)
    assert run_rollout(_args(load_debug_rollout_data=dump), 0, None).metrics is None
    args = _args(load_debug_rollout_data=dump, custom_rollout_log_function_path=f"{__name__}.log_and_keep_default")
    out = run_rollout(args, 0, None)
    assert out.metrics == {"custom/acc": 0.25}
    assert [(c[0], c[1], c[2], c[3]) for c in CALLS] == [(0, args, [0, 1], {})] and CALLS[0][4] >= 0.0
    assert [[s.index for s in g] for g in out.samples] == [[0, 1]]
    with pytest.raises(PluginError, match="--custom-rollout-log-function-path"):
        run_rollout(_args(custom_rollout_log_function_path=f"{__name__}.missing"), 0, None)


# ---- deadlines (issue 27 #12): the rollout and eval functions and the log functions are bounded and named -----------

RELEASE = threading.Event()  # set at teardown: the abandoned threads of the hung functions then return


@pytest.fixture
def release_hung_functions():
    RELEASE.clear()
    yield
    RELEASE.set()


def hung_rollout(args, rollout_id, data_source, evaluation=False):
    CALLS.append(("rollout", rollout_id, evaluation))
    RELEASE.wait()  # e.g. waiting on an engine that will never answer


async def hung_async_rollout(args, rollout_id, data_source, evaluation=False):
    CALLS.append(("async rollout", rollout_id, evaluation))
    await asyncio.Event().wait()


def hung_log(*args):
    CALLS.append(("log", args[0]))
    RELEASE.wait()  # e.g. a metrics service that never answers


def _bounded(**kw):
    return _args(rollout_timeout_secs=0.8, plugin_timeout_secs=0.5, slow_call_warning_secs=0.1, **kw)


@pytest.mark.parametrize("fn", ["hung_rollout", "hung_async_rollout"])
def test_a_rollout_function_that_never_returns_fails_naming_it_and_the_rollout(release_hung_functions, caplog, fn):
    path = f"{__name__}.{fn}"
    with pytest.raises(DeadlineExceeded) as e:  # was: the run stalled with no word
        run_rollout(_bounded(rollout_function_path=path), 4, None)
    assert str(e.value) == (
        f"--rollout-function-path {path} (rollout 4) did not finish within 0.8 s (--rollout-timeout-secs); cancelled"
    )
    assert len(CALLS) == 1 and CALLS[0][1:] == (4, False)
    # Warned at each quarter of the deadline (0.2 s here: more than --slow-call-warning-secs), not every 0.1 s.
    warnings = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    assert 1 <= len(warnings) <= 3 and all(m.startswith(f"--rollout-function-path {path} ") for m in warnings)


def test_an_eval_function_that_never_returns_fails_naming_it(release_hung_functions):
    path = f"{__name__}.hung_rollout"
    with pytest.raises(DeadlineExceeded, match=rf"^--eval-function-path {path} \(eval 6\) did not finish within 0\.8"):
        run_rollout(_bounded(eval_function_path=path), 6, None, evaluation=True)
    assert CALLS == [("rollout", 6, True)]


@pytest.mark.parametrize(
    ("flag", "evaluation"),
    [("custom_rollout_log_function_path", False), ("custom_eval_rollout_log_function_path", True)],
)
def test_a_log_function_that_never_returns_fails_naming_it(release_hung_functions, flag, evaluation):
    path = f"{__name__}.hung_log"
    shown = "--" + flag.replace("_", "-")
    with pytest.raises(DeadlineExceeded) as e:
        run_rollout(_bounded(**{flag: path}), 2, None, evaluation=evaluation)
    assert str(e.value) == f"{shown} {path} (rollout 2) did not finish within 0.5 s (--plugin-timeout-secs); cancelled"
    assert CALLS == [("log", 2)]


def test_a_plugin_exit_in_a_rollout_function_is_named_not_a_process_exit():
    with pytest.raises(PluginExit, match=r"^SystemExit: 3$"):
        run_rollout(_args(rollout_function_path=f"{__name__}.exits"), 0, None)


def exits(args, rollout_id, data_source, evaluation=False):
    sys.exit(3)


# ---- what a rollout function returns (fault injection: a plugin returning the wrong thing) --------------------------


def flat_rollout(args, rollout_id, data_source, evaluation=False):
    return [Sample(index=0, reward=1.0), Sample(index=1, reward=0.0)]  # no groups: the original flattens anyway


def none_inside(args, rollout_id, data_source, evaluation=False):
    return [[Sample(index=0), None]]


def returns_none(args, rollout_id, data_source, evaluation=False):
    return None


def eval_of_lists(args, rollout_id, data_source, evaluation=False):
    return {"toy": [1.0, 0.0]}


def test_a_flat_list_of_samples_is_accepted_as_the_original_does():
    args = _args(rollout_function_path=f"{__name__}.flat_rollout",
                 custom_rollout_log_function_path=f"{__name__}.log_and_keep_default")  # fmt: skip
    out = run_rollout(args, 1, None)  # was: TypeError: 'Sample' object is not iterable
    assert [s.index for s in out.samples] == [0, 1] and CALLS[0][2] == [0, 1]


@pytest.mark.parametrize(
    ("fn", "evaluation", "message"),
    [
        ("returns_none", False, "returned NoneType, not a RolloutFnTrainOutput or a list of groups"),
        ("none_inside", False, "returned NoneType at samples[0][1], not a Sample or a list of them"),
        ("eval_of_lists", True, "returned list for dataset 'toy', not a dict of rewards, truncated and samples"),
    ],
)
def test_a_wrong_return_value_is_one_error_naming_the_function(fn, evaluation, message):
    flag = "eval_function_path" if evaluation else "rollout_function_path"
    with pytest.raises(TypeError) as e:
        run_rollout(_args(**{flag: f"{__name__}.{fn}"}), 3, None, evaluation=evaluation)
    kind = "eval" if evaluation else "rollout"
    assert str(e.value) == f"--{flag.replace('_', '-')} {__name__}.{fn} ({kind} 3) {message}"
