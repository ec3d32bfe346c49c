"""Checkpoint directories under --save are replaced only when slime wrote them (slime_core.dir_swap marker)."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from slime_core.dir_swap import MARKER, ReplaceRefused
from slime_train_fsdp.checkpoint import save_checkpoint


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
