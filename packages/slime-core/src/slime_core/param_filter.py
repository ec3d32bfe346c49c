"""`--only-train-params-name-list` / `--freeze-params-name-list`: which parameters the trainer freezes.

Patterns are Python regular expressions matched with `re.search` against the backend's own parameter names
(Hugging Face names on FSDP, e.g. `model.layers.0.mlp.up_proj.weight`; megatron-core names on Megatron,
e.g. `decoder.layers.0.mlp.linear_fc1.weight`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["frozen_parameter_names"]


def frozen_parameter_names(names: Iterable[str], cfg: SlimeArgs) -> set[str]:
    """Names of the parameters to freeze (`requires_grad=False`) under the two flags.

    Args:
        names: all parameter names of the model.
        cfg: reads `only_train_params_name_list` (None: train all; else freeze every parameter matching none
            of the patterns) and `freeze_params_name_list` (None; freeze every parameter matching one).

    Returns:
        The names to freeze (empty when neither flag is set).

    Raises:
        ValueError: both flags given, a pattern that is not a valid regex or matches no parameter (a typo would
            otherwise silently train everything), or every parameter frozen.
    """
    only = cfg.only_train_params_name_list
    freeze = cfg.freeze_params_name_list
    if only and freeze:
        raise ValueError("--only-train-params-name-list and --freeze-params-name-list are mutually exclusive")
    if not (only or freeze):
        return set()
    flag = "--only-train-params-name-list" if only else "--freeze-params-name-list"
    names = list(names)
    matched: set[str] = set()
    for pattern in only or freeze:
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"{flag}: {pattern!r} is not a valid regular expression ({e})") from None
        hits = {n for n in names if regex.search(n)}
        if not hits:
            raise ValueError(f"{flag}: {pattern!r} matches no parameter (e.g. {names[0]!r})")
        matched |= hits
    frozen = set(names) - matched if only else matched
    if len(frozen) == len(names):
        raise ValueError(f"{flag}: every parameter would be frozen")
    logger.info("%s: %d of %d parameter tensors frozen", flag, len(frozen), len(names))
    return frozen
