"""Rollout debug dumps: atomic save, exact round trip, eval file names, subsampling, regrouping."""

import fractions

import pytest
import torch

from slime_core.config import SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.runtime.debug_dump import dump_path, load_debug_rollout_data, regroup, save_debug_rollout_data


def _cfg(**fields):
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})


def _samples(num):
    out = []
    for i in range(num):
        s = Sample(prompt=f"p{i // 2}", tokens=[1, 2], label="3", group_index=i // 2, index=i, metadata={"k": i})
        s.append_response_tokens([5, 6], log_probs=[-0.5, -1.25], text="xy", meta_info={"weight_version": "3"})
        s.status = Status.TRUNCATED if i % 2 else Status.COMPLETED
        s.reward = float(i)
        out.append(s)
    return out


def test_round_trip_is_exact(tmp_path):
    args = _cfg(
        save_debug_rollout_data=str(tmp_path / "r" / "{rollout_id}.pt"),
        load_debug_rollout_data=str(tmp_path / "r" / "{rollout_id}.pt"),
        load_debug_rollout_data_subsample=None,
    )
    samples = _samples(6)
    save_debug_rollout_data(args, 2, samples)
    save_debug_rollout_data(args, 2, samples[:2], evaluation=True)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["2.pt", "eval_2.pt"]
    raw = torch.load(tmp_path / "r" / "2.pt", weights_only=True)
    assert raw["rollout_id"] == 2 and raw["samples"][1]["status"] == "truncated"
    loaded = load_debug_rollout_data(args, 2)
    assert [s.to_dict() for s in loaded] == [s.to_dict() for s in samples]
    assert [[s.index for s in g] for g in regroup(loaded)] == [[0, 1], [2, 3], [4, 5]]


def test_subsample_keeps_head_and_tail(tmp_path):
    args = _cfg(
        save_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
        load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
        load_debug_rollout_data_subsample=0.4,
    )
    save_debug_rollout_data(args, 0, _samples(10))
    # 10 * 0.4 = 4 kept: 2 from the head, 2 from the tail.
    assert [s.index for s in load_debug_rollout_data(args, 0)] == [0, 1, 8, 9]


def test_path_template_must_have_rollout_id(tmp_path):
    with pytest.raises(ValueError, match="rollout_id"):
        dump_path(str(tmp_path / "fixed.pt"), 0)


def test_a_damaged_or_foreign_dump_is_one_line_naming_the_flag_and_file(tmp_path):
    # torch.load's UnpicklingError / zip error reached the driver as a traceback naming no flag.
    args = _cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"))
    (tmp_path / "0.pt").write_bytes(b"not a torch file\n")
    with pytest.raises(ValueError) as e:
        load_debug_rollout_data(args, 0)
    dump = tmp_path / "0.pt"
    assert str(e.value).startswith(f"--load-debug-rollout-data: {dump} is not a rollout dump torch can read (")
    torch.save({"rollout_id": 1, "samples": [{"no_such_field": 1}]}, tmp_path / "1.pt")
    with pytest.raises(ValueError, match=r"^--load-debug-rollout-data: .*1\.pt: sample 0 does not read back"):
        load_debug_rollout_data(args, 1)
    torch.save([1, 2], tmp_path / "2.pt")
    with pytest.raises(ValueError, match=r"^--load-debug-rollout-data: .*2\.pt is not a rollout dump \(expected a"):
        load_debug_rollout_data(args, 2)


def _original_record(index):
    """One sample as the original's `Sample.to_dict` writes it (slime/utils/types.py: `__dict__` + status value)."""
    return {
        "group_index": 0, "index": index, "rollout_id": None, "prompt": "1+1=", "tokens": [1, 2, 3],
        "multimodal_inputs": None, "multimodal_train_inputs": None, "multimodal_train_input_id": None,
        "apply_chat_template_kwargs": {}, "response": "2", "response_length": 1, "label": "2", "reward": 1.0,
        "loss_mask": [1], "weight_versions": ["1"], "rollout_log_probs": [-0.25], "rollout_top_p_token_ids": None,
        "rollout_top_p_token_offsets": None, "rollout_routed_experts": None, "remove_sample": False,
        "teacher_log_probs": None, "status": "completed", "metadata": {}, "generate_function_path": None,
        "custom_rm_path": None, "train_metadata": None, "session_id": None, "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 3, "spec_draft_token_num": 4, "spec_verify_ct": 1,
                      "completion_token_num": 1},
        "prefix_cache_info": {"cached_tokens": 2, "total_prompt_tokens": 3},
    }  # fmt: skip


def test_an_original_dump_loads_and_says_what_it_ignored(tmp_path, caplog):
    # The original's dumps carry spec_info / prefix_cache_info, which from_dict refused ("unknown fields").
    torch.save({"rollout_id": 0, "samples": [_original_record(i) for i in range(3)]}, tmp_path / "0.pt")
    args = _cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"))
    with caplog.at_level("INFO", logger="slime_rollout.runtime.debug_dump"):
        loaded = load_debug_rollout_data(args, 0)
    assert [(s.index, s.tokens, s.reward, s.status) for s in loaded] == [(i, [1, 2, 3], 1.0, Status.COMPLETED)
                                                                        for i in range(3)]  # fmt: skip
    assert "spec_info on 3 sample(s)" in caplog.text and "prefix_cache_info on 3 sample(s)" in caplog.text


