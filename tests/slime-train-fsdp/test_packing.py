"""Tests of packed micro-batch construction (pure tensor bookkeeping, exact)."""

import pytest
import torch

from slime_train_fsdp.packing import pack_micro_batch, split_by_lengths

CPU = torch.device("cpu")


def test_pack_two_sequences():
    tokens = [torch.tensor([10, 11, 12, 13]), torch.tensor([20, 21, 22]), torch.tensor([30, 31])]
    mb = pack_micro_batch(tokens, [2, 1, 1], [2, 0], CPU)
    # Row: [30, 31 | 10, 11, 12, 13]; positions restart at 0 per sequence.
    assert mb.input_ids.tolist() == [[30, 31, 10, 11, 12, 13]]
    assert mb.position_ids.tolist() == [[0, 1, 0, 1, 2, 3]]
    # Sample 2 (T=2, L=1): position 0 predicts token 31. Sample 0 (T=4, L=2) at offset 2: positions 3, 4
    # predict tokens 12, 13.
    assert mb.predict_index.tolist() == [0, 3, 4]
    assert mb.targets.tolist() == [31, 12, 13]
    assert mb.sample_ids == [2, 0] and mb.response_lengths == [1, 2]
    assert mb.seq_lengths == [2, 4]  # the row's sequence boundaries, for cu_seqlens / the flex BlockMask


def test_empty_micro_batch_is_a_dummy_row():
    mb = pack_micro_batch([torch.tensor([1, 2])], [1], [], CPU)
    assert mb.input_ids.shape == (1, 1) and mb.targets.numel() == 0 and mb.predict_index.numel() == 0
    assert mb.seq_lengths == [1]


def test_zero_length_response_and_bad_length():
    mb = pack_micro_batch([torch.tensor([1, 2, 3])], [0], [0], CPU)
    assert mb.targets.numel() == 0
    with pytest.raises(ValueError, match="response_length 3"):
        pack_micro_batch([torch.tensor([1, 2, 3])], [3], [0], CPU)


def test_split_by_lengths():
    parts = split_by_lengths(torch.arange(5.0), [2, 0, 3])
    assert [p.tolist() for p in parts] == [[0.0, 1.0], [], [2.0, 3.0, 4.0]]
