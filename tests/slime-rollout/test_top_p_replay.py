"""Top-p replay on the rollout side: the request, the two reply encodings, and the sample they fill (issue 17)."""

import base64

import numpy as np
import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.generation import generate as generate_mod
from slime_rollout.generation.generate import build_sampling_params
from slime_rollout.generation.top_p_replay import parse_top_p_sets


def _args(**kw):
    fields = dict(rollout_batch_size=1, num_rollout=1, rollout_max_response_len=4, **kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


def test_training_rollouts_with_top_p_ask_for_the_kept_ids():
    assert build_sampling_params(_args(rollout_top_p=0.9))["custom_params"] == {"return_top_p_token_ids": True}
    assert "custom_params" not in build_sampling_params(_args(rollout_top_p=1.0))
    assert "custom_params" not in build_sampling_params(_args(rollout_top_p=0.9), evaluation=True)


def _b64(values):
    return base64.b64encode(np.asarray(values, dtype="<i4").tobytes()).decode("ascii")


def test_both_encodings_and_malformed_replies():
    ids, offsets = [5, 9, 7], [0, 2, 3]
    assert parse_top_p_sets({"top_p_token_ids": ids, "top_p_token_offsets": offsets}, 2) == (ids, offsets)
    assert parse_top_p_sets({"top_p_kept_token_ids": _b64(ids), "top_p_kept_token_offsets": _b64(offsets)}, 2) == (
        ids,
        offsets,
    )
    assert parse_top_p_sets({"output_token_logprobs": []}, 2) is None
    with pytest.raises(ValueError, match="not both"):
        parse_top_p_sets({"top_p_token_ids": ids}, 2)
    with pytest.raises(ValueError, match="3 top-p offsets for 3 response tokens"):
        parse_top_p_sets({"top_p_token_ids": ids, "top_p_token_offsets": offsets}, 3)
    # Base64 with characters outside the alphabet was decoded with them dropped (wrong ids, no error), and a byte
    # count that is not whole int32 values was numpy's "buffer size must be a multiple of element size".
    with pytest.raises(ValueError, match=r"^engine reply: meta_info.top_p_token_ids is not base64"):
        parse_top_p_sets({"top_p_token_ids": _b64(ids)[:-1] + "!=", "top_p_token_offsets": offsets}, 2)
    with pytest.raises(ValueError, match=r"^engine reply: meta_info.top_p_token_offsets has 6 bytes, not int32"):
        parse_top_p_sets({"top_p_token_ids": ids, "top_p_token_offsets": base64.b64encode(b"123456").decode()}, 2)


class _Client:
    def __init__(self, meta_extra):
        self.meta_extra = meta_extra
        self.payloads = []

    async def generate(self, payload):
        self.payloads.append(payload)
        meta = {"output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]], "finish_reason": {"type": "stop"}}
        return {"text": "ab", "output_ids": [7, 8], "meta_info": {**meta, **self.meta_extra}}


async def test_generate_stores_the_sets_on_the_sample(monkeypatch):
    client = _Client({"top_p_token_ids": _b64([7, 3, 8]), "top_p_token_offsets": _b64([0, 2, 3])})
    monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
    args = _args(rollout_top_p=0.9)
    sample = await generate_mod.generate(args, Sample(tokens=[1, 2], index=0), build_sampling_params(args))
    assert client.payloads[0]["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True}
    assert sample.rollout_top_p_token_ids == [7, 3, 8] and sample.rollout_top_p_token_offsets == [0, 2, 3]
    # An engine without replay leaves the sample without sets (training then warns once, full softmax).
    monkeypatch.setattr(generate_mod, "get_client", lambda args: _Client({}))
    plain = await generate_mod.generate(args, Sample(tokens=[1, 2], index=1), build_sampling_params(args))
    assert plain.rollout_top_p_token_ids is None and plain.rollout_log_probs == [-0.5, -0.25]
