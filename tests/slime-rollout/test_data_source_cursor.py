"""Data source: per-epoch shuffling, the saved cursor (and buffer) and an exact resume."""

import random

import pytest
from slime_data_source_helpers import ROWS, _args, _write_jsonl

from slime_rollout.data.source import RolloutDataSource, RolloutDataSourceWithBuffer


def test_shuffle_is_deterministic_per_seed_and_epoch(tmp_path):
    rows = [{"question": f"q{i}", "answer": "0"} for i in range(20)]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)

    def first_two_epochs(seed):
        ds = RolloutDataSource(_args(prompt_data=path, rollout_shuffle=True, rollout_seed=seed, n_samples_per_prompt=1))
        return [g[0].prompt for g in ds.get_samples(40)]

    order = first_two_epochs(7)
    # Independent reference: the original's Dataset.shuffle (slime/utils/data.py), which reseeds the process-wide
    # generator with seed + epoch (restored after, for the tests sharing this process).
    saved = random.getstate()
    try:
        expected = []
        for epoch in (0, 1):
            random.seed(7 + epoch)
            permutation = list(range(20))
            random.shuffle(permutation)
            expected += [f"q{i}" for i in permutation]
    finally:
        random.setstate(saved)
    assert order == expected
    assert order[:20] != order[20:]  # each epoch reshuffled
    assert sorted(order[:20]) == sorted(order[20:])  # every prompt once per epoch
    assert first_two_epochs(7) == order
    assert first_two_epochs(8)[:20] != order[:20]


def test_cursor_save_load_resumes_exact_order_with_buffer(tmp_path):
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(7)]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    args = _args(prompt_data=path, rollout_shuffle=True, save=str(tmp_path / "ckpt"), n_samples_per_prompt=2)
    ds = RolloutDataSourceWithBuffer(args)
    ds.get_samples(5)
    partial = ds.get_samples(1)
    partial[0][0].tokens = [1, 2]
    partial[0][0].append_response_tokens([3], log_probs=[-0.5], text="c")
    ds.add_samples(partial)
    ds.save(3)
    assert (tmp_path / "ckpt" / "rollout" / "data_source_3.json").exists()
    assert not list((tmp_path / "ckpt" / "rollout").glob(".*"))  # no temp file left
    expected = ds.get_samples(9)

    resumed = RolloutDataSourceWithBuffer(args.model_copy(update={"load": str(tmp_path / "ckpt")}))
    resumed.load(3)
    got = resumed.get_samples(9)
    assert [[s.to_dict() for s in g] for g in got] == [[s.to_dict() for s in g] for g in expected]
    assert got[0][0].tokens == [1, 2, 3] and got[0][0].rollout_log_probs == [-0.5]  # buffer first
    # Missing cursor -> fresh start, no error.
    fresh = RolloutDataSourceWithBuffer(args.model_copy(update={"load": str(tmp_path / "none")}))
    fresh.load(3)
    assert fresh.get_samples(1)[0][0].index == 0


def test_the_data_source_without_a_buffer_saves_and_resumes(tmp_path):
    # `--data-source-path ...RolloutDataSource` with --save failed at the first checkpoint: "'RolloutDataSource'
    # object has no attribute 'buffer'".
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(7)]
    args = _args(prompt_data=_write_jsonl(tmp_path / "d.jsonl", rows), rollout_shuffle=True, save=str(tmp_path / "c"))
    ds = RolloutDataSource(args)
    ds.get_samples(3)
    ds.save(2)
    expected = ds.get_samples(6)
    resumed = RolloutDataSource(args.model_copy(update={"load": str(tmp_path / "c")}))
    resumed.load(2)
    assert [[s.to_dict() for s in g] for g in resumed.get_samples(6)] == [[s.to_dict() for s in g] for g in expected]


