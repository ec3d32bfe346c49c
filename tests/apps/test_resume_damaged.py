"""Resuming from a damaged `--load` (fault injection): one line naming what is wrong and the iteration to resume from.

Found with the demo's own checkpoints: an emptied tracker file (`latest_checkpointed_iteration.txt`, as a crash
before the data reached the disk leaves it) and a tracker naming an iteration that is not there were both refused as
"an unknown checkpoint ... point --load at a --save directory of this backend", and `--ckpt-step` could not get
round it (the check read only the tracker); a truncated shard ended in a rank's traceback (exit 1).
"""

import types

import pytest
import ray.exceptions

from slime_app import loop
from slime_app.checkpoints import check_checkpoints
from slime_app.guards import StartRefused
from slime_app.train_actor import TrainerStart
from slime_core.checkpoint_dirs import complete_iterations
from slime_core.config import parse_args


@pytest.fixture
def save(tmp_path):
    """A --save directory of FSDP checkpoints 1 and 2 (the tracker names 2), a staging left-over of 3."""
    root = tmp_path / "save"
    for step in (1, 2):
        (root / f"iter_{step:07d}").mkdir(parents=True)
        (root / f"iter_{step:07d}" / "meta.json").write_text("{}")
    (root / "iter_0000003.tmp").mkdir()  # a save that was cut short: never a complete checkpoint
    (root / "iter_0000003.tmp" / "meta.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    return root


def _cfg(save, *extra):
    # The stubs hold no optimizer state (no scheduler.pt), which a resume refuses without --no-load-optim.
    return parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--train-backend", "fsdp", "--load",
                       str(save), "--no-load-optim", *extra])  # fmt: skip


def test_complete_iterations_leave_out_staging_and_unfinished_folders(save):
    (save / "iter_0000004").mkdir()  # no meta.json
    assert complete_iterations(save) == [1, 2]
    assert complete_iterations(save / "nope") == []


def test_an_emptied_tracker_names_the_file_and_the_step_to_resume_from(save):
    (save / "latest_checkpointed_iteration.txt").write_text("")
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save))
    assert str(e.value) == (
        f"--load {save}: latest_checkpointed_iteration.txt is empty (a partial copy, or a crash before the last save "
        "reached the disk); complete checkpoints there: iterations 1, 2; resume from one with --ckpt-step 2"
    )


def test_complete_iterations_without_a_tracker_are_named(save):
    # Issue 27: a kill between the first save's rename and its tracker write left iter_0000001 complete and no
    # tracker; the resume was refused as "an unknown checkpoint ... point --load at a --save directory of this
    # backend", which it is.
    (save / "latest_checkpointed_iteration.txt").unlink()
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save))
    assert str(e.value) == (
        f"--load {save}: latest_checkpointed_iteration.txt is missing (a save cut before its tracker was written, or "
        "a partial copy); complete checkpoints there: iterations 1, 2; resume from one with --ckpt-step 2"
    )
    assert check_checkpoints(_cfg(save, "--ckpt-step", "2")) == [f"--load {save}: fsdp checkpoint, the run resumes "
                                                                  "from it"]  # fmt: skip


def test_a_tracker_naming_a_missing_iteration_is_named(save):
    (save / "latest_checkpointed_iteration.txt").write_text("7")
    with pytest.raises(ValueError, match=r"latest_checkpointed_iteration.txt names '7', which is not an iteration "
                                         r"folder there .*--ckpt-step 2$"):  # fmt: skip
        check_checkpoints(_cfg(save))


def test_a_tracker_holding_a_non_ascii_digit_is_named(save):
    # "²" is a digit to str.isdigit and not to int(): the preflight stopped with int()'s bare "invalid literal".
    (save / "latest_checkpointed_iteration.txt").write_text("²")
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save))
    assert str(e.value) == (
        f"--load {save}: latest_checkpointed_iteration.txt names '²', which is not an iteration folder there (a "
        "partial copy, or a crash before the last save reached the disk); complete checkpoints there: iterations 1, "
        "2; resume from one with --ckpt-step 2"
    )


def test_ckpt_step_gets_round_a_damaged_tracker(save):
    (save / "latest_checkpointed_iteration.txt").write_text("")
    assert check_checkpoints(_cfg(save, "--ckpt-step", "1")) == [f"--load {save}: fsdp checkpoint, the run resumes "
                                                                  "from it"]  # fmt: skip


@pytest.mark.parametrize("step", ["3", "9"])
def test_ckpt_step_of_an_incomplete_or_missing_iteration_is_refused(save, step):
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save, "--ckpt-step", step))
    assert str(e.value) == (
        f"--ckpt-step {step}: --load {save} has no complete iter_000000{step}; complete checkpoints there: "
        "iterations 1, 2; resume from one with --ckpt-step 2"
    )


