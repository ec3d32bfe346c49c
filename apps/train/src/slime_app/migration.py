"""The status of every original slime flag here, rendered as the tables of MIGRATION.md.

`flag_status(flag)` answers for one flag of the original's own parser; `megatron_rows()` for the Megatron-LM flags
this version accepts (`slime_core.config.megatron_flags`). `python -m slime_app.migration FLAGS_FILE` prints both
tables (FLAGS_FILE: one original flag per line, e.g. `tests/fixtures/original-flags.txt`);
`tests/apps/test_migration.py` checks MIGRATION.md holds exactly that output.
"""

from __future__ import annotations

import sys

from slime_core.config import MEGATRON_FLAGS, SlimeArgs, build_parser
from slime_core.config.base import flag_to_field
from slime_core.config.megatron_flags import MEGATRON_FLAG_RULES, FlagRule
from slime_core.config.unsupported import UNSUPPORTED, UNSUPPORTED_FLAGS, unsupported_flag_note

__all__ = ["flag_status", "megatron_rows", "render_tables"]

BEGIN, END = "<!-- BEGIN GENERATED: python -m slime_app.migration -->", "<!-- END GENERATED -->"


def _short(text: str) -> str:
    return text.replace("|", "/").split(". ")[0].rstrip(".")


def flag_status(flag: str) -> tuple[str, str]:
    """`(status, note)` of one flag of the original's parser.

    Status: `honoured`, `not implemented` (the note says what to use instead), `Megatron flag` (see the Megatron
    table), `passed to SGLang` or `unknown`.
    """
    if flag in UNSUPPORTED_FLAGS:
        return "not implemented", unsupported_flag_note(flag)
    if flag in MEGATRON_FLAGS:
        return "Megatron flag", "see the Megatron table"
    actions = build_parser()._option_string_actions
    if flag in actions:
        name = actions[flag].dest
        if name in UNSUPPORTED:
            return "not implemented", UNSUPPORTED[name]
        return "honoured", _short(SlimeArgs.model_fields[name].description or "")
    if flag.startswith(("--sglang-", "--router-")):
        field = flag_to_field(flag.removeprefix("--sglang-").removeprefix("--router-"))
        return "passed to SGLang", f"`{field}` of SGLang's server (or router) arguments"
    return "unknown", ""


_WORDS = {
    "check": "checked against config.json",
    "read": "honoured",
    "same": "honoured (always so)",
    "recompute": "as --gradient-checkpointing",
    "noop": "no effect",
    "error": "not implemented",
}


def _word(kind: str, rule: FlagRule) -> str:
    return f"only `{rule.neutral}`" if kind == "neutral" else _WORDS[kind]


def megatron_rows() -> list[tuple[str, str, str, str]]:
    """`(flag, with --train-backend megatron, with --train-backend fsdp, note)` for every accepted Megatron flag."""
    rows = []
    for flag in sorted(MEGATRON_FLAG_RULES):
        rule = MEGATRON_FLAG_RULES[flag]
        shape = rule.megatron == "check" and not rule.note  # an architecture flag (--spec carries its own note)
        note = "model shape: the model is config.json's" if shape else rule.note.replace("|", "/")
        rows.append((flag, _word(rule.megatron, rule), _word(rule.fsdp, rule), note))
    return rows


def render_tables(original_flags: list[str]) -> str:
    """The generated part of MIGRATION.md: the original's own flags, then the Megatron flags."""
    lines = [BEGIN, "", "### Flags of the original's own parser", "", "| flag | status | note |", "|---|---|---|"]
    for flag in original_flags:
        status, note = flag_status(flag)
        lines.append(f"| `{flag}` | {status} | {note} |")
    lines += ["", "### Megatron-LM flags", "", "| flag | `--train-backend megatron` | `--train-backend fsdp` | note |",
              "|---|---|---|---|"]  # fmt: skip
    lines += [f"| `{flag}` | {megatron} | {fsdp} | {note} |" for flag, megatron, fsdp, note in megatron_rows()]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Prints the tables for the flags listed in the file `argv[0]` (`#` lines are comments)."""
    with open(argv[0], encoding="utf-8") as f:
        flags = [line.strip() for line in f if line.strip().startswith("--")]
    sys.stdout.write(render_tables(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