@pytest.mark.parametrize(
    ("text", "why"), [("{not json", "Expecting property name"), ('{"epoch_id": 1}', "'sample_offset'")]
)
def test_a_damaged_cursor_file_is_one_error_naming_it(tmp_path, text, why):
    # Kept through the move of the file's read to data/cursor_file.py: bad JSON and a missing field name the file.
    bad = tmp_path / "c" / "rollout" / "data_source_2.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(text)
    ds = RolloutDataSource(_args(prompt_data=_write_jsonl(tmp_path / "d.jsonl", ROWS), load=str(tmp_path / "c")))
    with pytest.raises(ValueError, match=rf"^{bad}: bad data-source cursor \(.*{why}"):
        ds.load(2)


def test_a_partial_samples_plugin_attributes_survive_the_checkpoint(tmp_path):
    # The original's retool generate sets sample.tool_call_count and its reward reads it; a partial sample saved in
    # the buffer came back from --load without it (to_dict left plugin attributes out), so its reward changed.
    args = _args(prompt_data=_write_jsonl(tmp_path / "d.jsonl", ROWS), save=str(tmp_path / "ckpt"))
    ds = RolloutDataSourceWithBuffer(args)
    partial = ds.get_samples(1)
    partial[0][0].tool_call_count = 2
    ds.add_samples(partial)
    ds.save(0)
    resumed = RolloutDataSourceWithBuffer(args.model_copy(update={"load": str(tmp_path / "ckpt")}))
    resumed.load(0)
    first, second = resumed.get_samples(1)[0]
    assert first.tool_call_count == 2 and second.plugin_attributes() == {}
    # A value JSON cannot store is one error naming the buffer, the sample and the attribute (json's own names
    # only the type).
    ds.add_samples(ds.get_samples(1))
    ds.buffer[0][1].seen = {1, 2}
    with pytest.raises(
        TypeError,
        match=r"^--save: the data source's partial-rollout buffer: sample 1's plugin attribute 'seen' holds a value of "
        r"type set, which JSON cannot store",
    ):
        ds.save(1)
    ds.buffer[0][1].seen = [1, 2]
    ds.buffer[0][0].metadata["when"] = object()
    with pytest.raises(TypeError, match=r"buffer: sample 0's metadata\['when'\] holds a value of type object,"):
        ds.save(1)


def test_buffer_group_size_checked(tmp_path):
    ds = RolloutDataSourceWithBuffer(_args(prompt_data=_write_jsonl(tmp_path / "d.jsonl", ROWS)))
    with pytest.raises(ValueError, match="expected 2"):
        ds.add_samples([ds.get_samples(1)[0][:1]])
    with pytest.raises(RuntimeError, match="no buffer"):
        RolloutDataSource(_args(prompt_data=_write_jsonl(tmp_path / "d.jsonl", ROWS))).add_samples([])


@pytest.mark.parametrize("changed", [{"rollout_seed": 8}, {"rollout_shuffle": False}])
def test_a_resume_with_other_shuffle_flags_finishes_the_saved_epoch_in_its_order(tmp_path, caplog, changed):
    # Issue 27 pass 27: the cursor's offset counts prompts of its epoch's permutation; resumed under another
    # --rollout-seed / --rollout-shuffle, the rest of the epoch came from another permutation at that offset: some
    # prompts served twice in the epoch, others never, with no word.
    rows = [{"question": f"q{i}", "answer": "0"} for i in range(10)]
    path, ckpt = _write_jsonl(tmp_path / "d.jsonl", rows), str(tmp_path / "ckpt")
    flags = {"prompt_data": path, "rollout_shuffle": True, "rollout_seed": 7, "n_samples_per_prompt": 1}
    ds = RolloutDataSource(_args(**flags, save=ckpt))
    served = [g[0].prompt for g in ds.get_samples(4)]
    ds.save(0)
    uninterrupted = served + [g[0].prompt for g in ds.get_samples(6)]
    resumed = RolloutDataSource(_args(**{**flags, **changed}, load=ckpt))
    with caplog.at_level("WARNING", logger="slime_rollout.data.cursor_file"):
        resumed.load(0)
    rest = [g[0].prompt for g in resumed.get_samples(6)]
    assert served + rest == uninterrupted  # each prompt of epoch 0 once
    assert "the rest of that epoch keeps its saved order" in caplog.text
    epoch1 = [g[0].prompt for g in resumed.get_samples(10)]
    fresh = RolloutDataSource(_args(**{**flags, **changed}))
    fresh.get_samples(10)
    assert epoch1 == [g[0].prompt for g in fresh.get_samples(10)]  # the next epochs follow the new flags
    resumed.save(1)  # a save in the new epoch records the new flags: its resume says nothing
    caplog.clear()
    again = RolloutDataSource(_args(**{**flags, **changed}, load=ckpt))
    with caplog.at_level("WARNING", logger="slime_rollout.data.cursor_file"):
        again.load(1)
    assert "keeps its saved order" not in caplog.text


