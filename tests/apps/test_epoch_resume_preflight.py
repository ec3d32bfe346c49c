"""A `--num-epoch` run resumed with `--load`: the preflight's check of the saved learning-rate schedule (issue 27)."""

import json

import pytest
import torch

from slime_app.checkpoints import check_checkpoints
from slime_app.resolve import resolve_config
from slime_core.config import parse_args
from slime_train_fsdp.lr_schedule import build_lr_scheduler


def _cfg(tmp_path, *extra):
    return parse_args(["--train-backend", "fsdp", "--prompt-data", str(tmp_path / "five.jsonl"), "--input-key", "q",
                       "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "2",
                       "--lr", "1e-3", "--lr-decay-style", "linear", "--min-lr", "1e-5", "--load", str(tmp_path / "ck"),
                       *extra])  # fmt: skip


@pytest.fixture
def saved(tmp_path):
    """Five prompts; iter_0000002 of a `--num-epoch 2` run (2 rollouts per epoch, 4 in all: 8 optimizer steps)."""
    (tmp_path / "five.jsonl").write_text("".join(json.dumps({"q": f"prompt {i}"}) + "\n" for i in range(5)))
    cfg, _ = resolve_config(_cfg(tmp_path, "--num-epoch", "2"))
    assert cfg.num_rollout == 4
    step = tmp_path / "ck" / "iter_0000002"
    step.mkdir(parents=True)
    step.joinpath("meta.json").write_text("{}")
    (tmp_path / "ck" / "latest_checkpointed_iteration.txt").write_text("2")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    torch.save(build_lr_scheduler(optimizer, cfg).state_dict(), step / "scheduler.pt")
    return tmp_path


def test_a_num_epoch_run_resumes_past_the_preflight_and_a_longer_one_is_refused_by_its_length(saved):
    # Issue 27 pass 75: `--num-epoch` leaves --num-rollout unset until `resolve_config`, which runs after the
    # preflight; its check of the saved schedule multiplied None (the run's length) and every resume of a
    # --num-epoch run with a decaying rate ended in "slime: error: unsupported operand type(s) for *: 'NoneType'
    # and 'int'" before anything started.
    notes = check_checkpoints(_cfg(saved, "--num-epoch", "2"))
    assert notes[-1] == f"--load {saved / 'ck'}: fsdp checkpoint, the run resumes from it"
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(saved, "--num-epoch", "3"))  # 6 rollouts: 12 steps of decay, 8 saved
    assert str(e.value).startswith(
        f"--load {saved / 'ck'}: the checkpoint's learning-rate schedule differs from this run's flags "
        "(--lr-decay-iters (or the run's length) 12 here vs 8 saved)"
    )


def test_a_schedule_saved_by_the_two_group_optimizer_passes_the_preflight_and_a_changed_lr_is_still_refused(tmp_path):
    # Issue 27 pass 86 gave the FSDP optimizer two parameter groups (decayed matrices, undecayed biases and norms);
    # the preflight rebuilt the schedule on a one-group stand-in optimizer and refused every resume of a checkpoint
    # the new trainer wrote: "the checkpoint's optimizer has 2 parameter group(s), this run's 1". The stand-in now
    # has the checkpoint's group count (only the trainer, which builds the model, can check the layout).
    (tmp_path / "five.jsonl").write_text("".join(json.dumps({"q": f"prompt {i}"}) + "\n" for i in range(5)))
    cfg = _cfg(tmp_path, "--num-rollout", "4")
    step = tmp_path / "ck" / "iter_0000002"
    step.mkdir(parents=True)
    step.joinpath("meta.json").write_text("{}")
    (tmp_path / "ck" / "latest_checkpointed_iteration.txt").write_text("2")
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2, 2))]}, {"params": [torch.nn.Parameter(torch.zeros(2))]}]
    torch.save(build_lr_scheduler(torch.optim.AdamW(groups, lr=1e-3), cfg).state_dict(), step / "scheduler.pt")
    notes = check_checkpoints(cfg)
    assert notes[-1] == f"--load {tmp_path / 'ck'}: fsdp checkpoint, the run resumes from it"
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(tmp_path, "--num-rollout", "4", "--lr", "2e-3"))
    assert "learning-rate schedule differs" in str(e.value) and "parameter group" not in str(e.value)
