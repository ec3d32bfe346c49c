"""The `--save` layout both trainers share (`slime_core.checkpoint_dirs`)."""

import pytest

from slime_core.checkpoint_dirs import (
    TRACKER_FILE,
    complete_iterations,
    critic_dirs,
    interrupted_saves,
    iteration_name,
    iteration_of,
    pinned_iteration,
    restore_interrupted_saves,
    saved_reference,
    tracker_step,
)


def test_iteration_name_is_seven_digits():
    assert iteration_name(3) == "iter_0000003"
    assert iteration_name(1234567) == "iter_1234567"


def test_complete_iterations_are_the_folders_whose_last_file_was_written(tmp_path):
    (tmp_path / TRACKER_FILE).write_text("4")
    for name, last in [("iter_0000004", "meta.json"), ("iter_0000002", ".metadata"), ("iter_0000005.tmp", "meta.json")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / last).write_text("{}")
    (tmp_path / "iter_0000003").mkdir()  # unfinished: no meta.json / .metadata
    (tmp_path / "iter_\u0663\u0663\u0663\u0663\u0663\u0663\u0663").mkdir()  # Arabic-Indic digits: not ours
    (tmp_path / "iter_\u0663\u0663\u0663\u0663\u0663\u0663\u0663" / "meta.json").write_text("{}")
    assert complete_iterations(tmp_path) == [2, 4]
    assert complete_iterations(tmp_path / "missing") == []


@pytest.mark.parametrize(("name", "step"), [("iter_0000003", 3), ("iter_0000003.tmp", 3), ("iter_0000012.old", 12),
                                             ("iter_0000003.old.tmp", None), ("iter_003", None), ("release", None),
                                             ("iter_\u0663\u0663\u0663\u0663\u0663\u0663\u0663", None)])  # fmt: skip
def test_iteration_of_reads_an_iteration_folder_or_its_copies(name, step):
    assert iteration_of(name) == step


def test_critic_dirs_default_to_critic_inside_the_actors_folders():
    from types import SimpleNamespace

    def cfg(**kw):
        return SimpleNamespace(**{"load": None, "save": None, "critic_load": None, "critic_save": None, **kw})

    assert critic_dirs(cfg(load="/ck", save="/out")) == ("/ck/critic", "/out/critic")
    assert critic_dirs(cfg(load="/ck", save="/out", critic_load="/c1", critic_save="/c2")) == ("/c1", "/c2")
    assert critic_dirs(cfg()) == (None, None)


def test_saved_reference_is_the_ref_folder_once_its_metadata_was_written(tmp_path):
    iteration = tmp_path / "iter_0000003"
    assert saved_reference(iteration) is None  # no iteration folder
    (iteration / "ref").mkdir(parents=True)
    assert saved_reference(iteration) is None  # a save cut before the reference's last file
    (iteration / "ref" / ".metadata").write_bytes(b"")
    assert saved_reference(iteration) == iteration / "ref"
    assert saved_reference(str(iteration)) == iteration / "ref"


@pytest.mark.parametrize(("text", "step"), [("7\n", 7), (" 12 ", 12), ("release", None), ("", None), ("\u00b2", None),
                                             (None, None)])  # fmt: skip
def test_tracker_step_reads_a_training_iteration_or_none(tmp_path, text, step):
    if text is not None:
        (tmp_path / TRACKER_FILE).write_text(text)
    assert tracker_step(tmp_path) == step


def _iteration(root, name, *, marked=True, last="meta.json"):
    (root / name).mkdir()
    (root / name / last).write_text("{}")
    if marked:
        (root / name / ".slime_export").write_text("")


def test_interrupted_saves_are_complete_marked_old_copies_without_their_iteration(tmp_path):
    _iteration(tmp_path, "iter_0000002.old")  # cut between the swap's renames: restored
    _iteration(tmp_path, "iter_0000003.old", last=".metadata")  # torch_dist: restored
    _iteration(tmp_path, "iter_0000004")  # the swap finished; only deleting .old was left
    _iteration(tmp_path, "iter_0000004.old")
    _iteration(tmp_path, "iter_0000005.old", marked=False)  # not slime's
    (tmp_path / "iter_0000006.old").mkdir()  # incomplete
    (tmp_path / "iter_0000006.old" / ".slime_export").write_text("")
    assert interrupted_saves(tmp_path) == [2, 3]
    assert restore_interrupted_saves(tmp_path) == [2, 3]
    assert complete_iterations(tmp_path) == [2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "iter_0000002", "iter_0000003", "iter_0000004", "iter_0000004.old", "iter_0000005.old", "iter_0000006.old"
    ]  # fmt: skip
    assert interrupted_saves(tmp_path / "missing") == [] and restore_interrupted_saves(tmp_path) == []


def test_pinned_iteration_is_ckpt_step_then_the_named_iteration_folder(tmp_path):
    save = tmp_path / "save"
    assert pinned_iteration(str(save), 7) == 7  # --ckpt-step wins over anything --load names
    assert pinned_iteration(str(save / "iter_0000004"), 7) == 7
    assert pinned_iteration(str(save / "iter_0000004"), None) == 4  # Megatron's --load <save>/iter_XXXXXXX
    assert pinned_iteration(str(save), None) is None  # the save folder: its tracker decides
    assert pinned_iteration(str(save / "iter_0000004.tmp"), None) is None  # a copy is not an iteration to load
    assert pinned_iteration(None, None) is None
