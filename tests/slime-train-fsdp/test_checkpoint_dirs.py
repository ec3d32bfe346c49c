"""Checkpoint directories under --save are replaced only when slime wrote them (slime_core.dir_swap marker)."""

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn

from slime_core.dir_swap import MARKER, ReplaceRefused
from slime_train_fsdp.checkpoint import load_checkpoint, save_checkpoint


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _save(root, rollout_id):
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return save_checkpoint(
        root, rollout_id=rollout_id, global_step=1, model=model, optimizer=optimizer, scheduler=scheduler
    )


def test_a_user_folder_named_like_a_checkpoint_is_refused_and_kept(tmp_path, one_rank):
    root = tmp_path / "save"
    (root / "iter_0000001").mkdir(parents=True)
    (root / "iter_0000001" / "notes.txt").write_text("mine")
    with pytest.raises(ReplaceRefused, match=f"--save {root}/iter_0000001: is a non-empty folder that slime did"):
        _save(root, 0)
    assert (root / "iter_0000001" / "notes.txt").read_text() == "mine"


def test_a_checkpoint_slime_wrote_is_replaced_when_its_iteration_is_saved_again(tmp_path, one_rank):
    root = tmp_path / "save"
    first = _save(root, 0)
    assert (first / MARKER).is_file() and (first / "meta.json").is_file()
    (first / "stale").write_text("x")
    assert _save(root, 0) == first and not (first / "stale").exists()
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000001", "latest_checkpointed_iteration.txt"]


# ---- resuming from a damaged checkpoint (fault injection: a truncated shard, an emptied tracker) ---------------------


def _parts():
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def _load(root, **kw):
    model, optimizer, scheduler = _parts()
    return load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, **kw)


