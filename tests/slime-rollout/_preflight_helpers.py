"""Helpers of the preflight tests (registered by conftest.py as module `slime_preflight_helpers`).

`test_preflight.py` (rows, labels, images, engine flags) and `test_preflight_run_shape.py` (response budgets,
eval-only runs, prompt makers, template kwargs, row reward types) build their configs and rows with these.
"""

import json
import pathlib

from slime_core.config import SlimeArgs, parse_args
from slime_rollout.preflight import check


def _cfg(data: pathlib.Path, *extra: str) -> SlimeArgs:
    """A small valid fsdp config over the prompt file `data` (`prompt`/`label` keys), with `extra` flags after it."""
    return parse_args(
        ["--train-backend", "fsdp", "--prompt-data", str(data), "--input-key", "prompt", "--label-key", "label",
         "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--num-rollout",
         "1", "--rollout-max-response-len", "8", "--actor-num-gpus-per-node", "1", *extra]
    )  # fmt: skip


def _errors(cfg: SlimeArgs) -> list[str]:
    """The messages of slime-rollout's preflight errors for `cfg` (notes left out), in the order found."""
    return [p.message for p in check(cfg) if p.severity == "error"]


def _write(path: pathlib.Path, *rows) -> pathlib.Path:
    """Writes `rows` to `path` as JSONL, one row a line; returns `path`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
