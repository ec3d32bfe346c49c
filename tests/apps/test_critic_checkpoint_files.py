"""A PPO critic's own checkpoint files (DCP shards, meta.json) checked before Ray starts, as the actor's (issue 27)."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from slime_app.checkpoints import check_checkpoints
from slime_core.config import parse_args


def _cfg(save, *extra):
    return parse_args(["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "4",
                       "--train-backend", "fsdp", "--advantage-estimator", "ppo", "--load", str(save),
                       "--no-load-optim", *extra])  # fmt: skip


def _save(root, steps, *, critic=False):
    """FSDP iterations `steps` under `root`, each with meta.json and a real one-process DCP model_and_optim/.

    A critic's model has a value head (`model.value_head.weight`), an actor's an lm_head.
    """
    for step in steps:
        folder = root / f"iter_{step:07d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text("{}")
        head = "value_head.weight" if critic else "lm_head.weight"
        state = {"model": {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(10), head: torch.ones(4)}}
        dcp.save(state, checkpoint_id=str(folder / "model_and_optim"), no_dist=True)
    (root / "latest_checkpointed_iteration.txt").write_text(str(steps[-1]))


@pytest.fixture
def save(tmp_path):
    """A PPO save: the actor's iterations 1 and 2 under save/, the critic's under save/critic/."""
    root = tmp_path / "save"
    _save(root, [1, 2])
    _save(root / "critic", [1, 2], critic=True)
    return root


def _critic_shard(save):
    (shard,) = (save / "critic" / "iter_0000002" / "model_and_optim").glob("*.distcp")
    return shard


def test_a_whole_critic_checkpoint_passes(save):
    check_checkpoints(_cfg(save))


def test_an_actor_checkpoint_as_the_critics_is_refused_before_ray(save):
    # README: "an actor's checkpoint given as the critic's (no value head) is refused in one line naming
    # --critic-load"; it was, but by the critic's trainer after Ray, the engines and the actor's load (~50 s on CPU),
    # and `--dry-run` passed it.
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save, "--critic-load", str(save)))
    assert str(e.value) == (
        f"--critic-load {save}: iter_0000002 is not a critic checkpoint: its model has an lm_head and no value_head "
        "(an actor's checkpoint? the critic's are saved in <--save>/critic); give the critic's checkpoint folder, or "
        "an HF directory to start the value model from"
    )


def test_a_truncated_critic_shard_is_named_with_the_iteration_to_resume_from(save):
    # Issue 27: the critic's trainer ranks found it when they loaded, after Ray, the engines and the actor's load.
    shard = _critic_shard(save)
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save))
    assert str(e.value) == (
        f"--load {save} (the critic's {save / 'critic'}): iter_0000002/model_and_optim was damaged after it was "
        f"written (a partial copy, a crash before it reached the disk): {shard.name} holds 100 of its {size} bytes; "
        "complete checkpoints there: iterations 1; resume from one with --ckpt-step 1"
    )


def test_a_missing_critic_shard_under_critic_load_names_that_flag(save, tmp_path):
    _critic_shard(save).unlink()
    critic = save / "critic"
    with pytest.raises(ValueError, match=rf"^--critic-load {critic}: iter_0000002/model_and_optim was damaged .* is "):
        check_checkpoints(_cfg(save, "--critic-load", str(critic)))


def test_a_damaged_critic_meta_json_is_named(save):
    (save / "critic" / "iter_0000002" / "meta.json").write_text('{"lr": ')
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save))
    message = str(e.value)
    assert message.startswith(
        f"--load {save} (the critic's {save / 'critic'}): iter_0000002/meta.json cannot be read (JSONDecodeError"
    )
    assert message.endswith("complete checkpoints there: iterations 1; resume from one with --ckpt-step 1")


def test_a_truncated_critic_metadata_is_named(save):
    (save / "critic" / "iter_0000002" / "model_and_optim" / ".metadata").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^--load .* \(the critic's .*\): cannot read .*\.metadata \(EOFError"):
        check_checkpoints(_cfg(save))


def test_the_actor_checkpoint_is_still_checked_first(save):
    (save / "iter_0000002" / "meta.json").write_text("[")
    with pytest.raises(ValueError, match=rf"^--load {save}: iter_0000002/meta.json cannot be read"):
        check_checkpoints(_cfg(save))


def _save_torch_dist(root, steps):
    """Megatron-style iterations `steps` under `root`: each `iter_XXXXXXX/` a real one-process DCP save."""
    for step in steps:
        state = {"decoder.weight": torch.arange(1000, dtype=torch.float32)}
        dcp.save(state, checkpoint_id=str(root / f"iter_{step:07d}"), no_dist=True)
    (root / "latest_checkpointed_iteration.txt").write_text(str(steps[-1]))


def test_a_truncated_megatron_critic_shard_is_named(tmp_path):
    # The torch_dist critic had no check before Ray: a cut shard was found by the critic's ranks when they loaded.
    save = tmp_path / "save"
    _save_torch_dist(save, [1, 2])
    _save_torch_dist(save / "critic", [1, 2])
    cfg = parse_args(["--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "4",
                      "--train-backend", "megatron", "--advantage-estimator", "ppo", "--load", str(save),
                      "--no-load-optim"])  # fmt: skip
    check_checkpoints(cfg)  # whole: passes
    (shard,) = (save / "critic" / "iter_0000002").glob("*.distcp")
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg)
    assert str(e.value) == (
        f"--load {save} (the critic's {save / 'critic'}): iter_0000002 was damaged after it was written (a partial "
        f"copy, a crash before it reached the disk): {shard.name} holds 100 of its {size} bytes; complete checkpoints "
        "there: iterations 1; resume from one with --ckpt-step 1"
    )