def test_a_truncated_shard_is_one_error_naming_load_the_iteration_and_the_one_to_resume_from(tmp_path, one_rank):
    root = tmp_path / "save"
    _save(root, 0)
    last = _save(root, 1)
    shard = next((last / "model_and_optim").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # cut short as by a crash or a partial copy
    with pytest.raises(ValueError) as e:  # was: DCP's CheckpointException, a BaseException, with a rank traceback
        _load(root)
    message = str(e.value)
    # The cause as torch reports it for this cut (a pickle that ends early; a zip without its directory for others).
    assert message.startswith(f"--load {root}: iter_0000002 cannot be read (EOFError); it was damaged after it")
    assert message.endswith("other checkpoints there: iterations 1; resume with --ckpt-step 1")
    assert _load(root, ckpt_step=1)["next_rollout_id"] == 1  # the suggested one loads


@pytest.mark.parametrize("text", ["", "2\x00\x00", "\u00b2"])  # "²": str.isdigit, not int(): was int()'s error
def test_a_tracker_that_names_no_iteration_is_one_error(tmp_path, one_rank, text):
    root = tmp_path / "save"
    _save(root, 0)
    (root / "latest_checkpointed_iteration.txt").write_text(text)
    with pytest.raises(ValueError, match=r"latest_checkpointed_iteration.txt holds .*, not an iteration; other "
                                         r"checkpoints there: iterations 1; resume with --ckpt-step 1$"):  # fmt: skip
        _load(root)


def test_the_save_flushes_every_file_before_the_renames_that_publish_it(tmp_path, one_rank, fsync_and_rename_log):
    events = fsync_and_rename_log
    root = tmp_path / "save"
    final = _save(root, 0)
    staged = str(root / "iter_0000001.tmp")
    publish = events.index(("replace", staged, str(final)))
    flushed = {e[1] for e in events[:publish] if e[0] == "fsync"}
    written = {str(p).replace(str(final), staged) for p in final.rglob("*")} | {staged}
    assert written <= flushed  # every file and folder of the checkpoint, before its final name exists
    tracker = str(root / "latest_checkpointed_iteration.txt")
    commit = events.index(("replace", tracker + ".tmp", tracker))
    assert ("fsync", tracker + ".tmp") in events[publish:commit]  # the tracker's text before its rename
    assert ("fsync", str(root)) in events[commit:]  # and the rename itself


def _lora_like(rank):
    """A tiny model whose parameters depend on a LoRA-like flag, as `--lora-rank` decides the FSDP model's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2))
    if rank:
        model.append(nn.Linear(2, rank, bias=False))  # stands in for the adapters
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def test_a_lora_rank_mismatch_is_one_error_naming_the_flag_and_both_values(tmp_path, one_rank):
    # Was found by matching torch's "Missing key" text and named no flag value; now meta.json's flags are compared.
    root = tmp_path / "save"
    model, optimizer, scheduler = _lora_like(4)
    save_checkpoint(root, rollout_id=0, global_step=1, model=model, optimizer=optimizer, scheduler=scheduler,
                    model_flags={"--lora-rank": 4, "--lora-target-modules": ["q_proj"]})  # fmt: skip
    model, optimizer, scheduler = _lora_like(0)
    with pytest.raises(ValueError) as e:
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, model_flags={"--lora-rank": 0})
    assert str(e.value) == (
        f"--load {root}: iter_0000001 was saved with other model flags than this run's (--lora-rank 4 saved vs 0 "
        "here); resume with the saved run's flags"
    )


def test_same_model_flags_load(tmp_path, one_rank):
    root = tmp_path / "save"
    flags = {"--lora-rank": 4, "--lora-target-modules": ["q_proj"]}
    model, optimizer, scheduler = _lora_like(4)
    save_checkpoint(root, rollout_id=0, global_step=3, model=model, optimizer=optimizer, scheduler=scheduler,
                    model_flags=flags)  # fmt: skip
    model, optimizer, scheduler = _lora_like(4)
    meta = load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, model_flags=flags)
    assert (meta["next_rollout_id"], meta["global_step"], meta["model_flags"]) == (1, 3, flags)


def test_model_flags_are_written_into_a_checkpoint_that_had_none(tmp_path, one_rank):
    # A checkpoint saved before meta.json kept the flags: loaded once, it has them, and the next resume compares.
    root = tmp_path / "save"
    model, optimizer, scheduler = _lora_like(4)
    final = save_checkpoint(root, rollout_id=0, global_step=1, model=model, optimizer=optimizer, scheduler=scheduler)
    meta_file = final / "meta.json"
    old = json.loads(meta_file.read_text())
    del old["model_flags"]
    meta_file.write_text(json.dumps(old))
    model, optimizer, scheduler = _lora_like(4)
    load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, model_flags={"--lora-rank": 4})
    assert json.loads(meta_file.read_text())["model_flags"] == {"--lora-rank": 4}
    model, optimizer, scheduler = _lora_like(4)
    with pytest.raises(ValueError, match=r"\(--lora-rank 4 saved vs 8 here\)"):
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, model_flags={"--lora-rank": 8})


def test_a_checkpoint_of_other_parameters_is_not_called_damaged(tmp_path, one_rank):
    # A LoRA checkpoint (no flags recorded) resumed without adapters was reported "damaged after it was written".
    root = tmp_path / "save"
    model, optimizer, scheduler = _lora_like(4)
    save_checkpoint(root, rollout_id=0, global_step=1, model=model, optimizer=optimizer, scheduler=scheduler)
    model, optimizer, scheduler = _lora_like(0)
    with pytest.raises(ValueError) as e:
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)
    assert str(e.value) == (
        f"--load {root}: iter_0000001 holds other parameters than this run's model (only in the checkpoint: "
        "1.weight): a flag that decides the parameters differs from the saved run's (--lora-rank, "
        "--lora-target-modules, --hf-checkpoint); resume with the saved run's flags"
    )


def test_a_checkpoint_of_another_model_size_is_not_called_damaged(tmp_path, one_rank):
    # Same parameter names, other shapes (a resume with another --hf-checkpoint size): DCP's "Size mismatch" was
    # reported as a checkpoint "damaged after it was written (a partial copy ...)".
    root = tmp_path / "save"
    _save(root, 0)  # nn.Linear(2, 2)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(ValueError) as e:
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)
    assert str(e.value).startswith(
        f"--load {root}: iter_0000001 holds other parameters than this run's model (other shapes: weight [2, 2] "
        "saved vs [2, 3] here): "
    )
    assert "damaged" not in str(e.value)


def test_a_resave_killed_between_its_renames_resumes_from_the_complete_old_copy(tmp_path, one_rank, monkeypatch):
    # Issue 27 pass 27: re-saving an iteration (a resume from an earlier --ckpt-step) renames the old copy to .old,
    # then the new one into place; a kill in between left the tracker naming a missing folder, and the resume went
    # back a checkpoint although the complete copy was there.
    import os

    from slime_core.checkpoint_dirs import restore_interrupted_saves

    root = tmp_path / "save"
    _save(root, 0)
    model, optimizer, scheduler = _parts()
    save_checkpoint(root, rollout_id=1, global_step=7, model=model, optimizer=optimizer, scheduler=scheduler)
    renames = []

    def killed_at_the_second(src, dst):
        renames.append(dst)
        if len(renames) == 2:
            raise KeyboardInterrupt("SIGKILL")
        os.rename(src, dst)

    monkeypatch.setattr("slime_core.dir_swap.os.replace", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        _save(root, 1)  # global_step 1, never completed
    monkeypatch.undo()
    assert not (root / "iter_0000002").exists() and (root / "latest_checkpointed_iteration.txt").read_text() == "2"
    with pytest.raises(FileNotFoundError, match="iter_0000002 is missing or incomplete"):
        _load(root)
    assert restore_interrupted_saves(root) == [2]
    assert _load(root)["global_step"] == 7  # the copy the cut save was replacing
    assert _save(root, 1).name == "iter_0000002"  # the next save replaces it as usual (the .tmp left-over is ours)


def test_a_resume_on_another_number_of_ranks_says_which_rng_states_are_not_restored(tmp_path, one_rank, caplog):
    # Issue 27 pass 27: DCP reshards weights and optimizer, but RNG states are per rank: a rank without one kept its
    # seeded RNG and saved ones of ranks that no longer exist were dropped, without a word.
    root = tmp_path / "save"
    last = _save(root, 0)
    meta = json.loads((last / "meta.json").read_text())
    (last / "meta.json").write_text(json.dumps({**meta, "world_size": 2}))  # as if saved by two ranks

    def said():  # this module's warnings only (torch's DCP logs its events in the same capture)
        return [r.getMessage() for r in caplog.records if r.name == "slime_train_fsdp.checkpoint" and r.levelno >= 30]

    with caplog.at_level("WARNING", logger="slime_train_fsdp.checkpoint"):
        _load(root)
    assert said() == [
        f"--load {root}: iter_0000001 was saved by 2 rank(s) and resumes on 1: the saved RNG states of ranks 1-1 are "
        "not used, so the trainer's random draws (dropout) differ from an uninterrupted run's"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="slime_train_fsdp.checkpoint"):
        _load(root, load_rng=False)  # --no-load-rng: nothing to say
    assert said() == []


# ---- resuming with other optimizer flags ------------------------------------------------------------------------


def _adam_parts(**flags):
    from slime_core.config import SlimeArgs
    from slime_train_fsdp.lr_schedule import build_lr_scheduler
    from slime_train_fsdp.trainer_parts import build_optimizer

    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 4, "lr": 1e-3, **flags})
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    optimizer, _ = build_optimizer(model, cfg, torch.device("cpu"))
    return model, optimizer, build_lr_scheduler(optimizer, cfg)


def test_a_resume_with_other_adamw_flags_is_refused_naming_each_flag(tmp_path, one_rank):
    # Issue 27 (pass 55): torch's Optimizer.load_state_dict puts the saved param groups over this run's, so a resume
    # with --weight-decay 0 --adam-beta2 0.95 trained on at the checkpoint's 0.1 and 0.98 with no word.
    root = tmp_path / "save"
    model, optimizer, scheduler = _adam_parts(weight_decay=0.1, adam_beta2=0.98)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    scheduler.step()
    save_checkpoint(root, rollout_id=0, global_step=1, model=model, optimizer=optimizer, scheduler=scheduler)

    model, optimizer, scheduler = _adam_parts(weight_decay=0.0, adam_beta2=0.95)
    with pytest.raises(ValueError) as e:
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)
    assert str(e.value) == (
        f"--load {root}: iter_0000001: the checkpoint's optimizer settings differ from this run's flags "
        "(--weight-decay 0.0 here vs 0.1 saved; --adam-beta2 0.95 here vs 0.98 saved); a resumed run continues the "
        "checkpoint's optimizer state: give the saved values, or --no-load-optim to start the optimizer and its "
        "schedule afresh"
    )
    model, optimizer, scheduler = _adam_parts(weight_decay=0.1, adam_beta2=0.98)  # the saved flags resume
    assert load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)["next_rollout_id"] == 1
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 and optimizer.param_groups[0]["betas"] == (0.9, 0.98)


def test_another_schedule_of_the_critic_is_refused_as_such_not_as_a_damaged_checkpoint(tmp_path, one_rank):
    # Issue 27 (pass 55): the preflight checks the actor's schedule only; the critic's loader caught the refusal with
    # the unreadable-file errors: "--critic-load ...: iter_0000001 cannot be read (--load: the checkpoint's
    # learning-rate schedule differs ...); it was damaged after it was written".
    root = tmp_path / "critic"
    model, optimizer, scheduler = _adam_parts()
    save_checkpoint(root, rollout_id=0, global_step=1, model=model, optimizer=optimizer, scheduler=scheduler)
    model, optimizer, scheduler = _adam_parts(lr=2e-3)
    with pytest.raises(ValueError) as e:
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, flag="--critic-load")
    assert str(e.value).startswith(
        f"--critic-load {root}: iter_0000001: the checkpoint's learning-rate schedule differs from this run's flags "
        "(--lr 0.002 here vs 0.001 saved)"
    )
    assert "damaged" not in str(e.value)


def test_an_uncommitted_save_leaves_the_tracker_until_commit_checkpoint_names_it(tmp_path, one_rank):
    # The driver writes its run state between the two (slime_app.loop.Run._commit): a run killed in between resumes
    # from the checkpoint the tracker still names, whose run state is there.
    from slime_core.checkpoint_dirs import tracker_step
    from slime_train_fsdp.checkpoint import commit_checkpoint

    root = tmp_path / "save"
    _save(root, 0)
    assert tracker_step(root) == 1  # committed by default: rollout 0 resumes at iteration 1
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    final = save_checkpoint(root, rollout_id=1, global_step=2, model=model, optimizer=optimizer, scheduler=scheduler,
                            commit=False)  # fmt: skip
    assert final.name == "iter_0000002" and final.is_dir() and tracker_step(root) == 1
    commit_checkpoint(root, 1)
    assert tracker_step(root) == 2
