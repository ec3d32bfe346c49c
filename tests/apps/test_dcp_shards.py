"""A `--load` whose DCP shard files lack bytes `.metadata` points at, named before Ray starts (issue 27)."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from slime_app.checkpoints import check_checkpoints
from slime_app.dcp_shards import dcp_shard_problems
from slime_core.config import parse_args


@pytest.fixture
def save(tmp_path):
    """FSDP checkpoints iter_0000001 and iter_0000002 whose model_and_optim/ is a real one-process DCP save."""
    root = tmp_path / "save"
    for step in (1, 2):
        folder = root / f"iter_{step:07d}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text("{}")
        state = {"model": {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(10)}}
        dcp.save(state, checkpoint_id=str(folder / "model_and_optim"), no_dist=True)
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    return root


def _cfg(save):
    return parse_args(["--rollout-batch-size", "1", "--num-rollout", "4", "--train-backend", "fsdp", "--load",
                       str(save), "--no-load-optim"])  # fmt: skip


def _shard(save):
    (shard,) = (save / "iter_0000002" / "model_and_optim").glob("*.distcp")
    return shard


def test_a_whole_checkpoint_has_no_problems(save):
    assert dcp_shard_problems(save / "iter_0000002" / "model_and_optim") == []
    check_checkpoints(_cfg(save))


def test_a_truncated_shard_is_named_with_the_iteration_to_resume_from(save):
    # Issue 27: the trainer ranks found it when they loaded, after Ray, the engines and the model build.
    shard = _shard(save)
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save))
    assert str(e.value) == (
        f"--load {save}: iter_0000002/model_and_optim was damaged after it was written (a partial copy, a crash "
        f"before it reached the disk): {shard.name} holds 100 of its {size} bytes; complete checkpoints there: "
        "iterations 1; resume from one with --ckpt-step 1"
    )


def test_a_missing_shard_is_named(save):
    shard = _shard(save)
    shard.unlink()
    with pytest.raises(ValueError, match=rf"iter_0000002/model_and_optim was damaged .*: {shard.name} is missing;"):
        check_checkpoints(_cfg(save))


def test_a_truncated_torch_dist_ref_load_is_named(tmp_path):
    ref = tmp_path / "ref"
    dcp.save({"w": torch.arange(1000, dtype=torch.float32)}, checkpoint_id=str(ref / "iter_0000003"), no_dist=True)
    (ref / "latest_checkpointed_iteration.txt").write_text("3")
    (shard,) = (ref / "iter_0000003").glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:10])
    cfg = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--train-backend", "fsdp", "--ref-load",
                      str(ref), "--use-kl-loss", "--kl-coef", "0.1"])  # fmt: skip
    with pytest.raises(ValueError, match=rf"^--ref-load {ref}: iter_0000003 was damaged .*: {shard.name} holds 10 of"):
        check_checkpoints(cfg)


def test_a_damaged_meta_json_is_named_before_ray_starts(save):
    # Issue 27: the preflight skipped it ("the trainer's load names it"), which it did after the engines started.
    (save / "iter_0000002" / "meta.json").write_text('{"rollout_id": 1, "next_rol')
    with pytest.raises(ValueError) as e:
        check_checkpoints(_cfg(save))
    assert str(e.value).startswith(f"--load {save}: iter_0000002/meta.json cannot be read (JSONDecodeError: ")
    assert str(e.value).endswith("complete checkpoints there: iterations 1; resume from one with --ckpt-step 1")
