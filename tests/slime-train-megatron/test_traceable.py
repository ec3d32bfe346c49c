"""`slime_train_megatron.traceable`: the pieces `--megatron-compile-layers` traces give megatron-core's numbers."""

import types
import warnings

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.models.common.embeddings import rope_utils  # noqa: E402

from slime_train_megatron import traceable  # noqa: E402


class _OneRank:
    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


@pytest.mark.parametrize("interleaved", [False, True])
def test_packed_rope_is_megatron_cores_thd_rope_bit_for_bit(interleaved):
    g = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 3, 7, 12, 13], dtype=torch.int32)  # four sequences, one of length 1
    t = torch.randn(13, 4, 16, generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    angles = torch.outer(torch.arange(9).float(), inv)  # max_s 9 > the longest sequence (5)
    freqs = torch.cat([angles, angles], dim=-1)[:, None, None, :]
    config = types.SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=interleaved,
                                   multi_latent_attention=False)  # fmt: skip
    ours = traceable.packed_rotary_pos_emb(t, freqs, config, cu_seqlens=cu, mscale=1.0, cp_group=_OneRank())
    theirs = rope_utils._apply_rotary_pos_emb_thd(
        t, cu, freqs, rotary_interleaved=interleaved, multi_latent_attention=False, mscale=1.0, cp_group=_OneRank()
    )
    assert torch.equal(ours, theirs)
    # Position 0 of each sequence is left as it is (angle 0): the positions restart at every boundary.
    assert torch.equal(ours[[0, 3, 7, 12]], t[[0, 3, 7, 12]])


def test_packed_rope_compiles_without_a_graph_break():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    freqs = torch.randn(6, 1, 1, 8)
    config = types.SimpleNamespace(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=False)
    fn = torch.compile(
        lambda t, cu: traceable.packed_rotary_pos_emb(t, freqs, config, cu_seqlens=cu, cp_group=_OneRank()),
        backend="eager", fullgraph=True, dynamic=True,
    )  # fmt: skip
    t = torch.randn(5, 2, 8)
    expected = rope_utils._apply_rotary_pos_emb_thd(t, cu, freqs, cp_group=_OneRank())
    assert torch.equal(fn(t, cu), expected)  # fullgraph: megatron-core's own breaks at its .tolist()


def test_tp_group_or_default_returns_megatron_cores_group_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert traceable.tp_group_or_default(None) is None  # torch.distributed not initialized here
        marker = object()
        assert traceable.tp_group_or_default(marker) is None
    traceable.use_traceable_layer_pieces(True)
    try:
        from megatron.core.tensor_parallel import layers
        from megatron.core.transformer import attention

        assert layers.get_tensor_model_parallel_group_if_none is traceable.tp_group_or_default
        assert attention.apply_rotary_pos_emb is traceable.packed_rotary_pos_emb
    finally:
        traceable.use_traceable_layer_pieces(False)
    assert attention.apply_rotary_pos_emb is rope_utils.apply_rotary_pos_emb
