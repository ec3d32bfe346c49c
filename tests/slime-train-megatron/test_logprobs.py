import multiprocessing
import os
import socket

import pytest
import torch
import torch.distributed as dist

from slime_core.algorithms import KeptTokens
from slime_train_megatron.logprobs import vocab_parallel_log_probs


def _reference(logits, targets, temperature, vocab_size):
    z = logits.double()[:, :vocab_size] / temperature
    logp = torch.log_softmax(z, -1)
    return logp.gather(1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def test_single_rank_matches_log_softmax_with_padding_masked():
    torch.manual_seed(0)
    logits = torch.randn(5, 16, requires_grad=True)
    targets = torch.tensor([0, 3, 9, 11, 2])
    lp, ent = vocab_parallel_log_probs(logits, targets, temperature=0.7, vocab_size=12, with_entropy=True)
    ref_lp, ref_ent = _reference(logits.detach(), targets, 0.7, 12)
    # fp32 vs fp64 reference: 1e-5.
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)
    (lp.sum() + ent.sum()).backward()
    assert logits.grad[:, 12:].abs().sum() == 0  # padding columns get no gradient
    assert torch.isfinite(logits.grad).all()


def test_by_hand_uniform():
    # Two equal logits: log p = log 1/2 for either token, entropy = log 2.
    lp, ent = vocab_parallel_log_probs(torch.zeros(1, 2), torch.tensor([1]), with_entropy=True)
    assert lp.item() == pytest.approx(-0.6931471805599453, abs=1e-7)
    assert ent.item() == pytest.approx(0.6931471805599453, abs=1e-7)


def test_huge_logits_with_low_temperature_stay_finite():
    # Logits near the fp32 maximum at T = 0.5: dividing before subtracting the max overflowed to inf (NaN).
    big = torch.finfo(torch.float32).max / 1.2
    logits = torch.tensor([[big, 0.0, big * 0.5], [big, big, big]], requires_grad=True)
    lp, ent = vocab_parallel_log_probs(logits, torch.tensor([0, 1]), temperature=0.5, with_entropy=True)
    torch.testing.assert_close(lp, torch.tensor([0.0, -1.0986123]), atol=1e-6, rtol=0)  # -ln 3 for the uniform row
    torch.testing.assert_close(ent, torch.tensor([0.0, 1.0986123]), atol=1e-6, rtol=0)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(logits.grad).all()


def _kept():
    # Rows: {1, 3, 11 (padding)}, {} (target only), {7}, {0, 5, 9}; targets 1 (kept), 7, 9 (not kept), 5 (kept).
    return KeptTokens.from_offsets([[1, 3, 11, 7, 0, 5, 9]], [[0, 3, 3, 4, 7]])


def test_top_p_replay_single_rank_matches_slime_core():
    torch.manual_seed(2)
    logits = torch.randn(4, 12) * 3 + 100
    targets = torch.tensor([1, 7, 9, 5])
    full = logits.clone().requires_grad_(True)
    lp, ent = vocab_parallel_log_probs(full, targets, temperature=0.8, vocab_size=10, with_entropy=True, kept=_kept())
    (lp.sum() + 0.5 * ent.sum()).backward()
    # Independent dense reference in fp64 over the real vocabulary (padding id 11 cannot be kept).
    z = logits.double()[:, :10] / 0.8
    sets = [{1, 3}, {7}, {7, 9}, {0, 5, 9}]
    ref = torch.stack([z[t, targets[t]] - torch.logsumexp(z[t, sorted(k)], -1) for t, k in enumerate(sets)])
    torch.testing.assert_close(lp.double(), ref, atol=1e-5, rtol=0)
    assert lp[1].item() == 0.0  # an empty nucleus leaves the target alone: log p = 0
    _, ref_ent = _reference(logits, targets, 0.8, 10)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=0)  # the entropy is not restricted
    assert torch.isfinite(full.grad).all() and full.grad[:, 10:].abs().sum() == 0


