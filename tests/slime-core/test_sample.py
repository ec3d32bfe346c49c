import dataclasses

import pytest
import torch

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


def test_trainable_span_without_logprobs_raises_and_leaves_the_sample_unchanged():
    # Issue 17: a first trainable span without log-probs used to pass, and a later span with log-probs then
    # back-filled it with 0.0 (log-prob 0 = "probability 1") for tokens the engine never scored.
    s = _sample()
    with pytest.raises(ValueError, match="sample 4: trainable span of 2 tokens has no log-probs"):
        s.append_response_tokens([5, 6])
    assert (s.tokens, s.response_length, s.rollout_log_probs) == ([1, 2, 3], 0, None)
    s.append_response_tokens([7], trainable=False)  # a masked span first is fine ...
    with pytest.raises(ValueError, match="no log-probs"):
        s.append_response_tokens([8])  # ... but the trainable one after it still needs log-probs
    s.append_response_tokens([], trainable=True)  # an empty span needs none
    assert s.response_length == 1


def test_an_empty_model_span_with_its_log_probs_list_starts_rollout_log_probs_as_the_original():
    # The original's multi_agent example appends an aborted reply as tokens=[], log_probs=[] and then asserts
    # len(sample.rollout_log_probs) == response_length: the original's append starts the list for any log_probs it is
    # given. Here it stayed None, the assert raised a TypeError the example catches, and the ABORTED sample was lost
    # from the fan-out (its siblings trained, where the original drops or re-queues the whole fan-out).
    s = _sample()
    s.append_response_tokens(None, tokens=[], log_probs=[], meta_info={"finish_reason": {"type": "abort"}})
    assert s.rollout_log_probs == [] and s.response_length == 0 and s.status is Status.ABORTED
    masked_first = _sample()
    masked_first.append_response_tokens([7, 8], trainable=False)
    masked_first.append_response_tokens(None, tokens=[], log_probs=[])
    assert masked_first.rollout_log_probs == [0.0, 0.0]
    # Without log-probs an empty span still starts nothing; nor does one after trainable tokens that have none.
    bare = _sample()
    bare.append_response_tokens([], trainable=True)
    assert bare.rollout_log_probs is None
    direct = Sample(tokens=[1, 2, 9], response_length=1, index=8)
    direct.append_response_tokens([], log_probs=[])
    assert direct.rollout_log_probs is None and direct.loss_mask == [1]


def test_logprobs_after_direct_trainable_response_raise():
    # A response set directly (no mask: all trainable, no log-probs) cannot later gain log-probs for only part.
    s = Sample(tokens=[1, 2, 3, 9, 9], response_length=2, index=5)
    with pytest.raises(ValueError, match="sample 5: span with log-probs appended to a response whose 2 trainable"):
        s.append_response_tokens([7], log_probs=[-0.5])


def test_append_to_response_without_mask_starts_from_ones():
    # Set directly without a loss mask, then extended with masked tool tokens: the earlier part stays trainable
    # (before: loss_mask started empty and validate() failed with a length mismatch).
    s = Sample(tokens=[1, 2, 3, 9, 9], response_length=2, index=6)
    s.append_response_tokens([4, 4, 4], trainable=False, text="<obs>")
    assert s.loss_mask == [1, 1, 0, 0, 0]
    assert s.rollout_log_probs is None and s.response_length == 5 and s.effective_response_length == 2
    # All-masked earlier response (e.g. an off-policy prefix): log-probs may start there, 0.0 on the prefix.
    t = Sample(tokens=[1, 9, 9], response_length=2, loss_mask=[0, 0], index=7)
    t.append_response_tokens([5], log_probs=[-0.25])
    assert t.rollout_log_probs == [0.0, 0.0, -0.25] and t.loss_mask == [0, 0, 1]


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
    s.teacher_log_probs = torch.tensor([-0.5, -0.25])  # as the original's OPD post-process stores them
    d = s.to_dict()
    assert d["status"] == "completed" and d["teacher_log_probs"] == [-0.5, -0.25]
    back = Sample.from_dict(d)
    s.teacher_log_probs = [-0.5, -0.25]
    assert back == s
    assert back.get_reward_value("acc") == 1.0
    with pytest.raises(ValueError, match="--reward-key"):
        back.get_reward_value(None)
    for key in ("9lives", "_private", "prompt_length", "append_response_tokens"):  # no plugin attribute's name
        with pytest.raises(ValueError, match=rf"unknown fields \['{key}'\]"):
            Sample.from_dict({**d, key: 1})
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


