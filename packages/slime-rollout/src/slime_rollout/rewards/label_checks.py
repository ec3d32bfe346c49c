"""Whether a prompt row's label fits the reward that grades it: the reward's record, the label's type and value.

Read before launch by `slime_rollout.preflight.check_prompt_rows`, row by row, from the reward records of
`slime_core.extensions.REWARDS` (`grades_label`, `label_in_metadata`, `label_is_value`, `reads_box`), so a
package's own reward declares what its labels need in its record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slime_core.extensions import REWARDS, RewardSpec
from slime_core.registry import UnknownNameError
from slime_rollout.rewards import row_rm_type
from slime_rollout.rewards.costly import SYMBOLIC_MAX_CHARS
from slime_rollout.rewards.math_utils import extract_label_answer

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["check_label_type", "check_label_value", "label_required", "row_reward"]


def row_reward(cfg: SlimeArgs, metadata: Mapping[str, Any], at: str) -> tuple[str, RewardSpec | None]:
    """The reward that scores a row and its record, looked up once for all of the row's checks.

    Args:
        cfg: reads `rm_type` and `custom_rm_path`.
        metadata: the row's metadata (`row_metadata`); its `rm_type` overrides `--rm-type`.
        at: names the row in errors.

    Returns:
        `(rm_type, spec)`: the row's reward type as written (`boxed_` prefix kept) and its record, None with a
        `--custom-rm-path` (a custom reward decides what it needs) or a `--rm-type` that is not registered here.

    Raises:
        ValueError: the row's own `metadata["rm_type"]` is not a registered reward (else the rollout fails at its
            first sample); naming the row and the registered names.
    """
    rm_type = row_rm_type(metadata, cfg.rm_type)
    if cfg.custom_rm_path:
        return rm_type, None
    try:
        return rm_type, REWARDS.get(rm_type.removeprefix("boxed_"))
    except UnknownNameError:
        if row_rm_type(metadata, None):
            raise ValueError(
                f"{at}: metadata rm_type {rm_type!r} is not a registered reward function (registered: "
                f"{', '.join(REWARDS.names())}; each also as boxed_<name>)"
            ) from None
        return rm_type, None


def label_required(spec: RewardSpec | None, metadata: Mapping[str, Any]) -> bool:
    """Whether a row needs a label: its reward's record `grades_label`, and its metadata has no stand-in for it.

    The stand-in is the record's `label_in_metadata` key (gpqa's `correct_letter`), so a package's reward declares
    it in its record as the built-ins do (gpqa was special-cased here by name).

    Args:
        spec: the row's reward record (`row_reward`); None: nothing is required.
        metadata: the row's metadata (`row_metadata`).
    """
    if spec is None:
        return False
    if spec.label_in_metadata and metadata.get(spec.label_in_metadata) not in (None, ""):
        return False  # gpqa's correct_letter may be the index 0
    return spec.grades_label


def check_label_type(spec: RewardSpec | None, label: Any, at: str, label_flag: str, label_key: str | None) -> None:
    """The label of a reward whose record says `label_is_value` is text or a number, not a dict or a list.

    Such a grader compares a dict or list label as its Python text ("{'answer': '5'}"), which no response equals:
    every sample of the row scored 0.

    Raises:
        ValueError: naming the row, the flag and the label's type.
    """
    if spec is None or not spec.label_is_value or not isinstance(label, Mapping | list | tuple):
        return
    raise ValueError(
        f"{at}: {label_flag} {label_key!r} holds a {type(label).__name__} ({str(label)[:60]}), but --rm-type "
        f"{spec.name} grades one answer (text or a number); point {label_flag} at the answer itself"
    )


def check_label_value(spec: RewardSpec, label: Any, rm_type: str, at: str, label_flag: str, label_key: str) -> None:
    r"""A label the row's reward grades against holds an answer: not empty text, not NaN or infinity, not bytes.

    For the graders that read a final answer (math, deepscaler, dapo) that answer must be there and at most
    `costly.SYMBOLIC_MAX_CHARS` long: a worked solution without `#### x` or a box is all "answer" to them.

    Each was accepted and graded as its text ("", "nan" or "b'5'": a missing value or a binary column written by
    a data tool), which no real answer equals: every sample of the row scored 0 and the run learned from rows that
    teach nothing, with no word about them. (A bool is an answer: `\boxed{True}` equals the label `true`.) The
    caller checks that the row's reward grades against its label.

    Raises:
        ValueError: naming the row, the flag and the value.
    """
    if isinstance(label, str) and not label.strip():
        problem = f"an empty label {label!r}"
    elif isinstance(label, float) and not math.isfinite(label):
        problem = f"{label} (a JSON NaN/Infinity), not an answer"
    elif isinstance(label, bytes | bytearray):
        problem = f"bytes {label[:40]!r} (a binary Parquet column; store it as strings), not text"
    elif spec.reads_box and isinstance(label, str) and not (answer := extract_label_answer(label)):
        # "... #### " or "\boxed{}": the answer these graders (math, deepscaler, dapo) take from the label is empty.
        problem = f"{label[-60:]!r}, whose final answer ('#### x' or its last box) is empty"
    elif spec.reads_box and isinstance(label, str) and len(answer) > SYMBOLIC_MAX_CHARS:
        # A worked solution without `#### x` or a box (`--label-key` on the explanation column) is all "answer":
        # no boxed answer equals it, so every sample scored 0; and each grade read it whole (10 MB: 5-9 s inline).
        problem = (
            f"a final answer of {len(answer):,} characters ({answer[:40]!r}...: not the answer column? a worked "
            f"solution needs its answer after '####' or in a final \\boxed{{}}; answers are compared up to "
            f"{SYMBOLIC_MAX_CHARS:,})"
        )
    else:
        return
    raise ValueError(f"{at}: {label_flag} {label_key!r} holds {problem}, which --rm-type {rm_type} grades against")
