"""Rollout dumps and replay (`--save-debug-rollout-data`, `--load-debug-rollout-data`).

A dump is `torch.save({"rollout_id": int, "samples": [Sample.to_dict(), ...]})` at the flag's path
template with `{rollout_id}` substituted (eval rollouts use `eval_{rollout_id}`), written to a temporary
file and renamed so a killed run never leaves a half-written dump.
"""

from __future__ import annotations

import io
import logging
import os
import pathlib
import tempfile
from typing import TYPE_CHECKING

import PIL.Image
import torch

from slime_core.sample import Sample
from slime_core.sample_fields import ORIGINAL_ONLY_FIELDS

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["dump_path", "load_debug_rollout_data", "regroup", "save_debug_rollout_data"]


def dump_path(template: str, rollout_id: int, *, evaluation: bool = False) -> pathlib.Path:
    """The dump file of a rollout.

    Raises:
        ValueError: the template lacks `{rollout_id}`.
    """
    if "{rollout_id}" not in template:
        raise ValueError(f"debug rollout data path {template!r} must contain '{{rollout_id}}'")
    return pathlib.Path(template.format(rollout_id=f"eval_{rollout_id}" if evaluation else rollout_id))


def save_debug_rollout_data(
    cfg: SlimeArgs, rollout_id: int, samples: list[Sample], *, evaluation: bool = False
) -> None:
    """Writes the samples of a rollout to `--save-debug-rollout-data` atomically.

    Args:
        cfg: run config; reads `save_debug_rollout_data` (path template with `{rollout_id}`).
        rollout_id: id of the rollout.
        samples: the flat list of samples.
        evaluation: an eval rollout (file id `eval_{rollout_id}`).

    Raises:
        TypeError: a plugin attribute or metadata value the loader would refuse, naming the sample and the key.
    """
    path = dump_path(cfg.save_debug_rollout_data, rollout_id, evaluation=evaluation)
    _check_loadable(samples)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save({"rollout_id": rollout_id, "samples": [s.to_dict() for s in samples]}, tmp)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    logger.info("saved %d rollout samples to %s", len(samples), path)


def load_debug_rollout_data(cfg: SlimeArgs, rollout_id: int) -> list[Sample]:
    """Reads the dump of `rollout_id` from `--load-debug-rollout-data`.

    With `--load-debug-rollout-data-subsample f` only the first and last `f/2` of the samples are kept.

    Args:
        cfg: run config; reads `load_debug_rollout_data` and `load_debug_rollout_data_subsample`.
        rollout_id: the rollout to replay.

    Returns:
        The samples of the dump, in their saved order.

    Raises:
        FileNotFoundError: no dump for this rollout.
        ValueError: the file is not a rollout dump.
    """
    path = dump_path(cfg.load_debug_rollout_data, rollout_id)
    if not path.exists():
        raise FileNotFoundError(f"--load-debug-rollout-data: no dump for rollout {rollout_id} at {path}")
    # Dumps hold builtin types and tensors (Sample.to_dict), so the safe loader suffices; the original's dumps of
    # vision-language runs also hold its samples' PIL images (`multimodal_inputs`), allowed by name.
    try:
        with torch.serialization.safe_globals([PIL.Image.Image]):
            data = torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle/zip errors of a truncated or foreign file: one line naming it
        raise ValueError(
            f"--load-debug-rollout-data: {path} is not a rollout dump torch can read ({type(e).__name__}: "
            f"{_first_reason(e)})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list | tuple):
        raise ValueError(f"--load-debug-rollout-data: {path} is not a rollout dump (expected a dict with 'samples')")
    samples = []
    for position, record in enumerate(data["samples"]):
        try:
            samples.append(Sample.from_dict(record))
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"--load-debug-rollout-data: {path}: sample {position} does not read back ({e})") from None
    _log_original_only(path, data["samples"])
    _log_plugin_attributes(path, samples)
    fraction = cfg.load_debug_rollout_data_subsample
    if fraction:
        # The original's rule: int(n * f) samples, the first half (rounded down) from the head, the rest from the
        # tail; at least one (the original kept every sample when int(n * f) was 0).
        num_kept = max(int(len(samples) * fraction), 1)
        head = num_kept // 2
        samples = samples[:head] + samples[len(samples) - (num_kept - head) :]
    return samples


def _check_loadable(samples: list[Sample]) -> None:
    """Refuses, before writing, a value `load_debug_rollout_data` could not read back.

    `torch.save` pickles any object, but the reader's safe loader (`weights_only=True`) refuses a class it does not
    know, so a plugin attribute or metadata value holding one made a dump that is written and cannot be replayed.
    The fields `to_dict` writes are builtins and tensors; only plugin attributes and metadata are free-form.
    """
    for sample in samples:
        values = {f"plugin attribute {k!r}": v for k, v in sample.plugin_attributes().items()}
        values.update({f"metadata[{k!r}]": v for k, v in sample.metadata.items()})
        if values and not _safe_to_load(list(values.values())):
            where, value = next((w, v) for w, v in values.items() if not _safe_to_load(v))
            raise TypeError(
                f"--save-debug-rollout-data: sample {sample.index}'s {where} holds a value of type "
                f"{type(value).__name__}, which --load-debug-rollout-data's safe loader refuses; keep plugin "
                "attributes and metadata to builtins and tensors"
            )


def _safe_to_load(value: object) -> bool:
    """Whether `value` survives `torch.save` then `torch.load(weights_only=True)` as the reader loads it."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    try:
        with torch.serialization.safe_globals([PIL.Image.Image]):
            torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001 - the safe loader's refusal (pickle.UnpicklingError), as the reader meets it
        return False
    return True


def _first_reason(error: Exception) -> str:
    """The line of a load error that says what is wrong: the global the safe loader refused, else the first line."""
    lines = str(error).splitlines() or [repr(error)]
    refused = [line.strip() for line in lines if "Unsupported global" in line]
    return refused[0] if refused else lines[0]


def _log_original_only(path: pathlib.Path, records: list) -> None:
    """Logs, once per dump, the original's sample fields this version read past (`ORIGINAL_ONLY_FIELDS`)."""
    counts = {name: sum(name in record for record in records) for name in ORIGINAL_ONLY_FIELDS}
    counts = {name: num for name, num in counts.items() if num}
    if counts:
        logger.info(
            "--load-debug-rollout-data: %s: ignored the original's %s (not kept by this version)",
            path,
            ", ".join(f"{name} on {num} sample(s) ({ORIGINAL_ONLY_FIELDS[name]})" for name, num in counts.items()),
        )


def _log_plugin_attributes(path: pathlib.Path, samples: list[Sample]) -> None:
    """Logs, once per dump, the plugin attributes its samples carried (restored on the samples, as the original)."""
    counts: dict[str, int] = {}
    for sample in samples:
        for name in sample.plugin_attributes():
            counts[name] = counts.get(name, 0) + 1
    if counts:
        logger.info(
            "--load-debug-rollout-data: %s: restored plugin attributes %s",
            path,
            ", ".join(f"{name} on {num} sample(s)" for name, num in sorted(counts.items())),
        )


def regroup(samples: list[Sample]) -> list[list[Sample]]:
    """Splits a flat, index-ordered sample list back into groups of consecutive equal `group_index`."""
    groups: list[list[Sample]] = []
    for sample in samples:
        if groups and sample.group_index is not None and groups[-1][-1].group_index == sample.group_index:
            groups[-1].append(sample)
        else:
            groups.append([sample])
    return groups