def test_processor_lists_in_vision_inputs_survive_dict_and_json_round_trips():
    """The original's examples/geo3k_vlm_multi_turn stores the processor's whole output (less input_ids and
    attention_mask) as `multimodal_train_inputs`: with transformers 5 that holds `mm_token_type_ids` as nested int
    lists next to the tensors. The original's `to_dict` keeps any value; ours raised AttributeError ('list' object
    has no attribute 'detach') in `--save-debug-rollout-data` and the partial-rollout buffer."""
    import json

    import torch

    s = _sample()
    pixels = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    s.multimodal_train_inputs = {"pixel_values": pixels, "image_grid_thw": torch.tensor([[1, 1, 2]]),
                                 "mm_token_type_ids": [[0, 0, 1, 1, 0]]}  # fmt: skip
    for data in (s.to_dict(), json.loads(json.dumps(s.to_dict()))):
        back = Sample.from_dict(data)
        assert torch.equal(back.multimodal_train_inputs["pixel_values"], pixels)
        assert back.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 1, 2]]
        assert back.multimodal_train_inputs["mm_token_type_ids"] == [[0, 0, 1, 1, 0]]


def test_bad_vision_tensor_in_a_dump_is_a_clear_error():
    data = _sample().to_dict()
    data["multimodal_train_inputs"] = {"pixel_values": {"dtype": "nope", "shape": [1], "data": [0.0]}}
    with pytest.raises(ValueError, match="bad multimodal_train_inputs tensor"):
        Sample.from_dict(data)


def test_top_p_sets_follow_the_response():
    # Two model turns with the engine's nucleus per token and a tool span between them (empty sets there).
    s = _sample()
    s.append_response_tokens([10, 11], log_probs=[-0.5, -0.25], top_p=([10, 12, 11], [0, 2, 3]))
    s.append_response_tokens([20, 21], trainable=False)
    s.append_response_tokens([30], log_probs=[-1.0], top_p=([30, 31], [0, 2]))
    assert s.rollout_top_p_token_ids == [10, 12, 11, 30, 31]
    assert s.rollout_top_p_token_offsets == [0, 2, 3, 3, 3, 5]
    again = Sample.from_dict(s.to_dict())
    assert again.rollout_top_p_token_offsets == s.rollout_top_p_token_offsets
    # A masked span first: its positions get empty sets when the first sets arrive.
    t = _sample()
    t.append_response_tokens([7], trainable=False)
    t.append_response_tokens([8], log_probs=[-0.1], top_p=([8], [0, 1]))
    assert t.rollout_top_p_token_offsets == [0, 0, 1]


def test_top_p_sets_cover_every_trainable_token_or_none():
    s = _sample()
    s.append_response_tokens([10], log_probs=[-0.5], top_p=([10], [0, 1]))
    with pytest.raises(ValueError, match="trainable span without top-p sets"):
        s.append_response_tokens([11], log_probs=[-0.5])
    t = _sample()
    t.append_response_tokens([10], log_probs=[-0.5])
    with pytest.raises(ValueError, match="earlier trainable tokens have none"):
        t.append_response_tokens([11], log_probs=[-0.5], top_p=([11], [0, 1]))
    with pytest.raises(ValueError, match="2 top-p offsets for 2 response tokens"):
        _sample().append_response_tokens([1, 2], log_probs=[-1.0, -1.0], top_p=([1], [0, 1]))
    with pytest.raises(ValueError, match="non-trainable span has no top-p sets"):
        _sample().append_response_tokens([1], trainable=False, top_p=([1], [0, 1]))
    bad = Sample(tokens=[1, 2], response_length=1, rollout_top_p_token_ids=[2], rollout_top_p_token_offsets=[0, 2])
    with pytest.raises(ValueError, match="from 0 to len"):
        bad.validate()


def test_the_original_append_reads_the_top_p_sets_of_its_meta_info():
    # A generate function written for the original (its retool, search-r1 and multi_agent examples, its own
    # generate) passes the reply's meta_info and no sets; the original's append reads them from it. They were left
    # out here: its samples trained on the full softmax under --rollout-top-p < 1, with a warning blaming the engine.
    import base64

    import numpy as np

    s = _sample()  # `slime.utils.types.Sample` is this class
    meta = {"top_p_token_ids": [10, 12, 11], "top_p_token_offsets": [0, 2, 3], "finish_reason": {"type": "length"}}
    s.append_response_tokens(None, tokens=[10, 11], log_probs=[-0.5, -0.25], trainable=True, meta_info=meta)
    s.append_response_tokens(None, tokens=[20], trainable=False)  # a tool observation: an empty set
    as_base64 = {  # SGLang's encoding: base64 of little-endian int32
        "top_p_token_ids": base64.b64encode(np.array([30, 31], "<i4").tobytes()).decode(),
        "top_p_token_offsets": base64.b64encode(np.array([0, 2], "<i4").tobytes()).decode(),
    }
    s.append_response_tokens(None, tokens=[30], log_probs=[-1.0], meta_info=as_base64, update_terminal_info=False)
    assert (s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets) == ([10, 12, 11, 30, 31], [0, 2, 3, 3, 5])
    assert s.status is Status.TRUNCATED
    with pytest.raises(ValueError, match=r"^sample 4: meta_info: 2 top-p offsets for 2 response tokens"):
        s.append_response_tokens(None, tokens=[40, 41], log_probs=[-1.0, -1.0], meta_info=as_base64)
    plain = _sample()  # a reply without sets leaves the sample without them
    plain.append_response_tokens([10], log_probs=[-0.5], meta_info={"finish_reason": {"type": "stop"}})
    assert plain.rollout_top_p_token_offsets is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # was: accepted, the sample's "tokens" were the characters of a string
        ("tokens", "no", "field 'tokens' must be a list of int, got str ('no')"),
        ("tokens", [1, "2"], "field 'tokens' must be a list of int, got list with a str at position 1"),
        ("tokens", [1, 2.0], "field 'tokens' must be a list of int, got list with a float at position 1"),
        ("response_length", "2", "field 'response_length' must be an int, got str ('2')"),
        ("response_length", True, "field 'response_length' must be an int, got bool (True)"),
        ("reward", "1.0", "field 'reward' must be a number, a dict or None, got str ('1.0')"),
        ("loss_mask", 1, "field 'loss_mask' must be a list of int or None, got int (1)"),
        ("rollout_log_probs", ["x"], "field 'rollout_log_probs' must be a list of numbers or None, got list with a"),
        ("metadata", [], "field 'metadata' must be a dict, got list ([])"),
        ("index", 1.5, "field 'index' must be an int or None, got float (1.5)"),
        ("remove_sample", "yes", "field 'remove_sample' must be a bool, got str ('yes')"),
        ("prompt", 3, "field 'prompt' must be a str or a list of chat messages, got int (3)"),
        ("teacher_log_probs", "x", "field 'teacher_log_probs' must be a list of numbers, a tensor or None, got str"),
        ("rollout_routed_experts", 7, "field 'rollout_routed_experts' must be a tensor, nested int lists, an encoded"),
    ],
)
def test_from_dict_names_the_field_and_type_of_a_wrong_value(field, value, message):
    data = {**_sample().to_dict(), "response_length": 1, "loss_mask": [1], field: value}
    with pytest.raises(TypeError) as e:
        Sample.from_dict(data)
    assert str(e.value).startswith("Sample.from_dict: " + message), str(e.value)


