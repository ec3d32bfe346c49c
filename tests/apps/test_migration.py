"""MIGRATION.md lists every original flag with its current status (regenerated from the code, compared verbatim)."""

import pathlib

from slime_app.migration import BEGIN, END, flag_status, render_tables

REPO = pathlib.Path(__file__).resolve().parents[2]
FLAGS_FILE = REPO / "tests" / "fixtures" / "original-flags.txt"


def _original_flags():
    return [line for line in FLAGS_FILE.read_text().splitlines() if line.startswith("--")]


def test_migration_tables_are_current():
    text = (REPO / "MIGRATION.md").read_text()
    generated = text[text.index(BEGIN) : text.index(END) + len(END)] + "\n"
    assert generated == render_tables(_original_flags()), "run: uv run python -m slime_app.migration " + str(
        FLAGS_FILE.relative_to(REPO)
    )


def test_every_original_flag_has_a_known_status():
    statuses = {flag: flag_status(flag) for flag in _original_flags()}
    assert [f for f, (status, _) in statuses.items() if status == "unknown"] == []
    # Every "not implemented" says why or what to use instead.
    assert all(note for status, note in statuses.values() if status == "not implemented")
    assert statuses["--num-epoch"][0] == "honoured" and statuses["--loss-mask-type"][0] == "honoured"
    assert statuses["--warmup-ratio"] == ("not implemented", "use --lr-warmup-fraction")
