"""A PPO critic's checkpoint against this run's `--critic-lr`, checked before Ray and the engines (issue 27)."""

import pytest
import torch

from slime_app.checkpoints import check_checkpoints
from slime_core.config import parse_args
from slime_core.critic import critic_config
from slime_train_fsdp.lr_schedule import build_lr_scheduler


def _cfg(save, *extra):
    return parse_args(["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "4",
                       "--train-backend", "fsdp", "--advantage-estimator", "ppo", "--lr", "1e-6", "--load", str(save),
                       *extra])  # fmt: skip


def _save_iteration(root, cfg):
    """iter_0000003 under `root` with the scheduler state `cfg`'s schedule saves (no weights: not read here)."""
    (root / "iter_0000003").mkdir(parents=True)
    (root / "iter_0000003" / "meta.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text("3")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=float(cfg.lr))
    torch.save(build_lr_scheduler(optimizer, cfg).state_dict(), root / "iter_0000003" / "scheduler.pt")


@pytest.fixture
def save(tmp_path):
    """An FSDP PPO save: the actor's iter_0000003 at --lr 1e-6, the critic's in critic/ at --critic-lr 1e-5."""
    root = tmp_path / "save"
    saved = _cfg(root, "--critic-lr", "1e-5")
    _save_iteration(root, saved)
    _save_iteration(root / "critic", critic_config(saved))
    return root


def test_a_changed_critic_lr_is_refused_by_the_preflight(save):
    # Issue 27: the critic's trainer refused it (naming --lr) after Ray, the engines and the actor's model load.
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save, "--critic-lr", "2e-5"))
    named = f"--load {save} (the critic's {save / 'critic'}): "
    said = (
        "the checkpoint's learning-rate schedule differs from this run's flags (--critic-lr 2e-05 here vs 1e-05 saved"
    )
    assert str(e.value).startswith(named + said)


def test_the_saved_critic_lr_resumes_and_no_load_optim_skips_the_schedule(save):
    check_checkpoints(_cfg(save, "--critic-lr", "1e-5"))
    check_checkpoints(_cfg(save, "--critic-lr", "2e-5", "--no-load-optim"))
