import pytest
import torch

from slime_core.weight_buckets import iter_buckets


def test_buckets_respect_the_cap_and_keep_order():
    named = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 100])]
    buckets = list(iter_buckets(named, bucket_bytes=100))  # 4 bytes per element
    # t0+t1 = 80 B; t2 (120 B) is over the cap alone; t3 then t4 (400 B) alone.
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3"], ["t4"]]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]


def test_buckets_are_lazy():
    pulled = []

    def source():
        for i in range(4):
            pulled.append(i)
            yield f"t{i}", torch.zeros(25, dtype=torch.float32)  # 100 B each

    it = iter_buckets(source(), bucket_bytes=200)
    assert [n for n, _ in next(it)] == ["t0", "t1"]
    assert pulled == [0, 1, 2]  # the third tensor closed the first bucket; nothing beyond was read


def test_bad_bucket_size_names_the_flag():
    with pytest.raises(ValueError, match="--update-weight-buffer-size"):
        list(iter_buckets([("a", torch.zeros(1))], 0))
