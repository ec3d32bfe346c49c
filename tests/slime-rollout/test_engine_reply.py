"""`slime_rollout.generation.engine_reply`: a malformed /generate reply fails naming the sample and the field.

Before, a body that was not JSON failed with `'str' object has no attribute 'get'`, and a NaN log-prob, a negative
or fractional token id were kept (NaN reached the importance weights, 5.7 was read as token 5).
"""

import asyncio

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.generation import generate as single_turn
from slime_rollout.generation.engine_reply import parse_generate_reply


def _reply(*entries, **extra):
    return {
        "text": "x",
        "meta_info": {"output_token_logprobs": list(entries), "finish_reason": {"type": "stop"}},
        **extra,
    }


BAD = [
    ("<html>502 Bad Gateway</html>", r"sample 7: the engine's /generate reply is str '<html>502.*not a JSON object"),
    (None, r"reply is NoneType None, not a JSON object"),
    ({"meta_info": [1]}, r"meta_info is list \[1\], not an object"),
    ({"meta_info": {}}, r"no meta_info\.output_token_logprobs \(was return_logprob sent\?\)"),
    ({"meta_info": {"output_token_logprobs": "abc"}}, r"output_token_logprobs is 'abc', not a list"),
    (_reply([-0.1]), r"output_token_logprobs\[0\] is \[-0\.1\], not \[logprob, token_id, \.\.\.\]"),
    (_reply([-0.1, 5, None], [None, 6, None]), r"output_token_logprobs\[1\]: log-prob None is not a finite number"),
    (_reply([float("nan"), 5, None]), r"\[0\]: log-prob nan is not a finite number"),
    (_reply([float("-inf"), 5, None]), r"\[0\]: log-prob -inf is not a finite number"),
    (_reply([-0.1, -7, None]), r"\[0\]: token id -7 is not a non-negative integer"),
    (_reply([-0.1, 5.7, None]), r"\[0\]: token id 5\.7 is not a non-negative integer"),
    (_reply([-0.1, True, None]), r"\[0\]: token id True is not a non-negative integer"),
    (_reply([-0.1, 5, None], output_ids=[6]), r"output_ids \[6\]\.\.\. disagree"),
]


@pytest.mark.parametrize(("reply", "message"), BAD)
def test_a_malformed_reply_names_the_sample_and_the_field(reply, message):
    with pytest.raises(ValueError, match=message):
        parse_generate_reply(reply, what="sample 7")


def test_a_good_reply_is_read():
    tokens, log_probs, meta = parse_generate_reply(_reply([-0.5, 5, "a"], [0.0, 6.0, "b"]), what="sample 7")
    assert (tokens, log_probs) == ([5, 6], [-0.5, 0.0])
    assert meta["finish_reason"] == {"type": "stop"}


class _Client:
    def __init__(self, reply):
        self.reply = reply

    async def generate(self, payload):
        return self.reply


@pytest.mark.parametrize(("reply", "message"), [BAD[0], BAD[7]])
def test_the_default_generate_checks_the_reply(monkeypatch, reply, message):
    monkeypatch.setattr(single_turn, "get_client", lambda args: _Client(reply))
    args = PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}))
    sample = Sample(prompt="p", tokens=[1, 2], response_length=0, index=7)
    with pytest.raises(ValueError, match=message):
        asyncio.run(single_turn.generate(args, sample, {"max_new_tokens": 4}))
    assert sample.tokens == [1, 2] and sample.rollout_log_probs is None  # nothing of the reply was kept


def test_the_default_generate_reads_sglangs_waiting_queue_abort():
    """SGLang 0.5.16's reply to a request aborted before it was scheduled (tokenizer_manager.py
    `_handle_abort_req`): HTTP 200, no `prompt_tokens`/`cached_tokens`, a two-key finish reason. The sample is
    ABORTED with nothing appended (the reference engine now answers the same, test_reference_sglang_params.py)."""
    reply = {"text": "", "output_ids": [], "meta_info": {
        "id": "r", "finish_reason": {"type": "abort", "message": "Abort in waiting queue"}, "weight_version": "3",
        "e2e_latency": 0.2, "input_token_logprobs": [], "output_token_logprobs": [],
        "output_token_logprobs_length": 0, "completion_tokens": 0}}  # fmt: skip
    args = PluginArgs.from_config(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}))
    sample = Sample(prompt="p", tokens=[1, 2], response_length=0, index=7)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(single_turn, "get_client", lambda args: _Client(reply))
        asyncio.run(single_turn.generate(args, sample, {"max_new_tokens": 4}))
    assert (sample.status.name, sample.tokens, sample.response_length) == ("ABORTED", [1, 2], 0)
