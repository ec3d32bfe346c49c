"""benchmarks/results.jsonl (the committed, append-only GPU results) and its recorder, record_results.py.

No subprocesses and no GPU: the recorder is loaded from its file and run on tmp files.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results.jsonl"


def _load_recorder():
    spec = importlib.util.spec_from_file_location("record_results", REPO / "benchmarks" / "record_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rr = _load_recorder()

# Lines as the bench scripts print them (`_common.emit`: bench, time_utc, commit, then the result).
TRAIN = {"bench": "train_fsdp", "time_utc": "2026-12-01T10:00:00+00:00", "commit": "b30a4b0",
         "preset": "qwen3-1.7b", "tokens_per_s": 9100.0, "mfu": 0.149, "peak_mem_gib": 52.5}  # fmt: skip
E2E = {"bench": "e2e", "time_utc": "2026-12-01T10:05:00+00:00", "commit": "b30a4b0", "label": "qwen3-0.6b-fsdp",
       "perf/step_time": {"all": [20.0, 10.6], "median": 10.6}, "tokens_per_s": 5800.0}  # fmt: skip
STEP = {"bench": "step", "step": "e2e", "rc": 0, "seconds": 250}


def _write(path: pathlib.Path, lines: list) -> pathlib.Path:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def _lines(path: pathlib.Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------- committed file


def test_committed_results_pass_the_check():
    lines = rr.check_file(RESULTS)
    assert len(lines) >= 26
    for line in lines:
        assert {"bench", "date", "commit", "machine"} <= line.keys()
    assert rr.main(["--check"]) == 0


def test_committed_backfill_holds_every_table_of_results_md():
    lines = rr.check_file(RESULTS)
    backfill = [ln for ln in lines if ln.get("source") == "RESULTS.md backfill"]
    counts: dict[str, int] = {}
    for line in backfill:
        counts[line["bench"]] = counts.get(line["bench"], 0) + 1
    assert counts == {"matmul": 1, "train_fsdp": 4, "weight_sync": 2, "rollout": 2, "e2e": 5, "trl_grpo": 1,
                      "gpu_tests": 10, "megatron_parallel": 1}  # fmt: skip
    # Every backfilled commit and machine appears in RESULTS.md as written there.
    table = (REPO / "benchmarks" / "RESULTS.md").read_text()
    for line in backfill:
        assert f"| {line['commit']} | {line['machine']}" in table, line
    # MFU is a fraction, as bench_train_fsdp.py prints it (RESULTS.md shows a percentage).
    mfu = {ln["preset"] + ("-gc" if ln["gradient_checkpointing"] else ""): ln["mfu"]
           for ln in backfill if ln["bench"] == "train_fsdp"}  # fmt: skip
    assert mfu == {"qwen3-0.6b": 0.078, "qwen3-1.7b": 0.152, "qwen3-4b": 0.191, "qwen3-4b-gc": 0.17}


def test_committed_file_is_one_object_per_line():
    raw = RESULTS.read_text(encoding="utf-8")
    assert raw.endswith("\n")
    assert all(ln.startswith("{") and ln.endswith("}") for ln in raw.split("\n")[:-1])


# ------------------------------------------------------------------------------------------ recorder


def test_record_appends_and_fills_date_commit_machine(tmp_path):
    target = _write(tmp_path / "results.jsonl", [{"bench": "matmul", "date": "2026-11-30", "commit": "5209fa7",
                                                  "machine": "nvidia-h200", "tflops": 772.3}])  # fmt: skip
    before = target.read_text()
    no_commit = {"bench": "step", "step": "trl", "rc": 124, "seconds": 420}
    source = _write(tmp_path / "session.jsonl", [TRAIN, "", E2E, STEP | {"commit": "unknown"}, no_commit])
    assert rr.main([str(source), "--commit", "b30a4b0", "--machine", "nvidia-h200", "--results", str(target)]) == 0
    text = target.read_text()
    assert text.startswith(before)  # the existing line is untouched
    lines = _lines(target)
    assert len(lines) == 5
    train, e2e, step, trl = lines[1:]
    assert list(train)[:4] == ["bench", "date", "commit", "machine"]
    assert train == {"date": "2026-12-01", "machine": "nvidia-h200", **TRAIN}  # the day of time_utc
    assert e2e["perf/step_time"] == E2E["perf/step_time"] and e2e["tokens_per_s"] == 5800.0
    assert step["commit"] == "b30a4b0"  # "unknown" counts as missing
    assert trl["commit"] == "b30a4b0" and trl["date"]  # no time_utc: today
    assert rr.check_file(target) == lines


def test_record_date_flag_and_own_commit(tmp_path, capsys):
    target = tmp_path / "results.jsonl"  # created on first use
    source = _write(tmp_path / "session.jsonl", [STEP])
    rr.record(source, target, commit="abcdef1", machine="nvidia-h200-x2", date="2026-12-02")
    assert _lines(target) == [{"bench": "step", "date": "2026-12-02", "commit": "abcdef1",
                               "machine": "nvidia-h200-x2", "step": "e2e", "rc": 0, "seconds": 250}]  # fmt: skip
    # A line with its own commit keeps it; the recorder says so.
    rr.record(_write(tmp_path / "s2.jsonl", [TRAIN]), target, commit="abcdef1", machine="nvidia-h200")
    assert _lines(target)[-1]["commit"] == "b30a4b0"
    assert "keeps its own commit 'b30a4b0'" in capsys.readouterr().err
    with pytest.raises(rr.ResultsError, match="--date must be YYYY-MM-DD"):
        rr.record(source, target, commit="abcdef1", machine="nvidia-h200", date="2026-13-01")


def test_record_refuses_duplicates_and_writes_nothing(tmp_path, capsys):
    target = tmp_path / "results.jsonl"
    source = _write(tmp_path / "session.jsonl", [TRAIN, E2E])
    args = [str(source), "--commit", "b30a4b0", "--machine", "nvidia-h200", "--results", str(target)]
    assert rr.main(args) == 0
    before = target.read_bytes()
    assert rr.main(args) == 1  # the same session recorded twice
    err = capsys.readouterr().err
    assert f"{source}:1: exact duplicate of {target} line 1, refused" in err
    assert f"{source}:2: exact duplicate of {target} line 2, refused" in err
    assert "nothing was written" in err
    assert target.read_bytes() == before
    # A line repeated inside one session file is refused too.
    twice = _write(tmp_path / "twice.jsonl", [STEP, STEP])
    with pytest.raises(rr.ResultsError, match=r"twice.jsonl:2: exact duplicate of line 1 of"):
        rr.record(twice, target, commit="b30a4b0", machine="nvidia-h200", date="2026-12-01")
    assert target.read_bytes() == before
    # The same measurement on another machine is not a duplicate.
    rr.record(source, target, commit="b30a4b0", machine="nvidia-h200-x2")
    assert len(_lines(target)) == 4


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"bench": "e2e", "tokens_per_s": 5800', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, got list"),
        ({"tokens_per_s": 5800.0}, "missing 'bench'"),
        ({"bench": "train_fsdp", "preset": "qwen3-4b"}, "missing 'mfu' (required for bench 'train_fsdp')"),
        ({"bench": "train_fsdp", "preset": "qwen3-4b", "mfu": 19.1}, "'mfu' must be a fraction in (0, 1]"),
        ({"bench": "e2e", "label": "x"}, "missing 'tokens_per_s' (required for bench 'e2e')"),
        ({"bench": "trl_grpo", "tokens_per_s": None}, "'tokens_per_s' must be a number > 0"),
        ({"bench": "step", "step": "tests"}, "missing 'rc'"),
        ({"bench": "matmul", "tflops": 772.3, "date": "30.11.2026"}, "'date' must be YYYY-MM-DD"),
        ({"bench": "matmul", "tflops": 772.3, "commit": "HEAD"}, "'commit' must be a 7-40 digit"),
    ],
)
def test_record_names_the_bad_line_and_writes_nothing(tmp_path, capsys, bad, message):
    target = _write(tmp_path / "results.jsonl", [{"bench": "step", "date": "2026-11-30", "commit": "5209fa7",
                                                  "machine": "nvidia-h200", "step": "matmul", "rc": 0}])  # fmt: skip
    before = target.read_bytes()
    source = _write(tmp_path / "session.jsonl", [TRAIN, STEP, bad])
    args = [str(source), "--commit", "b30a4b0", "--machine", "nvidia-h200", "--results", str(target)]
    assert rr.main(args) == 1
    err = capsys.readouterr().err
    assert f"{source}:3: " in err and message in err
    assert f"{source}:1" not in err and f"{source}:2" not in err  # the good lines are not blamed
    assert target.read_bytes() == before


def test_record_needs_machine_and_a_line(tmp_path):
    source = _write(tmp_path / "session.jsonl", [STEP])
    with pytest.raises(SystemExit):
        rr.main([str(source), "--commit", "b30a4b0", "--results", str(tmp_path / "r.jsonl")])
    with pytest.raises(rr.ResultsError, match="no result lines"):
        rr.record(_write(tmp_path / "empty.jsonl", []), tmp_path / "r.jsonl", commit="b30a4b0", machine="m")
    assert not (tmp_path / "r.jsonl").exists()


def test_record_ends_an_unterminated_last_line(tmp_path):
    target = tmp_path / "results.jsonl"
    first = json.dumps({"bench": "step", "date": "2026-11-30", "commit": "5209fa7", "machine": "nvidia-h200", "rc": 0,
                        "step": "a"})  # fmt: skip
    target.write_text(first)  # no final newline
    rr.record(_write(tmp_path / "s.jsonl", [STEP]), target, commit="b30a4b0", machine="nvidia-h200")
    assert target.read_text().startswith(first + "\n")
    assert len(rr.check_file(target)) == 2


def test_check_names_every_bad_line(tmp_path, capsys):
    good = {"bench": "matmul", "date": "2026-11-30", "commit": "5209fa7", "machine": "nvidia-h200", "tflops": 772.3}
    path = _write(tmp_path / "results.jsonl", [good, {k: v for k, v in good.items() if k != "machine"}, good])
    assert rr.main(["--check", "--results", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:2: missing 'machine'" in err
    assert f"{path}:3: exact duplicate of line 1" in err
    assert f"{path}:1" not in err
    _write(path, [good, "not json"])
    with pytest.raises(rr.ResultsError, match=r"results.jsonl:2: not valid JSON"):
        rr.check_file(path)
