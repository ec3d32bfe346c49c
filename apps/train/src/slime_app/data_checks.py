"""Row checks of the prompt data that preflight runs before anything starts (`check_prompt_rows`).

Each bad row is one error naming the flag, the file and where the row is in the file (its JSONL line, 1-based with
blank lines counted; its Parquet row index, 0-based; see `slime_rollout.data.source.PromptRows`), so a
run never discovers a missing key, an empty prompt or a null label in the middle of its rollouts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slime_core.config import SlimeArgs
from slime_rollout.data.source import PromptRows

__all__ = ["LABEL_GRADERS", "check_prompt_rows"]

# Built-in reward types that grade against the label (a null label is an error for them); gpqa may take its
# answer from metadata["correct_letter"] instead.
LABEL_GRADERS = ("math", "deepscaler", "dapo", "f1", "gpqa")


def _empty_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        return not any(isinstance(m, Mapping) and str(m.get("content") or "").strip() for m in prompt)
    return prompt is None


def _label_required(cfg: SlimeArgs, row: Mapping[str, Any]) -> bool:
    if cfg.custom_rm_path:
        return False  # a custom reward decides what it needs
    metadata = row.get(cfg.metadata_key) if cfg.metadata_key else None
    metadata = metadata if isinstance(metadata, Mapping) else {}
    rm_type = str(metadata.get("rm_type") or cfg.rm_type or "").removeprefix("boxed_")
    if rm_type == "gpqa" and metadata.get("correct_letter"):
        return False
    return rm_type in LABEL_GRADERS


def check_prompt_rows(rows: Sequence[Mapping[str, Any]], cfg: SlimeArgs, *, where: str) -> None:
    """Checks every row of a prompt file before the run starts.

    The `--input-key` must be there and not empty; the `--label-key` must be there and, for the built-in graders
    that compare with it, not null.

    Args:
        rows: the rows of one data file (`load_prompt_rows`: named by line or row index; plain rows: "row N").
        cfg: run config; reads `input_key`, `label_key`, `metadata_key`, `rm_type`, `custom_rm_path`.
        where: `"{flag} {path}"` for the messages.

    Raises:
        ValueError: naming `where`, the row and the problem.
    """
    located = PromptRows.of(rows)
    for position, row in zip(located.positions, located, strict=True):
        at = f"{where} {located.unit} {position}"
        if cfg.input_key not in row:
            raise ValueError(f"{at}: no --input-key {cfg.input_key!r} (keys: {sorted(row)})")
        if _empty_prompt(row[cfg.input_key]):
            raise ValueError(f"{at}: empty prompt in --input-key {cfg.input_key!r}")
        if cfg.label_key:
            if cfg.label_key not in row:
                raise ValueError(f"{at}: no --label-key {cfg.label_key!r} (keys: {sorted(row)})")
            if row[cfg.label_key] is None and _label_required(cfg, row):
                raise ValueError(
                    f"{at}: null --label-key {cfg.label_key!r}, which --rm-type "
                    f"{cfg.rm_type or 'metadata rm_type'} grades against"
                )
