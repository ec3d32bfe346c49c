"""Appends a GPU session's JSON result lines to `benchmarks/results.jsonl` (append-only, committed).

Record the lines a session wrote (`$OUT/results.jsonl` of `gpu_session.sh`):

    python3 benchmarks/record_results.py OUT/results.jsonl --commit <sha> --machine nvidia-h200 [--date YYYY-MM-DD]

Each line gets `date`, `commit` and `machine` where it lacks them (`date`: `--date`, else the day of the line's
`time_utc`, else today in UTC; a `commit` of "unknown" counts as missing), is validated, and is appended. A batch
is recorded whole or not at all: a bad line (not JSON, not an object, no `bench`, a required field missing or
malformed) or a line that exactly repeats one already recorded stops it with a message naming the file and the
line, and nothing is written. Existing lines are never rewritten.

Check the committed file (every line parses, carries bench/date/commit/machine, no exact duplicates), or
another file given as the argument:

    python3 benchmarks/record_results.py --check [FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import sys
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results.jsonl"

COMMON_KEYS = ("bench", "date", "commit", "machine")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_MACHINE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_day(value: Any) -> bool:
    if not (isinstance(value, str) and _DATE.match(value)):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def _positive(value: Any) -> str | None:
    return None if _number(value) and value > 0 else "must be a number > 0"


def _fraction(value: Any) -> str | None:
    return None if _number(value) and 0 < value <= 1 else "must be a fraction in (0, 1] (not a percentage)"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "must be a non-empty string"


def _integer(value: Any) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"


def _outcome(value: Any) -> str | None:
    return None if value in ("pass", "fail", "error", "hang") else "must be one of pass, fail, error, hang"


# Fields a line of each bench must carry, with their check (None: valid). train_fsdp/train_megatron/e2e/trl_grpo
# are the ones issue 22 names; matmul's tflops is what the train steps read as their MFU denominator; step lines are
# written by gpu_session.sh; gpu_tests lines are written by hand from a pytest run.
REQUIRED: dict[str, dict[str, Any]] = {
    "train_fsdp": {"preset": _text, "mfu": _fraction},
    "train_megatron": {"preset": _text, "mfu": _fraction},
    "e2e": {"tokens_per_s": _positive},
    "trl_grpo": {"tokens_per_s": _positive},
    "matmul": {"tflops": _positive},
    "step": {"step": _text, "rc": _integer},
    "gpu_tests": {"outcome": _outcome},
}


class ResultsError(Exception):
    """A result line or file that cannot be recorded; the message names the file and the line."""


def line_problems(line: dict[str, Any]) -> list[str]:
    """What is wrong with one parsed result line (empty when it can be recorded).

    Args:
        line: the parsed JSON object, after `date`, `commit` and `machine` were filled in.

    Returns:
        One message per problem, e.g. "missing 'mfu' (required for bench 'train_fsdp')".
    """
    problems = []
    for key in COMMON_KEYS:
        if key not in line:
            problems.append(f"missing {key!r}")
    if "bench" in line and (err := _text(line["bench"])):
        problems.append(f"'bench' {err}")
    if "date" in line and not _is_day(line["date"]):
        problems.append(f"'date' must be YYYY-MM-DD, got {line['date']!r}")
    if "commit" in line and not (isinstance(line["commit"], str) and _COMMIT.match(line["commit"])):
        problems.append(f"'commit' must be a 7-40 digit lowercase hex sha, got {line['commit']!r}")
    if "machine" in line and not (isinstance(line["machine"], str) and _MACHINE.match(line["machine"])):
        problems.append(f"'machine' must look like 'nvidia-h200', got {line['machine']!r}")
    bench = line.get("bench")
    for key, check in (REQUIRED.get(bench, {}) if isinstance(bench, str) else {}).items():
        if key not in line:
            problems.append(f"missing {key!r} (required for bench {bench!r})")
        elif err := check(line[key]):
            problems.append(f"{key!r} {err}, got {line[key]!r}")
    return problems


def read_lines(path: pathlib.Path) -> list[tuple[int, dict[str, Any]]]:
    """Parses a JSON-lines file into `(line number, object)` pairs; blank lines are skipped.

    Args:
        path: the file.

    Returns:
        The objects with their 1-based line numbers.

    Raises:
        ResultsError: the file cannot be read, or a line is not valid JSON or not a JSON object.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: cannot read: {e}") from e
    out = []
    for number, raw in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 may sit in a string
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ResultsError(f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(obj, dict):
            raise ResultsError(f"{path}:{number}: a result line must be a JSON object, got {type(obj).__name__}")
        out.append((number, obj))
    return out


def _key(line: dict[str, Any]) -> str:
    return json.dumps(line, sort_keys=True)


def fill(line: dict[str, Any], *, commit: str | None, machine: str | None, date: str | None) -> dict[str, Any]:
    """The line with `date`, `commit` and `machine` added where missing, those keys first after `bench`.

    Args:
        line: a parsed result line (not modified).
        commit: the session's commit, for a line without one (or with "unknown").
        machine: the machine kind, e.g. "nvidia-h200".
        date: YYYY-MM-DD; when None, the day of the line's `time_utc`, else today in UTC.

    Returns:
        A new dict.
    """
    rest = dict(line)
    head: dict[str, Any] = {}
    if "bench" in rest:
        head["bench"] = rest.pop("bench")
    day = date
    if day is None and isinstance(line.get("time_utc"), str) and _is_day(line["time_utc"][:10]):
        day = line["time_utc"][:10]
    head["date"] = rest.pop("date", None) or day or datetime.datetime.now(datetime.UTC).date().isoformat()
    line_commit = rest.pop("commit", None)
    head["commit"] = line_commit if line_commit not in (None, "", "unknown") else commit
    head["machine"] = rest.pop("machine", None) or machine
    return {**{k: v for k, v in head.items() if v is not None}, **rest}


def check_file(path: pathlib.Path = RESULTS) -> list[dict[str, Any]]:
    """Validates a whole results file: every line parses and is valid, and no line repeats another exactly.

    Args:
        path: the results file (default `benchmarks/results.jsonl`).

    Returns:
        The parsed lines.

    Raises:
        ResultsError: every problem, one per line of the message, each naming the file and the line.
    """
    lines = read_lines(path)
    errors, seen = [], {}
    for number, line in lines:
        errors += [f"{path}:{number}: {p}" for p in line_problems(line)]
        key = _key(line)
        if key in seen:
            errors.append(f"{path}:{number}: exact duplicate of line {seen[key]}")
        seen.setdefault(key, number)
    if errors:
        raise ResultsError("\n".join(errors))
    return [line for _, line in lines]


def record(
    source: pathlib.Path,
    target: pathlib.Path = RESULTS,
    *,
    commit: str | None,
    machine: str | None,
    date: str | None = None,
) -> list[dict[str, Any]]:
    """Fills, validates and appends the lines of `source` to `target`; all of them or none.

    Args:
        source: JSON lines a GPU session wrote (`$OUT/results.jsonl`).
        target: the committed results file (created when absent).
        commit: the session's commit, for lines without one.
        machine: the machine kind, for lines without one.
        date: YYYY-MM-DD for lines without a date (default: the line's `time_utc` day, else today in UTC).

    Returns:
        The lines appended.

    Raises:
        ResultsError: a bad or duplicate line in `source`, a bad `target`, or an empty `source`; nothing is
            written then.
    """
    if date is not None and not _is_day(date):
        raise ResultsError(f"--date must be YYYY-MM-DD, got {date!r}")
    existing = {_key(line): number for number, line in read_lines(target)} if target.exists() else {}
    new, errors, notes = [], [], []
    for number, raw in read_lines(source):
        line = fill(raw, commit=commit, machine=machine, date=date)
        problems = line_problems(line)
        errors += [f"{source}:{number}: {p}" for p in problems]
        if problems:
            continue
        key = _key(line)
        if key in existing:
            where = f"{target} line {existing[key]}" if existing[key] > 0 else f"line {-existing[key]} of {source}"
            errors.append(f"{source}:{number}: exact duplicate of {where}, refused")
            continue
        existing[key] = -number
        if commit is not None and line["commit"] != commit:
            notes.append(f"{source}:{number} keeps its own commit {line['commit']!r}, not --commit {commit!r}")
        new.append(line)
    if errors:
        raise ResultsError("\n".join(errors) + f"\nnothing was written to {target}")
    for note in notes:
        print(f"record_results: note: {note}", file=sys.stderr)
    if not new:
        raise ResultsError(f"{source}: no result lines")
    prefix = ""
    if target.exists() and target.stat().st_size and not target.read_bytes().endswith(b"\n"):
        prefix = "\n"  # the last line lacks its newline: end it, never rewrite it
    with open(target, "a", encoding="utf-8") as f:
        f.write(prefix + "".join(json.dumps(line) + "\n" for line in new))
    return new


def main(argv: list[str] | None = None) -> int:
    """Command line: record a session's lines, or `--check` the results file.

    Args:
        argv: arguments (default: `sys.argv[1:]`).

    Returns:
        The exit status: 0 when done, 1 on a bad line, a duplicate or a failed check.
    """
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?", type=pathlib.Path, help="the session's results.jsonl (with --check: the file)")
    p.add_argument("--commit", help="short sha of the measured tree, for lines without a commit")
    p.add_argument("--machine", help="machine kind, e.g. nvidia-h200 or nvidia-h200-x2")
    p.add_argument("--date", help="YYYY-MM-DD for lines without one (default: the line's time_utc, else today)")
    p.add_argument("--results", type=pathlib.Path, default=RESULTS, help="the file to append to / check")
    p.add_argument("--check", action="store_true", help="validate the results file and exit")
    a = p.parse_args(argv)
    try:
        if a.check:
            path = a.source or a.results
            lines = check_file(path)
            print(f"{path}: {len(lines)} lines ok")
            return 0
        if a.source is None or a.machine is None:
            p.error("recording needs the session's results.jsonl and --machine (or use --check)")
        new = record(a.source, a.results, commit=a.commit, machine=a.machine, date=a.date)
    except ResultsError as e:
        print(f"record_results: error: {e}", file=sys.stderr)
        return 1
    benches: dict[str, int] = {}
    for line in new:
        benches[line["bench"]] = benches.get(line["bench"], 0) + 1
    summary = ", ".join(f"{bench} {n}" for bench, n in benches.items())
    print(f"appended {len(new)} line{'s' * (len(new) != 1)} to {a.results} ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
