"""The values of a sample a custom generate function built are checked where it hands it over (issue 27, pass 56).

The original's agent examples (search-r1, retool, multi_agent, tau-bench) set `tokens`, `rollout_log_probs` and
`response_length` themselves. The default generate refuses a NaN log-prob or a negative token id in an engine reply
(`engine_reply.parse_generate_reply`); a generate function's sample reached the trainer with them unchecked, and a
field of the wrong type failed later as a bare TypeError naming neither the function nor the sample.
"""

import math

import numpy as np
import pytest
import torch
from slime_rollout_fakes import FakeClient, ListDataSource
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Status
from slime_rollout.generation.rollout import generate_rollout_async

A = ord("A")


def _plugin_sample(sample, *, tokens=None, log_probs=(-0.5, 0.0, -0.25), response_length=3):
    """Modelled on the examples: prompt ids + a model turn, a masked observation, another model turn."""
    sample.tokens = list(sample.tokens) + [5, 6, 7] if tokens is None else tokens
    sample.response, sample.response_length = "x y z", response_length
    sample.loss_mask = [1, 0, 1]
    sample.rollout_log_probs = None if log_probs is None else list(log_probs)
    sample.status = Status.COMPLETED
    return sample


async def nan_log_prob(args, sample, sampling_params):
    return _plugin_sample(sample, log_probs=(-0.5, 0.0, math.nan))


async def inf_log_prob_on_a_masked_token(args, sample, sampling_params):
    return _plugin_sample(sample, log_probs=(-0.5, -math.inf, -0.25))


async def none_log_prob_on_a_trained_token(args, sample, sampling_params):
    return _plugin_sample(sample, log_probs=(-0.5, None, None))


async def negative_token(args, sample, sampling_params):
    return _plugin_sample(sample, tokens=[*sample.tokens, 5, -1, 7])


async def fractional_token(args, sample, sampling_params):
    return _plugin_sample(sample, tokens=[*sample.tokens, 5, 6.5, 7])


async def tokens_as_text(args, sample, sampling_params):
    return _plugin_sample(sample, tokens="ABCDEF")


async def response_length_unset(args, sample, sampling_params):
    return _plugin_sample(sample, response_length=None)


@pytest.mark.parametrize(
    ("fn", "error", "why"),
    [
        ("nan_log_prob", ValueError, r"rollout_log_probs\[2\]: log-prob nan is not a finite number"),
        ("inf_log_prob_on_a_masked_token", ValueError, r"rollout_log_probs\[1\]: log-prob -inf is not a finite number"),
        ("negative_token", ValueError, r"tokens\[2\]: token id -1 is not a non-negative integer"),
        ("fractional_token", ValueError, r"tokens\[2\]: token id 6\.5 is not a non-negative integer"),
        ("tokens_as_text", TypeError, r"tokens is str 'ABCDEF', not a list of token ids"),
        ("response_length_unset", TypeError, r"response_length is NoneType None, not an int"),
        (
            "none_log_prob_on_a_trained_token",
            ValueError,
            r"rollout_log_probs\[2\]: log-prob None is not a finite number",
        ),
    ],
)
async def test_a_generate_function_s_bad_values_are_one_error_naming_it_and_the_sample(use_client, fn, error, why):
    # Was: NaN/-inf log-probs and negative or fractional ids were trained on (a NaN poisons a step's importance
    # weights; a negative id indexes the embedding from its end, or is a device-side assert on a GPU); text tokens
    # and an unset response_length failed later as bare TypeErrors ("new(): invalid data type 'str'").
    use_client(FakeClient({0: [A], 1: [A]}))
    with pytest.raises(error, match=rf"^generate function {__name__}\.{fn} on sample (\d) returned a sample whose "
                                    rf"values are wrong: sample \1: {why}$"):  # fmt: skip
        await generate_rollout_async(_args(custom_generate_function_path=f"{__name__}.{fn}"), 0, ListDataSource(n=2))


async def tensors_and_arrays(args, sample, sampling_params):
    if sample.index == 0:
        return _plugin_sample(sample, tokens=torch.tensor([*sample.tokens, 5, 6, 7]))
    sample = _plugin_sample(sample, tokens=np.array([*sample.tokens, 5, 6, 7]))
    sample.rollout_log_probs = np.array(sample.rollout_log_probs)
    return sample


async def masked_response_without_log_probs(args, sample, sampling_params):
    # tau-bench's samples: no rollout log-probs at all.
    return _plugin_sample(sample, log_probs=None)


async def no_metadata(args, sample, sampling_params):
    sample = _plugin_sample(sample)
    sample.metadata = None
    return sample


@pytest.mark.parametrize("fn", ["tensors_and_arrays", "masked_response_without_log_probs", "no_metadata"])
async def test_values_the_original_trains_on_still_pass(use_client, fn):
    use_client(FakeClient({0: [A], 1: [A]}))
    out, _ = await generate_rollout_async(_args(custom_generate_function_path=f"{__name__}.{fn}"), 0,
                                          ListDataSource(n=2))  # fmt: skip
    samples = [s for group in out.samples for s in group]
    assert len(samples) == 4
    for s in samples:
        assert [int(t) for t in s.tokens][-3:] == [5, 6, 7] and s.response_length == 3
        # metadata None is read as the empty dict the original's readers take it for (was: "argument of type
        # 'NoneType' is not iterable" in the rollout metrics, naming nothing).
        assert isinstance(s.metadata, dict)


@pytest.mark.parametrize("fn", ["nan_log_prob", "negative_token", "tokens_as_text"])
async def test_an_eval_sample_s_tokens_and_log_probs_are_not_checked(fn):
    # Nothing reads them in an eval (the original runs such an eval); its response_length still must be an int.
    from slime_core.sample import Sample
    from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm

    args = _args(custom_generate_function_path=f"{__name__}.{fn}")
    state = RolloutState.create(args, rollout_id=0, evaluation=True)
    out = await generate_and_rm(args, Sample(prompt="p", tokens=[A], index=0, group_index=0), state)
    assert out.response_length == 3 and out.reward is not None
    args.custom_generate_function_path = f"{__name__}.response_length_unset"
    with pytest.raises(TypeError, match=r"sample 1: response_length is NoneType None, not an int$"):
        await generate_and_rm(args, Sample(prompt="p", tokens=[A], index=1, group_index=0), state)


async def none_log_prob_on_a_masked_token(args, sample, sampling_params):
    # The original's examples/strands_sglang with its pinned strands-sglang 0.4.2: the tool result's tokens (a prompt
    # segment to strands) come with None log-probs, copied as they are into rollout_log_probs.
    return _plugin_sample(sample, log_probs=(-0.5, None, -0.25))


async def test_a_none_log_prob_on_a_masked_token_is_zero(use_client):
    # Was: "rollout_log_probs[1]: log-prob None is not a finite number" (the original: a TypeError in its trainer), so
    # the strands example stopped at its first tool call; nothing reads a masked position's log-prob.
    use_client(FakeClient({0: [A], 1: [A]}))
    args = _args(custom_generate_function_path=f"{__name__}.none_log_prob_on_a_masked_token")
    out, _ = await generate_rollout_async(args, 0, ListDataSource(n=2))
    samples = [s for group in out.samples for s in group]
    assert [s.rollout_log_probs for s in samples] == [[-0.5, 0.0, -0.25]] * 4
    assert [s.loss_mask for s in samples] == [[1, 0, 1]] * 4
