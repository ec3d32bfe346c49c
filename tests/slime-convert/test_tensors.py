"""Hand-checked layouts of the HF ↔ Megatron tensor transforms."""

import pytest
import torch

from slime_convert.tensors import fuse_gate_up, fuse_qkv, pad_vocab, split_gate_up, split_qkv, unpad_vocab


def test_fuse_qkv_interleaves_per_kv_group_by_hand():
    # H=4 query heads, G=2 kv groups, head_dim d=1, hidden=1: each row is one head, value = id.
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])  # q heads 0..3 (heads 0,1 -> group 0)
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    fused = fuse_qkv(q, k, v, num_heads=4, num_groups=2, head_dim=1)
    # group 0: q0 q1 k0 v0, group 1: q2 q3 k1 v1
    assert fused.flatten().tolist() == [10, 11, 20, 30, 12, 13, 21, 31]


def test_fuse_qkv_head_dim_2_and_bias_by_hand():
    # H=2, G=1 (MQA), d=2: rows q0a q0b q1a q1b k0a k0b v0a v0b
    q = torch.arange(4.0)
    k = torch.tensor([100.0, 101.0])
    v = torch.tensor([200.0, 201.0])
    assert fuse_qkv(q, k, v, num_heads=2, num_groups=1, head_dim=2).tolist() == [0, 1, 2, 3, 100, 101, 200, 201]
    # G=H (no GQA): per head q_i, k_i, v_i
    q2, k2, v2 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([5.0, 6.0])
    assert fuse_qkv(q2, k2, v2, num_heads=2, num_groups=2, head_dim=1).tolist() == [1, 3, 5, 2, 4, 6]


def test_split_qkv_inverts_fuse_bitwise():
    torch.manual_seed(0)
    q, k, v = torch.randn(8 * 16, 32), torch.randn(2 * 16, 32), torch.randn(2 * 16, 32)
    fused = fuse_qkv(q, k, v, num_heads=8, num_groups=2, head_dim=16)
    assert fused.shape == (2 * (4 + 2) * 16, 32)
    for a, b in zip(split_qkv(fused, num_heads=8, num_groups=2, head_dim=16), (q, k, v), strict=True):
        assert torch.equal(a, b)


def test_qkv_shape_errors():
    with pytest.raises(ValueError, match="k has shape"):
        fuse_qkv(torch.zeros(4, 3), torch.zeros(3, 3), torch.zeros(2, 3), num_heads=4, num_groups=2, head_dim=1)
    with pytest.raises(ValueError, match="not a multiple"):
        fuse_qkv(torch.zeros(3, 3), torch.zeros(2, 3), torch.zeros(2, 3), num_heads=3, num_groups=2, head_dim=1)
    with pytest.raises(ValueError, match="rows"):
        split_qkv(torch.zeros(7, 3), num_heads=4, num_groups=2, head_dim=1)


def test_gate_up_fusion_by_hand():
    gate = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    up = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    fc1 = fuse_gate_up(gate, up)
    assert fc1.tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    g, u = split_gate_up(fc1)
    assert torch.equal(g, gate) and torch.equal(u, up)
    with pytest.raises(ValueError, match="differ"):
        fuse_gate_up(gate, up[:1])
    with pytest.raises(ValueError, match="odd"):
        split_gate_up(torch.zeros(3, 2))


def test_vocab_padding_and_removal():
    w = torch.arange(6.0).reshape(3, 2)
    padded = pad_vocab(w, 5)
    assert padded.tolist() == [[0, 1], [2, 3], [4, 5], [0, 0], [0, 0]]
    assert torch.equal(unpad_vocab(padded, 3), w)
    assert pad_vocab(w, 3) is w
    with pytest.raises(ValueError):
        pad_vocab(w, 2)
    with pytest.raises(ValueError):
        unpad_vocab(w, 4)
