"""A checkpoint saved with --no-save-optim resumes only with --no-load-optim (as the original), never silently fresh."""

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn

from slime_train_fsdp.checkpoint import load_checkpoint, save_checkpoint


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _parts(lr=0.1):
    torch.manual_seed(0)
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    # Warm-up over 10 steps: a schedule started afresh is back at lr/10.
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))


def _trained_save(root, *, save_optim):
    model, optimizer, scheduler = _parts()
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
    save_checkpoint(root, rollout_id=4, global_step=5, model=model, optimizer=optimizer, scheduler=scheduler,
                    save_optim=save_optim)  # fmt: skip
    return model


def test_a_checkpoint_without_optimizer_state_is_refused_unless_no_load_optim(tmp_path, one_rank):
    root = tmp_path / "save"
    saved = _trained_save(root, save_optim=False)
    assert json.loads((root / "iter_0000005" / "meta.json").read_text())["save_optim"] is False
    model, optimizer, scheduler = _parts()
    with pytest.raises(ValueError) as e:  # was: loaded, Adam's moments empty and the warm-up back at step 0
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)
    assert str(e.value) == (
        f"--load {root}: iter_0000005 holds no optimizer state (saved with --no-save-optim); resume it with "
        "--no-load-optim to start the optimizer and its learning-rate schedule afresh"
    )
    assert not optimizer.state  # refused before anything was read
    meta = load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler, load_optim=False)
    assert meta["next_rollout_id"] == 5
    assert torch.equal(model.weight, saved.weight)  # the weights of rollout 4; optimizer and schedule fresh
    assert scheduler.last_epoch == 0 and optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_a_checkpoint_with_optimizer_state_continues_its_schedule(tmp_path, one_rank):
    root = tmp_path / "save"
    _trained_save(root, save_optim=True)
    model, optimizer, scheduler = _parts()
    load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)
    assert scheduler.last_epoch == 5 and optimizer.param_groups[0]["lr"] == pytest.approx(0.06)
    assert optimizer.state[model.weight]["step"] == 5  # Adam's moments came back


def test_an_old_checkpoint_without_the_field_is_read_by_its_files(tmp_path, one_rank):
    # Saved before meta.json said so: scheduler.pt missing means no optimizer state.
    root = tmp_path / "save"
    _trained_save(root, save_optim=False)
    meta_file = root / "iter_0000005" / "meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["save_optim"]
    meta_file.write_text(json.dumps(meta))
    model, optimizer, scheduler = _parts()
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)


def test_the_loader_and_the_preflight_refuse_by_one_rule(tmp_path):
    # The app's preflight looked only for scheduler.pt; the loader read meta.json's save_optim first.
    from slime_train_fsdp.checkpoint import optimizer_state_refusal

    step = tmp_path / "iter_0000003"
    step.mkdir()
    (step / "scheduler.pt").write_bytes(b"")
    (step / "meta.json").write_text(json.dumps({"save_optim": False}))
    assert optimizer_state_refusal(tmp_path, step) == (
        f"--load {tmp_path}: iter_0000003 holds no optimizer state (saved with --no-save-optim); resume it with "
        "--no-load-optim to start the optimizer and its learning-rate schedule afresh"
    )
    (step / "meta.json").write_text("{}")  # saved before the field: the files tell
    assert optimizer_state_refusal(tmp_path, step) is None
    (step / "scheduler.pt").unlink()
    assert optimizer_state_refusal(tmp_path, step, {"save_optim": True}) is not None


def test_a_lost_scheduler_file_of_a_checkpoint_saved_with_its_optimizer_is_not_called_no_save_optim(tmp_path, one_rank):
    # Issue 27 (pass 55): a partial copy without scheduler.pt was refused as "saved with --no-save-optim", which
    # meta.json says it was not; the refusal now says what is missing and the ways on.
    root = tmp_path / "save"
    _trained_save(root, save_optim=True)
    (root / "iter_0000005" / "scheduler.pt").unlink()
    model, optimizer, scheduler = _parts()
    with pytest.raises(ValueError) as e:
        load_checkpoint(root, model=model, optimizer=optimizer, scheduler=scheduler)
    assert str(e.value) == (
        f"--load {root}: iter_0000005/scheduler.pt is missing, though iter_0000005 was saved with its optimizer state "
        "(a partial copy); restore the file, resume from another iteration with --ckpt-step, or give --no-load-optim "
        "to start the optimizer and its learning-rate schedule afresh"
    )
    assert not optimizer.state  # refused before anything was read