@pytest.mark.parametrize("replay", [False, True])
def test_log_probs_chunk_size_splits_the_rows_with_the_same_values_and_grads(monkeypatch, replay):
    # --log-probs-chunk-size 2 on 4 rows: two [2, V] passes (the original's chunked calculate_log_probs_and_entropy);
    # before the fix Megatron's default head ignored the flag and built all rows' fp32 intermediates at once.
    from slime_train_megatron import logprobs

    torch.manual_seed(3)
    logits = torch.randn(4, 12) * 3
    targets = torch.tensor([1, 7, 9, 5])
    kept = _kept() if replay else None
    whole = logits.clone().requires_grad_(True)
    lp, ent = vocab_parallel_log_probs(whole, targets, temperature=0.8, vocab_size=10, with_entropy=True, kept=kept)
    (lp.sum() + 0.5 * ent.sum()).backward()
    shapes = []
    inner = logprobs.vocab_parallel_log_probs

    def spy(chunk_logits, *args, **kwargs):
        shapes.append(tuple(chunk_logits.shape))
        return inner(chunk_logits, *args, **kwargs)

    monkeypatch.setattr(logprobs, "vocab_parallel_log_probs", spy)
    chunked = logits.clone().requires_grad_(True)
    clp, cent = inner(chunked, targets, temperature=0.8, vocab_size=10, with_entropy=True, kept=kept, chunk_size=2)
    (clp.sum() + 0.5 * cent.sum()).backward()
    assert shapes == [(2, 12), (2, 12)]
    # Same fp32 ops on fewer rows: equal to 1e-6.
    torch.testing.assert_close(clp, lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(cent, ent, atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked.grad, whole.grad, atol=1e-6, rtol=0)
    shapes.clear()
    inner(logits, targets, vocab_size=10, chunk_size=-1)  # -1, the default: all rows at once
    inner(logits, targets, vocab_size=10, chunk_size=4)
    assert shapes == []


def _tp_worker(rank, world, port, logits, targets, out_dir, kept=None):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        v_local = logits.shape[1] // world
        shard = logits[:, rank * v_local : (rank + 1) * v_local].clone().requires_grad_(True)
        lp, ent = vocab_parallel_log_probs(
            shard, targets, temperature=0.8, vocab_start=rank * v_local, vocab_size=10,
            group=dist.group.WORLD, with_entropy=True, kept=kept,
        )  # fmt: skip
        (lp.sum() + 0.5 * ent.sum()).backward()
        torch.save((lp.detach(), ent.detach(), shard.grad), out_dir / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("top_p", [False, True])
def test_two_tp_ranks_match_full_vocab_values_and_grads(tmp_path, top_p):
    torch.manual_seed(1)
    logits = torch.randn(4, 12)  # V_pad = 12, real vocab 10 (rank 1 holds the 2 padding columns)
    targets = torch.tensor([1, 7, 9, 5])
    kept = _kept() if top_p else None  # kept ids on both ranks' slices (0-5 on rank 0, 6-11 on rank 1)
    torch.set_num_threads(1)  # forked workers must not inherit a busy OpenMP pool
    ctx = multiprocessing.get_context("fork")  # the worker lives in this test module: spawn cannot import it
    port = _free_port()
    procs = [ctx.Process(target=_tp_worker, args=(r, 2, port, logits, targets, tmp_path, kept)) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        if proc.is_alive():
            proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]
    full = logits.clone().requires_grad_(True)
    lp, ent = vocab_parallel_log_probs(full, targets, temperature=0.8, vocab_size=10, with_entropy=True, kept=kept)
    (lp.sum() + 0.5 * ent.sum()).backward()
    for rank in range(2):
        r_lp, r_ent, r_grad = torch.load(tmp_path / f"rank{rank}.pt")
        # fp32 on both sides, same operations up to the all-reduce order: 1e-6.
        torch.testing.assert_close(r_lp, lp.detach(), atol=1e-6, rtol=0)
        torch.testing.assert_close(r_ent, ent.detach(), atol=1e-6, rtol=0)
        torch.testing.assert_close(r_grad, full.grad[:, rank * 6 : (rank + 1) * 6], atol=1e-6, rtol=0)
