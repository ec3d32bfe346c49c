import pytest
import torch

from slime_train_megatron.weights import merge_tp_shards, shard_for_tp


def test_gated_fc1_shard_by_hand():
    # [gate; up] with F=4 rows each (values = row ids), TP=2: rank 0 = gate rows 0-1 + up rows 4-5.
    full = torch.arange(8.0)[:, None]
    assert shard_for_tp(full, 0, 2, partition_dim=0, gated=True).flatten().tolist() == [0, 1, 4, 5]
    assert shard_for_tp(full, 1, 2, partition_dim=0, gated=True).flatten().tolist() == [2, 3, 6, 7]
    # A plain split would give rank 0 the whole gate: the gated path must differ.
    assert shard_for_tp(full, 0, 2, partition_dim=0).flatten().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(("dim", "gated"), [(0, False), (1, False), (0, True)])
def test_merge_inverts_shard(dim, gated):
    full = torch.randn(8, 12)
    shards = [
        shard_for_tp(full, r, 4 if not gated else 2, partition_dim=dim, gated=gated)
        for r in range(4 if not gated else 2)
    ]
    assert torch.equal(merge_tp_shards(shards, partition_dim=dim, gated=gated), full)


def test_shard_indivisible():
    with pytest.raises(ValueError, match="not divisible"):
        shard_for_tp(torch.zeros(6, 2), 0, 4, partition_dim=0)