def test_plugin_attributes_of_an_original_dump_are_restored(tmp_path, caplog):
    # The original's retool example sets sample.payload_text and sample.tool_call_count (its reward reads the
    # latter); its to_dict copies __dict__, so its dumps hold them and its from_dict sets them back. They were
    # refused here as "unknown fields": the dump did not load.
    records = [_original_record(0), {**_original_record(1), "payload_text": "x", "tool_call_count": 2}]
    torch.save({"rollout_id": 0, "samples": records}, tmp_path / "0.pt")
    args = _cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"))
    with caplog.at_level("INFO", logger="slime_rollout.runtime.debug_dump"):
        first, second = load_debug_rollout_data(args, 0)
    assert (second.payload_text, second.tool_call_count) == ("x", 2) and first.plugin_attributes() == {}
    assert "restored plugin attributes payload_text on 1 sample(s), tool_call_count on 1 sample(s)" in caplog.text


def test_a_key_no_attribute_can_have_is_refused_naming_it_and_the_sample(tmp_path):
    records = [_original_record(0), {**_original_record(1), "to_dict": "x"}]
    torch.save({"rollout_id": 0, "samples": records}, tmp_path / "0.pt")
    args = _cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"))
    with pytest.raises(ValueError, match=r"sample 1 does not read back .*unknown fields \['to_dict'\]"):
        load_debug_rollout_data(args, 0)


@pytest.mark.parametrize(("num", "fraction", "kept"), [(10, 0.5, [0, 1, 7, 8, 9]), (10, 0.05, [9]), (4, 1.0, None)])
def test_subsample_keeps_the_originals_count(tmp_path, num, fraction, kept):
    # The original keeps int(n * f): floor half from the head, the rest from the tail (5 of 10 here, not 4).
    args = _cfg(
        save_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
        load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
        load_debug_rollout_data_subsample=fraction,
    )
    save_debug_rollout_data(args, 0, _samples(num))
    assert [s.index for s in load_debug_rollout_data(args, 0)] == (kept or list(range(num)))


def test_an_original_vision_language_dump_loads_with_its_images(tmp_path):
    # The original's samples keep PIL images in multimodal_inputs; the safe loader refused the dump
    # ("Weights only load failed", naming no global).
    from PIL import Image

    record = {
        **_original_record(0),
        "multimodal_inputs": {"images": [Image.new("RGB", (4, 3), (255, 0, 0))]},
        "multimodal_train_inputs": {"pixel_values": torch.zeros(2, 3), "image_grid_thw": torch.tensor([[1, 1, 2]])},
    }
    torch.save({"rollout_id": 0, "samples": [record]}, tmp_path / "0.pt")
    (sample,) = load_debug_rollout_data(_cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt")), 0)
    assert sample.multimodal_inputs["images"][0].size == (4, 3)
    assert sample.multimodal_train_inputs["image_grid_thw"].tolist() == [[1, 1, 2]]
    # Any other object is still refused, naming the global.
    foreign = {**_original_record(1), "metadata": {"x": fractions.Fraction(1, 3)}}
    torch.save({"rollout_id": 1, "samples": [foreign]}, tmp_path / "1.pt")
    with pytest.raises(ValueError, match=r"not a rollout dump torch can read \(.*Unsupported global"):
        load_debug_rollout_data(_cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt")), 1)


def test_an_original_dump_with_top_p_replay_tensors_loads(tmp_path):
    # The original merges top-p replay spans into int32 tensors (types.py); from_dict wanted lists ("must be a list").
    record = {
        **_original_record(0),
        "rollout_top_p_token_ids": torch.tensor([7, 8, 9], dtype=torch.int32),
        "rollout_top_p_token_offsets": torch.tensor([0, 3], dtype=torch.int32),
    }
    torch.save({"rollout_id": 0, "samples": [record]}, tmp_path / "0.pt")
    (sample,) = load_debug_rollout_data(_cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt")), 0)
    assert sample.rollout_top_p_token_ids == [7, 8, 9] and sample.rollout_top_p_token_offsets == [0, 3]


def test_an_original_dump_with_a_tensor_reward_loads(tmp_path):
    # The original stores what the reward function returned; a 0-d tensor was refused ("must be a number").
    torch.save({"rollout_id": 0, "samples": [{**_original_record(0), "reward": torch.tensor(0.5)}]}, tmp_path / "0.pt")
    (sample,) = load_debug_rollout_data(_cfg(load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt")), 0)
    assert sample.reward == 0.5 and type(sample.reward) is float


def test_a_plugin_value_the_safe_loader_refuses_is_refused_when_saving(tmp_path):
    # torch.save pickled any plugin attribute, then --load-debug-rollout-data's weights_only loader refused the
    # dump it had written; the save now says which sample and attribute, and writes nothing.
    args = _cfg(
        save_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
        load_debug_rollout_data=str(tmp_path / "{rollout_id}.pt"),
    )
    samples = _samples(2)
    samples[1].ratio = fractions.Fraction(1, 3)
    with pytest.raises(
        TypeError,
        match=r"^--save-debug-rollout-data: sample 1's plugin attribute 'ratio' holds a value "
        r"of type Fraction, which --load-debug-rollout-data's safe loader refuses",
    ):
        save_debug_rollout_data(args, 0, samples)
    samples[1].ratio = None
    samples[0].metadata["when"] = fractions.Fraction(1, 2)
    with pytest.raises(TypeError, match=r"sample 0's metadata\['when'\] holds a value of type Fraction"):
        save_debug_rollout_data(args, 0, samples)
    assert list(tmp_path.iterdir()) == []
    # Builtins and tensors pass and read back.
    samples[0].metadata["when"] = 0.5
    samples[1].ratio = torch.tensor([1.0, 3.0])
    save_debug_rollout_data(args, 0, samples)
    loaded = load_debug_rollout_data(args, 0)
    assert loaded[0].metadata["when"] == 0.5 and loaded[1].ratio.tolist() == [1.0, 3.0]
