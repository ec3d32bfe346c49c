"""Weight-sync content check: after a push, every engine's checksums of what it holds vs the trainer's of what it sent.

A version string says an update arrived, not that the engine holds the right numbers: a name mapped to the
wrong parameter, a transposed or mis-sharded tensor, an update the engine dropped, or a loader that skipped a
tensor all pass the version check and silently train the policy against a different sampler.

How: SGLang's `POST /weights_checker {"action": "checksum"}` answers a checksum of every parameter it holds, under
its own names (fused `qkv_proj` / `gate_up_proj`, a MoE layer's experts as `experts.w13_weight` / `w2_weight`; the
reference engine answers the same). While the buckets of a
push stream past, `PushChecksums` draws `k` of the engine's parameters (reservoir sampling over the engine names
the push touches, seeded by the sync index so that successive checks cover different tensors), assembles their
parts and computes the same checksum (`slime_rollout.engines.weight_checksum`) of the bytes the engine should now hold
(cast to its dtype). `check_engines` then asks every engine and compares: equal bytes or a mismatch, no tolerance.

MoE experts: the trainer pushes one matrix per expert (`experts.{e}.gate_proj.weight`, ...); given the run's expert
count (`num_experts`, from `--hf-checkpoint`'s config.json) they are the parts of SGLang's `w13_weight` (2E parts:
gate_0, up_0, gate_1, ...) and `w2_weight` (E parts), so a drawn expert parameter is compared whole (a swapped
expert or a swapped gate/up pair is a mismatch). Without it they are all `unmatched`. The draw holds the parts of a
drawn parameter until its last part arrives: a drawn `w13_weight` is a copy (in the engine's dtype) of the gate and
up matrices of all its layer's experts, so the check's memory is up to `k` such parameters.

SGLang's `/get_weights_by_name` is not used: it is implemented per model class, and not for Qwen3 (HTTP 400 for
every name in 0.5.16). A check that compares nothing is not a pass: the caller stops the run (`WeightCheckEmpty`).

Tensor parallelism: an engine with TP > 1 answers one checksum set per rank over its shards; only parameters that
every rank holds whole (norms) are compared there, the sharded ones are counted (`sharded`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import random
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from slime_core.config.architecture import config_num_experts
from slime_core.config.sglang_flags import sglang_fields
from slime_core.error_text import preview
from slime_core.extensions import engine_spec
from slime_core.fp8 import pair_fp8
from slime_rollout.engines.transport import EngineError
from slime_rollout.engines.weight_checksum import (
    Part,
    hash_dtype,
    hash_parts,
    parts_checksum,
    sglang_param_name,
    strip_wrappers,
)

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "checkpoint_num_experts",
    "engine_weight_dtype",
    "PushChecksums",
    "WeightCheckEmpty",
    "WeightCheckReport",
    "WeightSyncMismatch",
    "check_engines",
    "engine_checksums",
]

Bucket = list[tuple[str, torch.Tensor]]
# Parameters every TP rank holds whole (SGLang replicates norms): comparable on a TP > 1 engine.
_REPLICATED = ("norm.weight", "layernorm.weight", "norm.bias")


class WeightSyncMismatch(RuntimeError):
    """An engine holds other values than the trainer pushed; the message names engine, tensor and checksums."""


class WeightCheckEmpty(RuntimeError):
    """A weight check compared no tensor (no checksum endpoint, or no pushed name the engine holds)."""


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16, "float32": torch.float32,
           "float": torch.float32}  # fmt: skip


def engine_weight_dtype(cfg: SlimeArgs) -> torch.dtype:
    """The dtype the run's engines hold their weights in (what a pushed tensor is cast to before hashing).

    `--sglang-dtype`, else the engine record's `default_dtype` (SGLang: "auto"; the reference engine: float32).
    "auto" is resolved from the checkpoint's config as the record says (`auto_dtype_as_stored`): the config's
    dtype, which SGLang serves in float16 when it is float32 (bfloat16 for Gemma;
    `configs/model_config.py:_get_and_verify_dtype`) and the reference engine keeps as stored.

    Raises:
        ValueError: a dtype name no engine knows.
        UnknownNameError: `cfg.rollout_engine` is not registered.
    """
    spec = engine_spec(cfg)
    extra = sglang_fields(cfg.sglang_args)
    name = str(extra.get("dtype", spec.default_dtype)).lower()
    if name == "auto":
        config_file = pathlib.Path(str(cfg.hf_checkpoint)) / "config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        if name == "float32" and not spec.auto_dtype_as_stored:
            name = "bfloat16" if str(config.get("model_type", "")).startswith("gemma") else "float16"
    if name not in _DTYPES:
        raise ValueError(f"--sglang-dtype {name!r}: not one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def checkpoint_num_experts(hf_checkpoint: str | pathlib.Path) -> int | None:
    """Routed experts per MoE layer of the checkpoint the engines serve (`config_num_experts` of its config.json).

    Args:
        hf_checkpoint: `--hf-checkpoint`, a local HF directory.

    Returns:
        The expert count; None for a dense model, when the directory has no config.json, or for a model with
        DeepSeek-style shared experts (`n_shared_experts`), which SGLang may fuse into the same `w13_weight` /
        `w2_weight` as extra experts (`num_fused_shared_experts`), a layout the check does not model. Then expert
        tensors are counted as unmatched names, which the check's log line reports.

    Raises:
        ValueError: config.json is not valid JSON (names the file).
    """
    config_file = pathlib.Path(str(hf_checkpoint)) / "config.json"
    if not config_file.is_file():
        return None
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if text.get("n_shared_experts") or config.get("n_shared_experts"):
        logger.warning(
            "weight check: %s has shared experts (n_shared_experts), which SGLang may fuse into experts.w13_weight: "
            "expert tensors are not compared (counted as unmatched names)",
            config_file,
        )
        return None
    return config_num_experts(config)


def _wrapper_free(checksums: dict[str, str]) -> dict[str, str]:
    return {strip_wrappers(name): value for name, value in checksums.items()}


class PushChecksums:
    """Checksums of `k` engine parameters drawn from a push, computed as the buckets stream past.

    Args:
        k: engine parameters to draw (`--check-weight-sync-tensors`).
        seed: seeds the draw (the sync index, so successive checks see different tensors).
        dtype: the dtype the engine holds its weights in (the pushed tensors are cast to it before hashing).
        engine_names: the parameter names the engine holds (from `engine_checksums` before the push); a pushed
            tensor whose SGLang name is not among them is counted in `unmatched`, not drawn. None: no filter.
        fp32_params: the engine holds embeddings and norms in float32 (`--true-on-policy-mode`; `hash_dtype`).
        num_experts: routed experts per MoE layer (per-expert tensors are parts of SGLang's `w13_weight` /
            `w2_weight`: `sglang_param_name`); None for a dense model.

    Attributes:
        checksums: `{SGLang name: 16 hex digits}` of the drawn parameters whose parts all arrived.
        unmatched: pushed tensors the engine does not hold under SGLang's name (one example in `unmatched_example`).
        incomplete: drawn fused parameters with parts missing from the push.
    """

    def __init__(
        self,
        k: int,
        *,
        seed: int,
        dtype: torch.dtype,
        engine_names: Iterable[str] | None = None,
        fp32_params: bool = False,
        num_experts: int | None = None,
    ) -> None:
        self.k, self.dtype, self.fp32_params, self.num_experts = k, dtype, fp32_params, num_experts
        self.engine_names = None if engine_names is None else {strip_wrappers(n) for n in engine_names}
        self._rng = random.Random(seed)
        self._seen: set[str] = set()
        self._drawn: dict[str, dict[int, Part]] = {}  # engine name → parts held so far
        self._num_parts: dict[str, int] = {}
        self.checksums: dict[str, str] = {}
        self.unmatched = 0
        self.unmatched_example = ""
        self._frozen = False

    def _offer(self, hf_name: str, item: Part) -> None:
        """Draws or skips one pushed tensor (an FP8 weight comes as `(weight, scale)`: `pair_fp8`)."""
        name, index, count = sglang_param_name(hf_name, num_experts=self.num_experts)
        if self.engine_names is not None and name not in self.engine_names:
            self.unmatched += 1
            self.unmatched_example = self.unmatched_example or f"{hf_name} (as {name})"
            return
        if name not in self._seen:  # the draw happens at a parameter's first part (reservoir sampling)
            self._seen.add(name)
            if len(self._drawn) + len(self.checksums) < self.k:
                self._drawn[name] = {}
            else:
                j = self._rng.randrange(len(self._seen))
                if j >= self.k:
                    return
                victim = sorted([*self._drawn, *self.checksums])[j]
                self._drawn.pop(victim, None)
                self.checksums.pop(victim, None)
                self._drawn[name] = {}
            self._num_parts[name] = count
        parts = self._drawn.get(name)
        if parts is None:
            return
        # A copy (unquantized: in the engine's dtype): the trainer may reuse the bucket's memory after sending it.
        if isinstance(item, tuple):
            parts[index] = (item[0].detach().clone(), item[1].detach().clone())
        else:
            dtype = hash_dtype(name, item, self.dtype, fp32_params=self.fp32_params)
            parts[index] = item.detach().to(dtype, copy=True)
        if len(parts) == count:
            del self._drawn[name]
            self.checksums[name] = hash_parts(
                name, [parts[i] for i in range(count)], self.dtype, fp32_params=self.fp32_params
            )

    @property
    def incomplete(self) -> list[str]:
        """Drawn fused parameters whose parts did not all arrive (a push that skipped a part)."""
        return sorted(self._drawn)

    @classmethod
    def from_checkpoint(
        cls,
        hf_dir: str | pathlib.Path,
        k: int,
        *,
        seed: int,
        dtype: torch.dtype,
        engine_names: Iterable[str] | None,
        num_experts: int | None = None,
    ) -> PushChecksums:
        """Checksums of `k` engine parameters drawn from an HF checkpoint's safetensors (read: only those drawn).

        For a LoRA run, whose pushes hold the adapter only: the engine's base weights are compared with the
        checkpoint the trainer loaded its base from. `watch` then passes the buckets through untouched.
        `num_experts` as in the constructor.

        Raises:
            FileNotFoundError: no `*.safetensors` in `hf_dir`.
            ValueError: a per-expert tensor whose expert index is not below `num_experts`.
        """
        from safetensors import safe_open

        files = sorted(pathlib.Path(hf_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{hf_dir}: no *.safetensors to compare the engine's base weights with")
        checker = cls(k, seed=seed, dtype=dtype, engine_names=engine_names, num_experts=num_experts)
        checker._frozen = True
        where: dict[str, pathlib.Path] = {}
        groups: dict[str, dict[int, str]] = {}
        device = "cuda" if torch.cuda.is_available() else "cpu"  # hashing is ~40 passes over the words
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 - safe_open is no mapping
                    name, index, count = sglang_param_name(key, num_experts=num_experts)
                    if checker.engine_names is not None and name not in checker.engine_names:
                        checker.unmatched += 1
                        checker.unmatched_example = checker.unmatched_example or f"{key} (as {name})"
                        continue
                    groups.setdefault(name, {})[index] = key
                    checker._num_parts[name] = count
                    where[key] = file
        drawn = checker._rng.sample(sorted(groups), min(k, len(groups)))
        wanted = {key for name in drawn for key in groups[name].values()}
        tensors: dict[str, torch.Tensor] = {}
        for file in files:  # each file opened once, only the drawn tensors read
            with safe_open(str(file), framework="pt") as f:
                for key in wanted:
                    if where[key] == file:
                        tensors[key] = f.get_tensor(key).to(device, dtype)
        for name in drawn:
            if len(groups[name]) != checker._num_parts[name]:
                checker._drawn[name] = {}  # reported as incomplete
                continue
            parts = [tensors[groups[name][index]] for index in range(checker._num_parts[name])]
            checker.checksums[name] = parts_checksum(parts)
        return checker

    def watch(self, buckets: Iterable[Bucket]) -> Iterator[Bucket]:
        """Yields the buckets unchanged, hashing the drawn parameters on the way (not when `from_checkpoint`)."""
        if self._frozen:
            yield from buckets
            return
        for bucket in buckets:
            for name, item in pair_fp8(bucket):
                if isinstance(item, tuple) or item.dim() > 0:
                    self._offer(name, item)
            yield bucket


@dataclasses.dataclass(kw_only=True)
class WeightCheckReport:
    """Result of `check_engines`.

    Attributes:
        checked: (engine, tensor) pairs compared.
        unsupported: engines without a checksum endpoint (`/weights_checker` answered 400/404).
        sharded: (engine, tensor) pairs not compared because a TP > 1 engine holds the tensor in shards.
        missing: (engine, tensor) pairs the engine did not list at all.
        blind: engines that listed none of the drawn tensors (their check compared nothing; the drawn names come from
            the first engine's list, so another engine holding none of them serves another model or naming).
        mismatches: one line per (engine, tensor) pair whose checksums differ.
    """

    checked: int = 0
    unsupported: int = 0
    sharded: int = 0
    missing: int = 0
    blind: list[str] = dataclasses.field(default_factory=list)
    mismatches: list[str] = dataclasses.field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """`weight_check/*` metrics of the report."""
        return {
            "weight_check/tensors_checked": float(self.checked),
            "weight_check/tensors_unsupported": float(self.unsupported),
            "weight_check/tensors_sharded": float(self.sharded),
            "weight_check/tensors_missing": float(self.missing),
            "weight_check/mismatches": float(len(self.mismatches)),
        }


async def engine_checksums(engine: Any) -> list[dict[str, str]] | None:
    """One engine's checksums, one dict per TP rank (`/weights_checker {"action": "checksum"}`).

    Args:
        engine: a `slime_rollout.engines.engine_client.EngineClient` (anything with `url` and `request`).

    Returns:
        `[{SGLang name: 16 hex digits}, ...]`, wrapper-free names (`strip_wrappers`); None when the engine has no
        checksum endpoint (HTTP 400 or 404: SGLang before 0.5.16, or a server without it).

    Raises:
        EngineError: the engine failed in another way, or its reply holds no rank or a rank without a `checksums`
            object (an empty `ranks` compared as equal every tensor it was asked about).
    """
    try:
        reply = await engine.request("POST", "/weights_checker", {"action": "checksum"})
    except EngineError as exc:
        if exc.status_code in (400, 404):
            logger.warning("weight check: %s has no checksum endpoint (%s)", engine.url, exc)
            return None
        raise
    ranks = reply.get("ranks") if isinstance(reply, dict) else None
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        raise EngineError(engine.url, "/weights_checker", f"reply has no per-rank checksums: {preview(reply)}")
    for i, rank in enumerate(ranks):
        if not isinstance(rank.get("checksums"), dict):
            raise EngineError(engine.url, "/weights_checker", f"ranks[{i}] has no checksums object: {preview(rank)}")
    return [_wrapper_free(rank["checksums"]) for rank in ranks]


async def check_engines(engines: Iterable[Any], expected: dict[str, str]) -> WeightCheckReport:
    """Compares every engine's checksums with the trainer's for the drawn parameters.

    Args:
        engines: `slime_rollout.engines.engine_client.EngineClient`s.
        expected: `{SGLang name: checksum}` of what was pushed (`PushChecksums.checksums`).

    Returns:
        The report (mismatches are listed, not raised: the caller decides).

    Raises:
        EngineError: an engine failed in another way than lacking the endpoint.
    """
    report = WeightCheckReport()
    for engine in engines:
        ranks = await engine_checksums(engine)
        if ranks is None:
            report.unsupported += 1
            continue
        missing_before = report.missing
        for name, want in expected.items():
            got = [rank.get(name) for rank in ranks]
            if any(g is None for g in got):
                report.missing += 1
                continue
            if len(ranks) > 1 and not name.endswith(_REPLICATED):
                report.sharded += 1
                continue
            report.checked += 1
            bad = [i for i, g in enumerate(got) if g != want]
            if bad:
                report.mismatches.append(
                    f"{engine.url} {name}: engine checksum {got[bad[0]]} (TP rank {bad[0]}), expected {want}"
                )
        if expected and report.missing - missing_before == len(expected):
            report.blind.append(engine.url)
    return report
