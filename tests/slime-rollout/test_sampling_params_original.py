"""The sampling flags reach SGLang's `sampling_params` as the original sends them (issue 27 pass 89, flag honesty).

The reference is the original's code at THUDM/slime 624b824a8, transcribed: `GenerateState.__init__`
(slime/rollout/sglang_rollout.py) for training rollouts, and for eval `eval_rollout_single_dataset` with the
`EvalDatasetConfig` fallbacks of slime/utils/eval_config.py (`eval_*` flag, else its `rollout_*` counterpart; stop,
stop ids and special-token skipping from the rollout flags; `min_new_tokens` from `--eval-min-new-tokens`). Every flag
is set away from its default, so a flag that did not reach the request fails here.
"""

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_rollout.generation.generate import build_sampling_params

_FLAGS = dict(
    rollout_temperature=0.7,
    rollout_top_p=0.9,
    rollout_top_k=20,
    rollout_max_response_len=64,
    rollout_stop=["</answer>", "\n\n"],
    rollout_stop_token_ids=[7, 11],
    rollout_skip_special_tokens=True,
)
_EVAL = dict(eval_temperature=0.0, eval_top_p=0.5, eval_top_k=3, eval_max_response_len=32, eval_min_new_tokens=2)


def _args(**kw):
    return PluginArgs.from_config(SlimeArgs.from_dict(dict(rollout_batch_size=1, num_rollout=1, **kw)))


def _original_train(a) -> dict:
    params = dict(
        temperature=a.rollout_temperature, top_p=a.rollout_top_p, top_k=a.rollout_top_k,
        max_new_tokens=a.rollout_max_response_len, stop=a.rollout_stop, stop_token_ids=a.rollout_stop_token_ids,
        skip_special_tokens=a.rollout_skip_special_tokens, no_stop_trim=True, spaces_between_special_tokens=False,
    )  # fmt: skip
    if a.rollout_top_p != 1.0:
        params["custom_params"] = {"return_top_p_token_ids": True}
    return params


def _original_eval(a) -> dict:
    def pick(eval_value, rollout_value):
        return eval_value if eval_value is not None else rollout_value

    params = dict(
        temperature=pick(a.eval_temperature, a.rollout_temperature), top_p=pick(a.eval_top_p, a.rollout_top_p),
        top_k=pick(a.eval_top_k, a.rollout_top_k),
        max_new_tokens=pick(a.eval_max_response_len, a.rollout_max_response_len), stop=a.rollout_stop,
        stop_token_ids=a.rollout_stop_token_ids, skip_special_tokens=a.rollout_skip_special_tokens, no_stop_trim=True,
        spaces_between_special_tokens=False,
    )  # fmt: skip
    if a.eval_min_new_tokens is not None:
        params["min_new_tokens"] = a.eval_min_new_tokens
    return params


@pytest.mark.parametrize("flags", [{}, _FLAGS], ids=["defaults", "every_flag_set"])
def test_training_sampling_params_are_the_originals(flags):
    args = _args(**{"rollout_max_response_len": 16, **flags})
    assert build_sampling_params(args) == _original_train(args)


@pytest.mark.parametrize("flags", [_FLAGS, {**_FLAGS, **_EVAL}], ids=["eval_falls_back", "eval_flags_set"])
def test_eval_sampling_params_are_the_originals(flags):
    args = _args(**flags)
    params = build_sampling_params(args, evaluation=True)
    assert params == _original_eval(args)
    if "eval_top_k" in flags:  # each eval flag changed what it should, not the training request
        assert (params["temperature"], params["top_k"], params["max_new_tokens"]) == (0.0, 3, 32)
        assert build_sampling_params(args)["top_k"] == 20