def test_from_dict_keeps_every_form_the_original_round_trips():
    import numpy as np

    # Original forms: numpy scalars from a processed dump, int rewards and booleans from reward functions, tuples,
    # the original OPD's tensor teacher log-probs, routes as nested lists or a tensor, any label.
    data = {
        "prompt": [{"role": "user", "content": "q"}],
        "tokens": (1, np.int64(2), 3),
        "response": "x",
        "response_length": np.int32(1),
        "label": {"answer": 7},
        "reward": True,
        "loss_mask": [1],
        "rollout_log_probs": [np.float32(-0.5)],
        "teacher_log_probs": torch.tensor([-0.25]),
        "rollout_routed_experts": [[[0, 1]], [[1, 0]]],
        "status": "completed",
        "metadata": {},
        "weight_versions": ["3"],
        "index": np.int64(4),
        "non_generation_time": 1,
    }
    s = Sample.from_dict(data)
    assert (s.response_length, s.reward, s.index, s.status) == (1, True, 4, Status.COMPLETED)
    assert Sample.from_dict({**data, "reward": 2, "rollout_routed_experts": torch.zeros(2, 1, 2)}).reward == 2
    assert Sample.from_dict({**data, "reward": {"acc": 1.0}, "rollout_routed_experts": None}).reward == {"acc": 1.0}


@pytest.mark.parametrize(
    ("reward", "key", "message"),
    [
        ({"score": None, "pred": "x"}, "score", r"sample 7: its reward's --reward-key 'score' score is NoneType None"),
        ({"score": [1.0]}, "score", r"sample 7: its reward's --reward-key 'score' score is list \[1.0\], not a"),
        ("1.5", None, r"sample 7: its reward is str '1.5', not a number"),
        ({1: 1.0, "acc": True}, "score", r"dict with keys \['1', 'acc'\]; set --reward-key"),
    ],
)
def test_a_reward_that_is_not_a_number_names_the_sample_and_key(reward, key, message):
    # Was float()'s bare TypeError/ValueError (or a str reward read as a number); mixed keys failed in sorted().
    with pytest.raises(ValueError, match=message):
        Sample(index=7, reward=reward).get_reward_value(key)


def test_numeric_rewards_of_any_kind_read_as_floats():
    import numpy as np
    import torch

    assert [Sample(reward=r).get_reward_value("s") for r in (True, np.float32(0.5), torch.tensor(2.0), {"s": 3})] == [
        1.0, 0.5, 2.0, 3.0,
    ]  # fmt: skip


def test_plugin_attributes_travel_through_to_dict_and_from_dict():
    # As the original's to_dict (a copy of __dict__) and from_dict (setattr of the other keys): its retool example
    # sets sample.tool_call_count in generate and its reward function reads it. to_dict dropped it and from_dict
    # refused it, so a sample saved in a checkpoint's partial-rollout buffer came back without it.
    s = Sample(prompt="p", tokens=[1, 2], index=4)
    s.tool_call_count, s.payload_text = 3, "p+r"
    d = s.to_dict()
    assert (d["tool_call_count"], d["payload_text"], d["index"]) == (3, "p+r", 4)
    back = Sample.from_dict(d)
    assert back.plugin_attributes() == {"tool_call_count": 3, "payload_text": "p+r"} and back == s
