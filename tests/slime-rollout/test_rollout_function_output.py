"""What a custom `--rollout-function-path` / `--eval-function-path` returns, as the original takes it (issue 27,
plugin pass): its output types built positionally, and the default metrics computed from a bare output.

The original computes `rollout/*` and `eval/{name}` from the samples and the eval data
(`log_rollout_data`, `log_eval_rollout_data`) whatever the function reported; here a custom function's output got only
the metrics it carried itself: the original's own convention (`RolloutFnEvalOutput(data=...)`, a bare dict) logged no
eval curve at all. `RolloutFnTrainOutput(groups, metrics)` (valid for the original's plain dataclasses) was a TypeError.
"""

import pytest
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Sample, Status
from slime_rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime_rollout.generation.rollout import run_rollout


def _samples():
    """Two groups of two: rewards 0, 1 | 0, 1; response lengths 2, 3, 2, 3; sample 3 truncated."""
    out = []
    for i in range(4):
        s = Sample(prompt="p", tokens=[1, 2, 3, 4][: 1 + 2 + i % 2], index=i, group_index=i // 2, reward=float(i % 2))
        s.response_length = 2 + i % 2
        s.status = Status.TRUNCATED if i == 3 else Status.COMPLETED
        out.append(s)
    return out


def bare_rollout(args, rollout_id, data_source, evaluation=False):
    samples = _samples()
    if evaluation:  # the original's legacy bare eval dict
        truncated = [s.status is Status.TRUNCATED for s in samples]
        return {"math": {"rewards": [s.reward for s in samples], "truncated": truncated, "samples": samples}}
    return [samples[:2], samples[2:]]


def positional_rollout(args, rollout_id, data_source, evaluation=False):
    samples = _samples()
    if evaluation:
        return RolloutFnEvalOutput({"gsm": {"rewards": [1.0, 1.0, 0.0, 1.0]}}, {"eval/gsm": 0.5, "eval/extra": 2.0})
    return RolloutFnTrainOutput([samples[:2], samples[2:]], {"rollout/raw_reward": 9.0, "custom/x": 1.0})


def bad_rewards_eval(args, rollout_id, data_source, evaluation=False):
    return {"math": {"rewards": [1.0, None], "samples": _samples()[:2]}}


def test_a_bare_output_gets_the_default_metrics():
    args = _args(rollout_function_path=f"{__name__}.bare_rollout")
    train = run_rollout(args, 0, None)
    m = train.metrics
    assert m["rollout/raw_reward"] == 0.5 and m["rollout/rewards"] == 0.0  # GRPO: each group's 0, 1 → -0.7, 0.7
    assert m["rollout/response_len/mean"] == 2.5 and m["rollout/response_len/max"] == 3.0
    assert m["rollout/truncated_ratio"] == 0.25
    evaluation = run_rollout(args, 0, None, evaluation=True)
    assert evaluation.metrics == {
        "eval/math": 0.5,
        "eval/math-truncated_ratio": 0.25,
        "eval/math/response_len/mean": 2.5,
        "eval/math/response_len/median": 2.5,
        "eval/math/response_len/max": 3.0,
        "eval/math/response_len/min": 2.0,
        "eval/math/repetition_frac": 0.0,
        "eval/math/truncated_ratio": 0.25,
    }


def test_positional_outputs_and_the_computed_metrics_win():
    args = _args(rollout_function_path=f"{__name__}.positional_rollout", log_passrate=True,
                 n_samples_per_eval_prompt=2)  # fmt: skip
    train = run_rollout(args, 0, None)
    # A computed entry wins over the function's own of the same name, as the original's log_rollout_data
    # (`log_dict = {**rollout_extra_metrics}; log_dict |= computed`); its other entries are kept.
    assert train.metrics["rollout/raw_reward"] == 0.5 and train.metrics["custom/x"] == 1.0
    assert train.metrics["rollout/response_len/mean"] == 2.5
    evaluation = run_rollout(args, 0, None, evaluation=True)
    # eval/gsm is the mean reward (the original's log_eval_rollout_data sets it over the function's 0.5); pass@k over
    # groups of --n-samples-per-eval-prompt 2: (1, 1) and (0, 1).
    assert evaluation.metrics == {"eval/gsm": 0.75, "eval/extra": 2.0, "eval/gsm-pass@1": 0.75, "eval/gsm-pass@2": 1.0}


def test_eval_rewards_that_are_not_numbers_are_one_error_naming_the_function_and_the_dataset():
    path = f"{__name__}.bad_rewards_eval"
    args = _args(eval_function_path=path)
    with pytest.raises(TypeError, match=rf"^--eval-function-path {path} \(eval 3\) returned \[1\.0, None\] as the "
                       r"rewards of eval dataset 'math', not a list of finite numbers$"):  # fmt: skip
        run_rollout(args, 3, None, evaluation=True)


def _fan_out_rollout(rollout_ids):
    """One group whose first entry is a fan-out of two samples carrying `rollout_ids`, its second a plain sample."""
    samples = _samples()[:3]
    for s, rollout_id in zip(samples, rollout_ids, strict=False):
        s.rollout_id = rollout_id
    return [[samples[:2], samples[2]]]


def fan_out_without_rollout_ids(args, rollout_id, data_source, evaluation=False):
    return _fan_out_rollout([None, None])


def fan_out_with_two_rollout_ids(args, rollout_id, data_source, evaluation=False):
    return _fan_out_rollout([0, 1])


def fan_out_sharing_a_rollout_id(args, rollout_id, data_source, evaluation=False):
    return _fan_out_rollout([0, 0])


@pytest.mark.parametrize(("fn", "ids"), [("fan_out_without_rollout_ids", [None, None]),
                                         ("fan_out_with_two_rollout_ids", [0, 1])])  # fmt: skip
def test_a_fan_out_whose_samples_do_not_share_a_rollout_id_is_one_error_naming_the_function(fn, ids):
    # The original refuses it (validate_rollout_id_annotated): each sample counted as a rollout of its own here, so
    # one execution's samples weighed in the loss as that many rollouts.
    path = f"{__name__}.{fn}"
    with pytest.raises(ValueError) as e:
        run_rollout(_args(rollout_function_path=path), 0, None)
    assert str(e.value) == (
        f"--rollout-function-path {path} (rollout 0): samples[0][0] holds 2 samples of one rollout execution (samples "
        f"[0, 1]) with rollout_id {ids}; set the same Sample.rollout_id on each (e.g. the input sample's index), so "
        "the loss counts the execution once, as the original requires"
    )
    shared = run_rollout(_args(rollout_function_path=f"{__name__}.fan_out_sharing_a_rollout_id"), 0, None)
    assert [s.rollout_id for s in shared.samples[0][0]] == [0, 0]
