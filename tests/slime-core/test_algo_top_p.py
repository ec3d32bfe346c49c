"""Top-p replay primitive: the log-softmax restricted to the engine's nucleus plus the sampled token.

References are written independently here: a dense boolean mask and fp64 `log_softmax` over the kept columns.
Tolerance: 1e-6 (fp32 math on small logits).
"""

import math

import pytest
import torch

from slime_core.algorithms import KeptTokens, log_probs_from_logits, restricted_logsumexp, validate_top_p_offsets

ATOL = 1e-6


def _dense_reference(logits, ids, nuclei, temperature):
    z = logits.double() / temperature
    out = []
    for t, kept in enumerate(nuclei):
        cols = sorted(set(kept) | {int(ids[t])})
        out.append(z[t, ids[t]] - torch.logsumexp(z[t, cols], -1))
    return torch.stack(out)


def test_hand_value_two_kept_tokens():
    # z = [0, ln 3, ln 6]; nucleus {1, 2}, target 1 → p = 3 / (3 + 6) = 1/3.
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)]])
    kept = KeptTokens.from_offsets([[2, 1]], [[0, 2]])
    lp = log_probs_from_logits(logits, torch.tensor([1]), kept=kept)
    assert lp.item() == pytest.approx(math.log(1 / 3), abs=ATOL)


def test_target_outside_the_nucleus_is_force_kept_once():
    # nucleus {2}; target 1 is not in it → denominator {1, 2}: p = 3/9. An empty nucleus leaves only the target.
    logits = torch.tensor([[0.0, math.log(3.0), math.log(6.0)]] * 2)
    kept = KeptTokens.from_offsets([[2]], [[0, 1, 1]])
    lp = log_probs_from_logits(logits, torch.tensor([1, 0]), kept=kept)
    torch.testing.assert_close(lp, torch.tensor([math.log(1 / 3), 0.0]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("chunk_size", [None, 2, 3])
def test_matches_dense_reference_values_and_gradients(chunk_size):
    g = torch.Generator().manual_seed(0)
    num, vocab = 7, 20
    base = torch.randn(num, vocab, generator=g) * 2 + 300  # large offset: the shift must apply here too
    ids = torch.randint(0, vocab, (num,), generator=g)
    nuclei = [torch.randperm(vocab, generator=g)[: int(k)].tolist() for k in torch.randint(0, 6, (num,), generator=g)]
    flat = [i for n in nuclei for i in n]
    offsets = [0]
    for n in nuclei:
        offsets.append(offsets[-1] + len(n))
    kept = KeptTokens.from_offsets([flat], [offsets])

    logits = base.clone().requires_grad_(True)
    lp = log_probs_from_logits(logits, ids, temperature=0.8, chunk_size=chunk_size, kept=kept)
    lp.sum().backward()

    ref_logits = base.double().clone().requires_grad_(True)
    ref = _dense_reference(ref_logits, ids, nuclei, 0.8)
    ref.sum().backward()
    torch.testing.assert_close(lp.double(), ref.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits.grad.double(), ref_logits.grad, atol=1e-5, rtol=0)
    # Columns outside K_t ∪ {y_t} get no gradient.
    for t, n in enumerate(nuclei):
        outside = sorted(set(range(vocab)) - set(n) - {int(ids[t])})
        assert torch.all(logits.grad[t, outside] == 0)


def test_full_nucleus_equals_plain_log_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 6, generator=g)
    ids = torch.tensor([0, 5, 2])
    kept = KeptTokens.from_offsets([list(range(6)) * 3], [[0, 6, 12, 18]])
    torch.testing.assert_close(
        log_probs_from_logits(logits, ids, kept=kept), log_probs_from_logits(logits, ids), atol=ATOL, rtol=0
    )


def test_kept_tokens_slicing_and_selection():
    kept = KeptTokens.from_offsets([[5, 7], [9, 1, 2]], [[0, 2, 2], [0, 1, 3]])  # rows 0:{5,7} 1:{} 2:{9} 3:{1,2}
    assert kept.num_rows == 4 and kept.rows.tolist() == [0, 0, 2, 3, 3]
    part = kept.slice_rows(1, 3)
    assert (part.rows.tolist(), part.ids.tolist(), part.num_rows) == ([1], [9], 2)
    sel = kept.select_rows(torch.tensor([0, 3]))
    assert (sel.rows.tolist(), sel.ids.tolist(), sel.num_rows) == ([0, 0, 1, 1], [5, 7, 1, 2], 2)
    # Any order, -1 = a row without a response target (empty set): rows [3, -1, 0] → {1,2}, {}, {5,7}.
    sel = kept.select_rows(torch.tensor([3, -1, 0]))
    assert (sel.rows.tolist(), sel.ids.tolist(), sel.num_rows) == ([0, 0, 2, 2], [1, 2, 5, 7], 3)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="3 top-p offsets for 3 response tokens"):
        validate_top_p_offsets([1], [0, 1, 1], 3, what="sample 4")
    with pytest.raises(ValueError, match="from 0 to len"):
        validate_top_p_offsets([1, 2], [0, 1], 1, what="sample 4")
    with pytest.raises(ValueError, match="non-decreasing"):
        validate_top_p_offsets([1, 2], [0, 2, 1, 2], 3, what="sample 4")
    z = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        restricted_logsumexp(z, torch.tensor([0, 1]), KeptTokens.from_offsets([[9]], [[0, 1, 1]]))
    with pytest.raises(ValueError, match="rows"):
        log_probs_from_logits(z, torch.tensor([0, 1]), kept=KeptTokens.from_offsets([[1]], [[0, 1]]))


def test_slice_rows_of_moved_sets_reads_nothing_back():
    """`to` keeps the rows on the host, so `slice_rows` (once per log-prob chunk) never reads the device copy.

    The "device" is `meta`: its tensors hold no values, so a read back (the former `searchsorted(...).tolist()` on
    the device rows) raises.
    """
    kept = KeptTokens.from_offsets([[5, 7, 9], [4, 6]], [[0, 2, 2, 3], [0, 1, 2]])  # rows 0,0,2,3,4
    moved = kept.to("meta")
    assert moved.rows.device.type == "meta" and moved.host_rows is not None
    part = moved.slice_rows(2, 4)
    assert part.num_rows == 2 and part.rows.device.type == "meta" and part.rows.shape == (2,)
    assert part.host_rows.tolist() == [0, 1]  # rows 2 and 3, renumbered
    again = part.slice_rows(1, 2)  # a slice of a slice keeps its host rows
    assert again.host_rows.tolist() == [0] and again.ids.shape == (1,)
    host = kept.slice_rows(2, 4)
    assert host.rows.tolist() == [0, 1] and host.ids.tolist() == [9, 4] and host.host_rows is None
    with pytest.raises(NotImplementedError):
        KeptTokens(rows=moved.rows, ids=moved.ids, num_rows=5).slice_rows(2, 4)  # no host copy: it would read
