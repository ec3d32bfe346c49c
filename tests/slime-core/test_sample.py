import dataclasses

import pytest

from slime_core.sample import Sample, Status, status_from_finish_reason


def _sample():
    return Sample(prompt="q", tokens=[1, 2, 3], label="7", index=4)


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        ({"type": "stop", "matched": 151645}, Status.COMPLETED),
        ({"type": "length", "length": 8}, Status.TRUNCATED),
        ({"type": "abort", "message": "x"}, Status.ABORTED),
        ("stop", Status.COMPLETED),
        (None, None),
        ({"type": "weird"}, None),
    ],
)
def test_finish_reason_mapping(reason, status):
    assert status_from_finish_reason(reason) is status


def test_multi_turn_append_keeps_tokens_mask_logprobs_aligned():
    s = _sample()
    s.append_response_tokens([10, 11], log_probs=[-0.5, -0.25], text="ab", meta_info={"weight_version": "1"})
    s.append_response_tokens([20, 21, 22], trainable=False, text="<obs>")
    s.append_response_tokens(
        [30], log_probs=[-1.5], meta_info={"weight_version": "2", "finish_reason": {"type": "length"}}
    )
    assert s.tokens == [1, 2, 3, 10, 11, 20, 21, 22, 30]
    assert s.response_tokens == [10, 11, 20, 21, 22, 30]
    assert s.prompt_length == 3
    assert s.response_length == 6
    assert s.loss_mask == [1, 1, 0, 0, 0, 1]
    assert s.rollout_log_probs == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.5]
    assert s.effective_response_length == 3
    assert s.response == "ab<obs>"
    assert s.weight_versions == ["1", "2"]
    assert s.status is Status.TRUNCATED


def test_masked_span_first_then_logprobs_backfills_zeros():
    s = _sample()
    s.append_response_tokens([7, 8], trainable=False)
    assert s.rollout_log_probs is None
    s.append_response_tokens([9], log_probs=[-0.125])
    assert s.rollout_log_probs == [0.0, 0.0, -0.125]
    assert s.loss_mask == [0, 0, 1]


def test_append_rejects_misaligned_logprobs():
    s = _sample()
    with pytest.raises(ValueError, match="2 log-probs for 3 tokens"):
        s.append_response_tokens([1, 2, 3], log_probs=[-1.0, -1.0])
    with pytest.raises(ValueError, match="non-trainable"):
        s.append_response_tokens([1], log_probs=[-1.0], trainable=False)
    s.append_response_tokens([5], log_probs=[-1.0])
    with pytest.raises(ValueError, match="no log-probs"):
        s.append_response_tokens([6])


def test_validate_catches_broken_invariants():
    s = _sample()
    s.append_response_tokens([5, 6], log_probs=[-1.0, -2.0])
    s.loss_mask.append(1)
    with pytest.raises(ValueError, match="len\\(loss_mask\\)=3 != response_length=2"):
        s.validate()


def test_dict_round_trip_preserves_everything():
    s = _sample()
    s.append_response_tokens([5, 6], log_probs=[-1.0, -2.0], text="xy", meta_info={"finish_reason": {"type": "stop"}})
    s.reward = {"acc": 1.0, "format": 0.5}
    s.metadata = {"source_name": "gsm8k"}
    d = s.to_dict()
    assert d["status"] == "completed"
    back = Sample.from_dict(d)
    assert back == s
    assert back.get_reward_value("acc") == 1.0
    with pytest.raises(ValueError, match="--reward-key"):
        back.get_reward_value(None)
    with pytest.raises(ValueError, match="unknown fields"):
        Sample.from_dict({**d, "bogus": 1})
    with pytest.raises(ValueError, match="unknown status"):
        Sample.from_dict({**d, "status": "exploded"})


def test_reward_value_scalar_and_missing():
    s = _sample()
    with pytest.raises(ValueError, match="no reward"):
        s.get_reward_value()
    s.reward = 1
    assert s.get_reward_value() == 1.0 and isinstance(s.get_reward_value(), float)
    s.reward = {"acc": 0}
    assert s.get_reward_value("acc") == 0.0


def test_views_before_any_response():
    s = _sample()
    assert s.prompt_length == 3
    assert s.response_tokens == []
    assert s.effective_response_length == 0
    s2 = Sample(tokens=[1, 2, 3, 4], response_length=2)
    assert s2.effective_response_length == 2  # no mask yet: every response token counts
    assert s2.response_tokens == [3, 4]


def test_validate_catches_length_and_logprob_mismatch():
    with pytest.raises(ValueError, match="response_length 5 outside"):
        Sample(tokens=[1, 2], response_length=5).validate()
    s = Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], rollout_log_probs=[-1.0])
    with pytest.raises(ValueError, match="len\\(rollout_log_probs\\)=1"):
        s.validate()


def test_to_dict_copies_lists():
    s = _sample()
    s.append_response_tokens([5], log_probs=[-1.0])
    d = s.to_dict()
    d["tokens"].append(99)
    d["loss_mask"].append(1)
    d["metadata"]["x"] = 1
    assert s.tokens == [1, 2, 3, 5]
    assert s.loss_mask == [1]
    assert s.metadata == {}


def test_status_reachable_as_in_original_plugins():
    # Original custom generate functions set `sample.status = Sample.Status.TRUNCATED`.
    s = Sample(prompt="p")
    s.status = Sample.Status.TRUNCATED
    assert s.status is Status.TRUNCATED
    assert Sample.from_dict(s.to_dict()).status is Status.TRUNCATED
    assert "Status" not in {f.name for f in dataclasses.fields(Sample)}


def test_vision_fields_survive_dict_and_json_round_trips():
    import json

    import torch

    s = _sample()
    s.multimodal_inputs = {"images": ["/data/a.png", "data:image/png;base64,iVBORw0KGgo="]}
    pixels = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    grid = torch.tensor([[1, 2, 2]], dtype=torch.int64)
    s.multimodal_train_inputs = {"pixel_values": pixels, "image_grid_thw": grid}
    for data in (s.to_dict(), json.loads(json.dumps(s.to_dict()))):
        back = Sample.from_dict(data)
        assert back.multimodal_inputs == s.multimodal_inputs
        assert back.multimodal_train_inputs["pixel_values"].dtype == torch.float32
        assert torch.equal(back.multimodal_train_inputs["pixel_values"], pixels)
        assert back.multimodal_train_inputs["image_grid_thw"].dtype == torch.int64
        assert back.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 2, 2]]
    text_only = Sample.from_dict(_sample().to_dict())
    assert text_only.multimodal_inputs is None and text_only.multimodal_train_inputs is None


def test_bad_vision_tensor_in_a_dump_is_a_clear_error():
    data = _sample().to_dict()
    data["multimodal_train_inputs"] = {"pixel_values": {"dtype": "nope", "shape": [1], "data": [0.0]}}
    with pytest.raises(ValueError, match="bad multimodal_train_inputs tensor"):
        Sample.from_dict(data)
