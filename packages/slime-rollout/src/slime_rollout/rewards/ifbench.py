r"""`--rm-type ifbench`: instruction following graded by IFBench's own checks (Pyatkin et al., 2025, allenai/IFBench).

1.0 when the response follows every instruction the row names, else 0.0, as the original's `compute_ifbench_reward`
scores it with IFBench's `evaluation_lib.test_instruction_following_strict`. A row names its instructions in its
metadata, as IFBench's data writes them:

* `instruction_id_list`: the instruction ids (`"count:word_count_range"`, ...); blanks and nulls are dropped;
* `kwargs`: each instruction's arguments, a list of dicts in the same order (null arguments dropped), or one dict for
  all of them; absent: none;
* `prompt_text`: the prompt the instructions were written for (some checks read it); `record_id`: the row's id.

IFBench's checks are not a package on PyPI, and this version fetches no code at run time (the original `git clone`s
the repository and `pip install`s its requirements when the module is imported): clone
https://github.com/allenai/IFBench, install its requirements and put the clone on `PYTHONPATH`; `--dry-run` and the
launch say so in one line when `evaluation_lib` cannot be imported (`preflight`).

Differences from the original, each where it read bad data silently: reasoning is not graded (the text after the
last `</think>` is; a `<think>` never closed is no answer, 0.0, as every grader here reads it; the original checked
the reasoning too, so "answer in under 50 words" counted the thinking); a row without instructions, a `kwargs` list of
another length than the instructions, or a `kwargs` entry that is not a dict is an error naming what is wrong (the
original scored 0.0, padded the list with copies of its last entry or truncated it, or took `{}`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from slime_core.error_text import preview
from slime_core.registry import Problem
from slime_rollout.rewards.answers import strip_reasoning

__all__ = ["IFBENCH_HINT", "ifbench_reward", "load_evaluation_lib", "preflight"]

IFBENCH_HINT = (
    "clone https://github.com/allenai/IFBench, install its requirements and put the clone on PYTHONPATH (this "
    "version fetches no code at run time; the original cloned it when imported)"
)


def load_evaluation_lib() -> Any:
    """IFBench's `evaluation_lib` module.

    Raises:
        ImportError: it cannot be imported; the message says how to install it (`IFBENCH_HINT`) and why it failed.
    """
    try:
        return importlib.import_module("evaluation_lib")
    except ImportError as e:
        raise ImportError(f"--rm-type ifbench {_missing(e)}") from e


def _missing(error: ImportError) -> str:
    return f"needs IFBench's evaluation_lib ({error}): {IFBENCH_HINT}"


def preflight(cfg: Any) -> list[Problem]:
    """The record's pre-launch check: IFBench's `evaluation_lib` must import (one error saying how to install it)."""
    try:
        importlib.import_module("evaluation_lib")
    except ImportError as e:
        return [Problem(message=_missing(e), exception=ImportError)]
    return []


def _instruction_ids(metadata: Mapping[str, Any]) -> list[str]:
    raw = metadata.get("instruction_id_list")
    if isinstance(raw, str) or not isinstance(raw, list | tuple):
        raise ValueError(
            f"ifbench: metadata['instruction_id_list'] must be a list of instruction ids, got {preview(raw, 60)}"
        )
    ids = [str(entry).strip() for entry in raw if entry is not None and str(entry).strip()]
    if not ids:
        raise ValueError(f"ifbench: metadata['instruction_id_list'] names no instruction ({preview(raw, 60)})")
    return ids


def _kwargs_list(raw: Any, num_instructions: int) -> list[dict[str, Any]]:
    """One dict of arguments per instruction, null values dropped (as IFBench's own preprocessing does)."""
    if raw is None:
        entries: list[Any] = [{} for _ in range(num_instructions)]
    elif isinstance(raw, Mapping):
        entries = [raw] * num_instructions  # one dict for every instruction, as the original reads it
    elif isinstance(raw, list | tuple):
        if len(raw) != num_instructions:
            raise ValueError(
                f"ifbench: metadata['kwargs'] has {len(raw)} entries for {num_instructions} instructions "
                "(one dict per instruction id, in order)"
            )
        entries = list(raw)
    else:
        raise ValueError(f"ifbench: metadata['kwargs'] must be a list of dicts or a dict, got {preview(raw, 60)}")
    kwargs = []
    for i, entry in enumerate(entries):
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            raise ValueError(f"ifbench: metadata['kwargs'][{i}] must be a dict, got {preview(entry, 60)}")
        kwargs.append({key: value for key, value in entry.items() if value is not None})
    return kwargs


def ifbench_reward(response: str, metadata: Mapping[str, Any] | None) -> float:
    """1.0 if the response's answer follows every instruction of `metadata`, else 0.0 (IFBench's strict check).

    Args:
        response: model output; only the text after its reasoning is checked.
        metadata: the sample's metadata with `instruction_id_list` and optionally `kwargs`, `prompt_text`,
            `record_id` (module docstring).

    Raises:
        ValueError: no metadata, no instructions, malformed `kwargs` or a `record_id` that is no integer (the message
            says which).
        ImportError: IFBench's `evaluation_lib` is not importable (`load_evaluation_lib`).
    """
    if not isinstance(metadata, Mapping):
        raise ValueError("ifbench: the sample has no metadata naming its instructions (--metadata-key)")
    ids = _instruction_ids(metadata)
    kwargs = _kwargs_list(metadata.get("kwargs"), len(ids))
    answer = strip_reasoning(response)
    if answer is None:
        return 0.0  # reasoning never closed: no answer
    lib = load_evaluation_lib()
    prompt = "" if metadata.get("prompt_text") is None else str(metadata["prompt_text"])
    try:
        key = int(metadata.get("record_id") or 0)
    except (TypeError, ValueError):
        record_id = preview(metadata["record_id"], 60)
        raise ValueError(f"ifbench: metadata['record_id'] must be an integer, got {record_id}") from None
    example = lib.InputExample(key=key, instruction_id_list=ids, prompt=prompt, kwargs=kwargs)
    result = lib.test_instruction_following_strict(example, {prompt: answer})
    return 1.0 if result.follow_all_instructions else 0.0
