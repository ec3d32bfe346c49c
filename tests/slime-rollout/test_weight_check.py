"""Weight-sync content check: sampling the pushed tensors, reading them back, and the comparison tolerance.

Against the running reference engine (fp32): what was pushed reads back exactly; a push the engine did not get is
named. Fake engines check the tolerance (bf16 rounding passes, a 1 % change does not) and HTTP 400 handling.
"""

import asyncio
import collections

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_rollout.client import EngineClient, RolloutClient
from slime_rollout.transport import EngineError
from slime_rollout.weight_check import TRUNCATE_ROWS, TensorSample, check_engines
from slime_rollout.weight_sync import TensorWeightUpdater


def _buckets(n=5):
    return [[(f"t{i}", torch.arange(20.0).reshape(10, 2) + i)] for i in range(n)]


def test_tensor_sample_keeps_k_first_rows_as_copies():
    buckets = _buckets()
    sample = TensorSample(2, seed=0)
    assert [b[0][0] for b in sample.watch(iter(buckets))] == ["t0", "t1", "t2", "t3", "t4"]  # passed through
    assert len(sample.tensors) == 2
    for name, rows in sample.tensors.items():
        i = int(name[1:])
        torch.testing.assert_close(rows, torch.arange(2.0 * TRUNCATE_ROWS).reshape(TRUNCATE_ROWS, 2) + i)
    buckets[0][0][1].zero_()  # the trainer may reuse its buffers: the sample holds copies
    again = TensorSample(2, seed=0)
    list(again.watch(iter(_buckets())))
    assert again.tensors.keys() == sample.tensors.keys()  # same seed, same draw


def test_tensor_sample_is_uniform():
    counts = collections.Counter()
    for seed in range(2000):
        sample = TensorSample(2, seed=seed)
        list(sample.watch(iter(_buckets())))
        counts.update(list(sample.tensors))  # the names
    # Each of 5 tensors is kept with probability 2/5 (reservoir sampling): 800 of 2000, binomial std ~22.
    assert all(abs(counts[f"t{i}"] - 800) < 110 for i in range(5)), counts


class FakeEngine:
    """Answers `get_weights_by_name` from a dict, optionally transformed, or with an HTTP error."""

    def __init__(self, state, transform=lambda t: t, status=None):
        self.url, self.state, self.transform, self.status = "http://fake:1", state, transform, status

    async def get_weights_by_name(self, name, truncate_size=100):
        if self.status is not None:
            raise EngineError(self.url, "/get_weights_by_name", "Get parameter by name failed", self.status)
        return self.transform(self.state[name][:truncate_size]).tolist()


def test_tolerance_accepts_dtype_rounding_and_rejects_real_differences():
    sent = {"w": torch.randn(8, 16, generator=torch.Generator().manual_seed(0))}
    bf16 = FakeEngine(sent, lambda t: t.to(torch.bfloat16).float())
    report = asyncio.run(check_engines([bf16], sent))
    assert report.checked == 1 and report.mismatches == [] and 0 < report.max_abs_diff < 0.02
    off = FakeEngine(sent, lambda t: t * 1.01)
    report = asyncio.run(check_engines([off], sent))
    assert len(report.mismatches) == 1 and "http://fake:1 w:" in report.mismatches[0]
    shape = FakeEngine(sent, lambda t: t.T)
    assert "shape" in asyncio.run(check_engines([shape], sent)).mismatches[0]


def test_engine_that_cannot_read_back_is_counted_not_passed():
    sent = {"w": torch.ones(2, 2)}
    report = asyncio.run(check_engines([FakeEngine(sent, status=400)], sent))
    assert (report.checked, report.unsupported, report.mismatches) == (0, 1, [])
    with pytest.raises(EngineError):
        asyncio.run(check_engines([FakeEngine(sent, status=500)], sent))  # a broken engine is not "unsupported"


@pytest.fixture(scope="module")
def hf_state(tiny_qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    return {k: v.clone() for k, v in model.state_dict().items()}, model.config


def _read_back(url, tensors):
    async def go():
        engine = EngineClient(url, timeout=60)
        try:
            return await check_engines([engine], tensors)
        finally:
            await engine.aclose()

    return asyncio.run(go())


def test_reference_engine_reads_back_pushed_tensors(reference_engine, hf_state, tiny_qwen3_dir):
    from slime_core.config import SlimeArgs

    url = reference_engine.urls[0]
    original, config = hf_state
    g = torch.Generator().manual_seed(5)
    new = {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    if config.tie_word_embeddings:
        del new["lm_head.weight"]  # one tensor on the engine: pushing both would overwrite the first (trainers skip it)
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})
    updater = TensorWeightUpdater(cfg, RolloutClient([url]), load_format=None)
    try:
        sample = TensorSample(len(new), seed=1)  # k = all tensors: every one is read back
        updater.update(sample.watch(iter([list(new.items())])), "7")
        report = _read_back(url, sample.tensors)
        assert report.checked == len(sample.tensors) and report.mismatches == [] and report.max_abs_diff == 0.0
        # The engine missed an update: it still holds `new`, the trainer believes it pushed `original`.
        stale = TensorSample(3, seed=2)
        list(stale.watch(iter([[(k, v) for k, v in original.items() if k in new]])))
        report = _read_back(url, stale.tensors)
        assert len(report.mismatches) == 3 and all(url in m for m in report.mismatches)
        # Unknown names are HTTP 400 as in SGLang; a tied lm_head reads the embedding.
        with pytest.raises(EngineError, match="400"):
            asyncio.run(EngineClient(url).get_weights_by_name("nope"))
        if config.tie_word_embeddings:
            rows = asyncio.run(EngineClient(url).get_weights_by_name("lm_head.weight", truncate_size=2))
            torch.testing.assert_close(torch.tensor(rows), new["model.embed_tokens.weight"][:2])
    finally:
        restore = RolloutClient([url]).broadcast(
            "update_weights_from_disk", model_path=str(tiny_qwen3_dir), weight_version="default"
        )
        asyncio.run(restore)
