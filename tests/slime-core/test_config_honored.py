"""No flag is silently ignored: every `SlimeArgs` field is read by some code, or rejected when set.

A field passes when (1) it is in `UNSUPPORTED` (setting it is a one-line `ConfigError`), or (2) its name occurs
as a word in the Python sources under `packages/*/src` or `apps/` outside `slime_core/config/`, or (3) code
reaches it through a dynamic `getattr(args, f"<prefix>{name}")` helper called with a string literal (resolved
from the sources below, e.g. `pick("top_p")` → `eval_top_p`, `rollout_top_p`), or (4) it is in
`CONSUMED_BY_VALIDATION`: read only by `slime_core.config` to derive or check another field that code reads.
"""

from __future__ import annotations

import ast
import pathlib
import re

from slime_core.config import SlimeArgs
from slime_core.config.base import field_to_flag
from slime_core.config.unsupported import UNSUPPORTED

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "packages" / "slime-core" / "src" / "slime_core" / "config"

# field -> what reads it inside slime_core.config (one line each).
CONSUMED_BY_VALIDATION = {
    "critic_num_gpus_per_node": "checked: the critic's own GPUs must be as many as the actor's (placement uses those)",
    "custom_config_path": "config/cli.py loads the YAML into the fields and args.custom_config",
    "dump_details": "derives --save-debug-rollout-data",
    "lora_exclude_modules": "taken out of --lora-target-modules (config/validation_lora.py)",
    "num_gpus_per_node": "checked: --rollout-num-gpus-per-engine must fit on one node",
    "offload": "derives --offload-train / --offload-rollout",
    "offload_train": "checked: on exactly with --colocate (the loop offloads a colocated trainer)",
    "rollout_external_engine_addrs": "derives --rollout-engine-urls",
    "update_weight_transport": "derives --weight-sync (nccl → distributed, disk → disk)",
}


def _sources() -> list[pathlib.Path]:
    files = [*ROOT.glob("packages/*/src/**/*.py"), *(ROOT / "apps").rglob("*.py")]
    return sorted(p for p in files if CONFIG_DIR not in p.parents)


def _dynamic_getattr_helpers(tree: ast.AST) -> dict[str, tuple[int, list[str]]]:
    """Functions doing `getattr(x, f"<prefix>{param}")`: name -> (param position, [prefixes])."""
    helpers: dict[str, tuple[int, list[str]]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        params = [a.arg for a in fn.args.args]
        for call in ast.walk(fn):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "getattr"):
                continue
            if len(call.args) < 2 or not isinstance(call.args[1], ast.JoinedStr):
                continue
            parts = call.args[1].values
            if (
                len(parts) == 2
                and isinstance(parts[0], ast.Constant)
                and isinstance(parts[1], ast.FormattedValue)
                and isinstance(parts[1].value, ast.Name)
                and parts[1].value.id in params
            ):
                position = params.index(parts[1].value.id)
                helpers.setdefault(fn.name, (position, []))[1].append(parts[0].value)
    return helpers


def _dynamic_fields(tree: ast.AST) -> set[str]:
    """Fields a file reaches through its dynamic-getattr helpers called with string literals."""
    helpers = _dynamic_getattr_helpers(tree)
    fields: set[str] = set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
        if name not in helpers:
            continue
        position, prefixes = helpers[name]
        param = None
        if len(call.args) > position:
            param = call.args[position]
        if isinstance(param, ast.Constant) and isinstance(param.value, str):
            fields.update(prefix + param.value for prefix in prefixes)
    return fields


def _read_fields() -> tuple[set[str], set[str]]:
    """(words in the sources, fields reached dynamically)."""
    words: set[str] = set()
    dynamic: set[str] = set()
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        words.update(re.findall(r"\b[A-Za-z_][A-Za-z0-9_]*\b", text))
        dynamic |= _dynamic_fields(ast.parse(text, filename=str(path)))
    return words, dynamic


def test_dynamic_getattr_patterns_are_resolved():
    """The resolver finds `getattr(args, f"eval_{name}")`-style reads (so passing fields are not a hard-coded list).

    The eval/rollout sampling fallbacks it used to find in the code are read by name since the typed-config
    refactor (issue 14), so they must now be among the words.
    """
    words, _ = _read_fields()
    assert {"eval_top_p", "rollout_top_p", "eval_max_response_len", "rollout_max_response_len"} <= words
    src = "def f(args, name):\n    return getattr(args, f'eval_{name}')\n\ndef g(args):\n    return f(args, 'x_y')\n"
    assert _dynamic_fields(ast.parse(src)) == {"eval_x_y"}


def test_consumed_by_validation_entries_are_fields():
    assert set(CONSUMED_BY_VALIDATION) <= set(SlimeArgs.model_fields)


def test_every_field_is_read_or_rejected():
    words, dynamic = _read_fields()
    silent = sorted(
        name
        for name in SlimeArgs.model_fields
        if name not in UNSUPPORTED and name not in words and name not in dynamic and name not in CONSUMED_BY_VALIDATION
    )
    assert not silent, (
        f"{len(silent)} flag(s) are parsed but never read and not in UNSUPPORTED (setting them would change "
        f"nothing): {', '.join(field_to_flag(n) for n in silent)}"
    )