def _build(monkeypatch, cfg, *, init, load=None):
    """`Run.build()` with stub trainer ranks (`init`) and rollout manager (`load`): no Ray, engines or ranks."""

    class Trainer:
        def preload(self, cfg):
            pass

        def start_compile_warm_up(self, cfg, gated=False):
            pass

        def release_compile_warm_up(self):
            pass

        def init(self, cfg):
            return TrainerStart(rollout_id=init(cfg), compile_layers_flag=None)

    manager = types.SimpleNamespace(start=types.SimpleNamespace(remote=lambda: []),
                                    load=types.SimpleNamespace(remote=load))  # fmt: skip
    monkeypatch.setattr(loop, "RolloutManager", types.SimpleNamespace(options=lambda **kw: types.SimpleNamespace(
        remote=lambda cfg, placement: manager)))  # fmt: skip
    monkeypatch.setattr(loop, "make_trainers", lambda cfg, placement: Trainer())
    monkeypatch.setattr(loop.ray, "get", lambda ref, timeout=None: ref)
    run = loop.Run.__new__(loop.Run)  # the parts build() reads
    run.cfg, run.placement, run.trainer = cfg, None, None
    run.tracker = types.SimpleNamespace(begin_at=lambda start: None)
    run.build()


def _ray_task_error(task, message):
    """What the driver gets from an actor whose method raised `ValueError(message)`."""
    return ray.exceptions.RayTaskError(task, "Traceback ...", ValueError(message)).as_instanceof_cause()


def test_a_rank_refusing_its_checkpoint_stops_the_start_in_one_line(save, monkeypatch):
    message = f"--load {save}: iter_0000002 cannot be read (EOFError); it was damaged after it was written"

    def init(cfg):  # rank 0 raises a ValueError
        raise _ray_task_error("TrainActor.init", message)

    with pytest.raises(StartRefused) as e:  # was: the rank's traceback, exit 1
        _build(monkeypatch, _cfg(save), init=init)
    assert str(e.value) == message


def test_a_damaged_data_cursor_stops_the_start_in_one_line(save, monkeypatch):
    # Issue 27 (pass 55): a truncated `rollout/data_source_1.json` beside a complete iter_0000002 ended the run in the
    # driver's traceback (exit 1) around the rollout manager's ValueError, after the engines and the trainer started.
    cursor = save / "rollout" / "data_source_1.json"
    message = f"{cursor}: bad data-source cursor (Unterminated string starting at: line 1 column 4549 (char 4548))"
    loaded = []

    def load(rollout_id):  # the data source's ValueError
        loaded.append(rollout_id)
        raise _ray_task_error("RolloutManager.load", message)

    with pytest.raises(StartRefused) as e:  # resumed iter_0000002: the cursor of rollout 1 is read next
        _build(monkeypatch, _cfg(save, "--num-rollout", "4"), init=lambda cfg: 2, load=load)
    assert loaded == [1]
    assert str(e.value) == message


def test_ckpt_step_with_a_load_folder_that_does_not_exist_is_refused(tmp_path):
    # Issue 27: the check said "no checkpoint yet, the run starts at rollout 0" and the trainer then stopped on
    # "checkpoint .../iter_0000005 is missing" after Ray and the engines had started.
    root = tmp_path / "ckpt"
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(root, "--ckpt-step", "5"))
    assert str(e.value) == (
        f"--ckpt-step 5: --load {root} does not exist; leave out --ckpt-step to start afresh there (or fix --load)"
    )
    assert check_checkpoints(_cfg(root)) == [f"--load {root}: no checkpoint yet, the run starts at rollout 0"]
    root.mkdir()  # an empty folder was already refused, naming the missing iteration
    with pytest.raises(ValueError, match=r"has no complete iter_0000005; no complete checkpoint is there"):
        check_checkpoints(_cfg(root, "--ckpt-step", "5"))


# ---- a re-save cut between its two renames (iter_X moved to iter_X.old, the new copy not yet in place) --------------


def _cut_resave(save, step=2):
    """What a kill between `dir_swap.swap_in`'s renames leaves: the complete copy only as `iter_XXXXXXX.old`."""
    (save / f"iter_{step:07d}").rename(save / f"iter_{step:07d}.old")
    (save / f"iter_{step:07d}.old" / ".slime_export").write_text("")


def test_a_save_cut_between_its_renames_is_restored_when_the_run_resumes_into_its_own_save(save):
    # Issue 27 pass 27: a re-save of iteration 2 (a resume from --ckpt-step 1) killed between its two renames left
    # iter_0000002.old complete and the tracker naming 2: the resume was refused as "a partial copy", offering 1.
    _cut_resave(save)
    notes = check_checkpoints(_cfg(save, "--save", str(save)))
    assert notes == [
        f"--load {save}: restored iter_0000002 from iter_0000002.old (a save that replaced it was cut between its two "
        "renames; the copy is complete)",
        f"--load {save}: fsdp checkpoint, the run resumes from it",
    ]
    assert complete_iterations(save) == [1, 2] and not (save / "iter_0000002.old").exists()


