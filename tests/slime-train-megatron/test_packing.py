import pytest
import torch

from slime_train_megatron.packing import cp_zigzag_indices, pack_thd


def test_pack_by_hand():
    a = torch.tensor([5, 6, 7])  # prompt [5, 6], response [7]
    b = torch.tensor([8, 9, 10, 11, 12])  # prompt [8, 9], response [10, 11, 12]
    p = pack_thd([a, b], [1, 3], pad_multiple=4)
    assert p.tokens.tolist() == [[5, 6, 7, 0, 8, 9, 10, 11, 12, 0, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]]
    assert p.cu_seqlens.tolist() == [0, 4, 12] and p.cu_seqlens.dtype == torch.int32
    # logit at position j predicts token j+1: a's response token 7 is predicted at 1; b's at 5, 6, 7.
    assert p.logit_index.tolist() == [1, 5, 6, 7]
    assert p.targets.tolist() == [7, 10, 11, 12]
    assert torch.equal(p.tokens[0, p.logit_index + 1], p.targets)
    assert p.max_seqlen == 8


def test_pack_errors():
    with pytest.raises(ValueError, match="response length"):
        pack_thd([torch.tensor([1, 2])], [2])
    with pytest.raises(ValueError, match="response lengths"):
        pack_thd([torch.tensor([1, 2])], [1, 1])


def test_cp_zigzag_covers_every_position_once():
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)  # lengths 8 and 4, CP=2 -> chunks of 2 and 1
    r0 = cp_zigzag_indices(cu, 0, 2)
    r1 = cp_zigzag_indices(cu, 1, 2)
    assert r0.tolist() == [0, 1, 6, 7, 8, 11]
    assert r1.tolist() == [2, 3, 4, 5, 9, 10]
    assert sorted(torch.cat([r0, r1]).tolist()) == list(range(12))
    with pytest.raises(ValueError, match="divisible"):
        cp_zigzag_indices(torch.tensor([0, 6], dtype=torch.int32), 0, 2)