def test_a_save_mid_way_through_a_kept_epoch_keeps_its_order(tmp_path):
    rows = [{"question": f"q{i}", "answer": "0"} for i in range(10)]
    path, ckpt = _write_jsonl(tmp_path / "d.jsonl", rows), str(tmp_path / "ckpt")
    flags = {"prompt_data": path, "rollout_shuffle": True, "rollout_seed": 7, "n_samples_per_prompt": 1}
    ds = RolloutDataSource(_args(**flags, save=ckpt))
    uninterrupted = [g[0].prompt for g in ds.get_samples(10)]
    ds = RolloutDataSource(_args(**flags, save=ckpt))
    ds.get_samples(3)
    ds.save(0)
    first = RolloutDataSource(_args(**{**flags, "rollout_seed": 9}, load=ckpt, save=ckpt))
    first.load(0)
    first.get_samples(3)
    first.save(1)  # still epoch 0, in its saved order: the cursor keeps saying which
    second = RolloutDataSource(_args(**{**flags, "rollout_seed": 9}, load=ckpt))
    second.load(1)
    assert [g[0].prompt for g in second.get_samples(4)] == uninterrupted[6:]


def test_a_load_naming_an_iteration_folder_reads_the_cursor_of_its_save_folder(tmp_path, caplog):
    # Megatron resumes `--load <save>/iter_0000004` (as the original); the cursor saved with it is
    # `<save>/rollout/data_source_4.json`, beside the iteration folder. Read under that folder it was not found: the
    # run went on at rollout 5 with the prompts of rollout 0 (one warning).
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(7)]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    save = tmp_path / "ckpt"
    args = _args(prompt_data=path, rollout_shuffle=True, save=str(save), n_samples_per_prompt=1)
    ds = RolloutDataSourceWithBuffer(args)
    ds.get_samples(5)
    ds.save(4)
    expected = [g[0].prompt for g in ds.get_samples(4)]
    (save / "iter_0000004").mkdir()
    resumed = RolloutDataSourceWithBuffer(args.model_copy(update={"load": str(save / "iter_0000004")}))
    with caplog.at_level("WARNING"):
        resumed.load(4)
    assert [g[0].prompt for g in resumed.get_samples(4)] == expected
    assert "no data-source cursor" not in caplog.text


def test_the_original_buffer_accessors_work_and_their_metadata_survives_a_resume(tmp_path):
    # The original's rollout-buffer example calls data_buffer.get_metadata(), get_buffer_length() and
    # update_metadata({str(rollout_id): [...]}) on the data source it is handed: each was an AttributeError here.
    spec = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    args = _args(prompt_data=spec, save=str(tmp_path / "ckpt"), load=str(tmp_path / "ckpt"))
    ds = RolloutDataSourceWithBuffer(args)
    assert ds.get_buffer_length() == 0 and ds.get_metadata() == {}
    ds.add_samples(ds.get_samples(2))
    assert ds.get_buffer_length() == 2  # groups, as in the original
    ds.update_metadata({"3": [7, 8]})
    ds.update_metadata({"4": [9]})
    ds.save(4)
    resumed = RolloutDataSourceWithBuffer(args)
    resumed.load(4)
    assert resumed.get_metadata() == {"3": [7, 8], "4": [9]} and resumed.get_buffer_length() == 2