def test_a_cut_save_in_another_runs_folder_is_named_not_renamed(save):
    _cut_resave(save)
    with pytest.raises(ValueError) as e:  # --load is not this run's --save: only the message names it
        check_checkpoints(_cfg(save))
    assert str(e.value).endswith(
        "complete checkpoints there: iterations 1; resume from one with --ckpt-step 1; iter_0000002.old: complete, "
        "moved aside by a save cut between its two renames: rename it back without .old (a run whose --save is this "
        "--load does that itself)"
    )
    assert (save / "iter_0000002.old").is_dir() and not (save / "iter_0000002").exists()


def test_a_cut_save_is_left_alone_while_a_live_run_holds_the_folder(save):
    import fcntl
    import os

    _cut_resave(save)
    fd = os.open(save / ".slime-run.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another run on this --save (flock: per open file)
        with pytest.raises(ValueError, match=r"iter_0000002.old: complete, moved aside"):
            check_checkpoints(_cfg(save, "--save", str(save)))
    finally:
        os.close(fd)
    assert (save / "iter_0000002.old").is_dir()


def test_a_cut_critic_save_is_restored_with_the_actors(save):
    # The critic's checkpoints (<--save>/critic) are re-saved the same way: a cut left the critic without the
    # iteration the actor resumes from, and the resume was refused ("the critic's checkpoints do not have it").
    critic = save / "critic"
    for step in (1, 2):
        (critic / f"iter_{step:07d}").mkdir(parents=True)
        (critic / f"iter_{step:07d}" / "meta.json").write_text("{}")
    _cut_resave(critic)
    notes = check_checkpoints(_cfg(save, "--save", str(save), "--advantage-estimator", "ppo"))
    assert notes[0] == (
        f"--critic-load {critic}: restored iter_0000002 from iter_0000002.old (a save that replaced it was cut between "
        "its two renames; the copy is complete)"
    )
    assert complete_iterations(critic) == [1, 2]


# ---- a first save that never completed (a full disk, a crash or Ctrl-C during it) -----------------------------------


def _cut_first_save(root):
    """What a run whose first save failed leaves in --save: its data cursor, the partial staging folder, its lock."""
    (root / "rollout").mkdir(parents=True)
    (root / "rollout" / "data_source_0.json").write_text('{"epoch": 0, "offset": 4}')
    (root / "iter_0000001.tmp" / "model_and_optim").mkdir(parents=True)
    (root / "iter_0000001.tmp" / ".slime_export").write_text("")
    (root / "iter_0000001.tmp" / "model_and_optim" / "__0_0.distcp").write_bytes(b"\0" * 64)
    (root / ".slime-run.lock").write_text("")


def test_a_save_folder_whose_first_save_was_cut_starts_afresh(tmp_path):
    # Issue 27 (s22): a 30 MB tmpfs as --save; the first save failed ("... no complete checkpoint there yet", exit 5)
    # and the same command again (the original's --save X --load X) was refused: "--load X: an unknown checkpoint;
    # --train-backend fsdp resumes its own fsdp checkpoints".
    from slime_app.checkpoint_kinds import checkpoint_kind

    root = tmp_path / "ckpt"
    _cut_first_save(root)
    (root / "critic").mkdir()  # PPO: the critic's save folder, as cut
    assert checkpoint_kind(root) == "empty"
    assert check_checkpoints(_cfg(root, "--save", str(root))) == [
        f"--load {root}: no checkpoint yet, the run starts at rollout 0"
    ]
    (root / "notes.txt").write_text("mine")  # anything else is not a run's leftover: still not taken for empty
    assert checkpoint_kind(root) == "unknown"


def test_a_finished_run_removes_its_cut_saves_and_nothing_else(tmp_path):
    from slime_app.outputs import remove_cut_saves

    root = tmp_path / "ckpt"
    _cut_first_save(root)
    (root / "iter_0000002").mkdir()
    (root / "iter_0000002" / "meta.json").write_text("{}")
    (root / "iter_0000003.tmp").mkdir()  # no marker: not known to be slime's, left alone
    (root / "critic" / "iter_0000001.tmp").mkdir(parents=True)
    (root / "critic" / "iter_0000001.tmp" / ".slime_export").write_text("")
    cfg = _cfg(root, "--save", str(root), "--advantage-estimator", "ppo")
    assert remove_cut_saves(cfg) == [root / "iter_0000001.tmp", root / "critic" / "iter_0000001.tmp"]
    assert sorted(p.name for p in root.iterdir()) == [
        ".slime-run.lock", "critic", "iter_0000002", "iter_0000003.tmp", "rollout"
    ]  # fmt: skip
    assert remove_cut_saves(_cfg(root)) == []  # no --save: nothing is touched
