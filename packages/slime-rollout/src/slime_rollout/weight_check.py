"""Weight-sync content check: after a push, read a sample of tensors back from the engines and compare.

A version string says an update arrived, not that the engine holds the right numbers: a name mapped to the
wrong parameter, a transposed or mis-sharded tensor, an update the engine dropped, or a loader that skipped a
tensor all pass the version check and silently train the policy against a different sampler. Here a few
tensors of the push are kept (their first rows, `TensorSample`) while the buckets stream past, and after the
push every engine is asked for the same rows with SGLang's `/get_weights_by_name` (`{"name", "truncate_size"}`
→ the first `truncate_size` entries along dim 0 as float32 lists; the reference engine serves the same).

Which tensors: a uniform sample of the push (reservoir sampling, one pass, `k` slots), seeded by the sync
index so that successive checks cover different tensors. Tolerance: the engine may store another dtype than the
one sent (bf16 weights of an fp32 push), whose rounding error is at most 2^-9 relative; a value counts as equal
within `atol + rtol·|sent|` with `rtol = 2^-7`. Wrong tensors differ by far more; a one-step-stale tensor
(lr-sized differences) is below that resolution, which the version check and the first-step log-prob gate
cover.

SGLang implements `get_weights_by_name` per model class (Llama-family models do; others answer HTTP 400):
such a tensor is counted as `unsupported` and logged once, never taken for a pass.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from slime_rollout.transport import EngineError

logger = logging.getLogger(__name__)

__all__ = ["ATOL", "RTOL", "TRUNCATE_ROWS", "TensorSample", "WeightCheckReport", "WeightSyncMismatch", "check_engines"]

# Rows (entries along dim 0) read back per tensor: small enough for one HTTP reply of a wide layer.
TRUNCATE_ROWS = 8
RTOL = 2.0**-7
ATOL = 1e-6

Bucket = list[tuple[str, torch.Tensor]]


class WeightSyncMismatch(RuntimeError):
    """An engine holds other values than the trainer pushed; the message names engine, tensor and difference."""


class TensorSample:
    """Keeps the first rows of `k` tensors drawn uniformly from a stream of buckets (reservoir sampling).

    Args:
        k: how many tensors to keep.
        seed: seeds the draw (the sync index, so successive checks see different tensors).
        rows: rows (entries along dim 0) kept per tensor, as `/get_weights_by_name`'s `truncate_size`.

    Example:
        >>> sample = TensorSample(k=2, seed=0)
        >>> buckets = [[("a", torch.ones(3)), ("b", torch.zeros(2, 2))], [("c", torch.arange(4.0))]]
        >>> len(list(sample.watch(iter(buckets)))), sorted(sample.tensors)  # doctest: +SKIP
        (2, ['a', 'c'])
    """

    def __init__(self, k: int, *, seed: int, rows: int = TRUNCATE_ROWS):
        self.k, self.rows = k, rows
        self._rng = random.Random(seed)
        self._seen = 0
        self.tensors: dict[str, torch.Tensor] = {}

    def _offer(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.dim() == 0:
            return  # no rows to read back
        self._seen += 1
        if len(self.tensors) < self.k:
            slot = None
        else:
            j = self._rng.randrange(self._seen)
            if j >= self.k:
                return
            slot = list(self.tensors)[j]
        if slot is not None:
            del self.tensors[slot]
        # float32 on CPU: what the engine answers; a copy, since buckets are freed after sending.
        self.tensors[name] = tensor.detach()[: self.rows].to("cpu", torch.float32, copy=True)

    def watch(self, buckets: Iterable[Bucket]) -> Iterator[Bucket]:
        """Yields the buckets unchanged, sampling their tensors on the way."""
        for bucket in buckets:
            for name, tensor in bucket:
                self._offer(name, tensor)
            yield bucket


@dataclasses.dataclass(kw_only=True)
class WeightCheckReport:
    """Result of `check_engines`.

    Attributes:
        checked: (engine, tensor) pairs compared.
        unsupported: pairs the engine could not read back (its model class lacks `get_weights_by_name`).
        mismatches: one line per (engine, tensor) pair outside tolerance.
        max_abs_diff: largest |engine - trainer| over the compared values.
    """

    checked: int = 0
    unsupported: int = 0
    mismatches: list[str] = dataclasses.field(default_factory=list)
    max_abs_diff: float = 0.0

    def metrics(self) -> dict[str, float]:
        """`weight_check/*` metrics of the report."""
        return {
            "weight_check/tensors_checked": float(self.checked),
            "weight_check/tensors_unsupported": float(self.unsupported),
            "weight_check/mismatches": float(len(self.mismatches)),
            "weight_check/max_abs_diff": self.max_abs_diff,
        }


def _compare(url: str, name: str, sent: torch.Tensor, answer: Any, report: WeightCheckReport) -> None:
    got = torch.tensor(answer, dtype=torch.float32)
    if tuple(got.shape) != tuple(sent.shape):
        report.mismatches.append(
            f"{url} {name}: engine rows have shape {tuple(got.shape)}, trainer pushed {tuple(sent.shape)}"
        )
        return
    diff = (got - sent).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    report.max_abs_diff = max(report.max_abs_diff, worst)
    bad = diff > ATOL + RTOL * sent.abs()
    if bool(bad.any()):
        where = tuple(int(i) for i in torch.nonzero(bad)[0])
        report.mismatches.append(
            f"{url} {name}: {int(bad.sum())} of {bad.numel()} values differ (first at {where}: engine "
            f"{float(got[where]):.6g}, trainer {float(sent[where]):.6g}; max |diff| {worst:.3g})"
        )


async def check_engines(engines: Iterable[Any], tensors: dict[str, torch.Tensor]) -> WeightCheckReport:
    """Reads `tensors`' rows back from every engine and compares them with what was pushed.

    Args:
        engines: `slime_rollout.client.EngineClient`s (anything with `url` and `get_weights_by_name`).
        tensors: name → first rows as pushed (float32, CPU), e.g. `TensorSample.tensors`.

    Returns:
        The report (mismatches are listed, not raised: the caller decides).

    Raises:
        EngineError: an engine failed in another way than refusing the read-back (HTTP 400).
    """
    report = WeightCheckReport()
    for engine in engines:
        for name, sent in tensors.items():
            try:
                answer = await engine.get_weights_by_name(name, truncate_size=int(sent.shape[0]))
            except EngineError as exc:
                if exc.status_code != 400:
                    raise
                report.unsupported += 1
                logger.warning("weight check: %s cannot read back %s (%s); not compared", engine.url, name, exc)
                continue
            report.checked += 1
            _compare(engine.url, name, sent, answer, report)
    return report
