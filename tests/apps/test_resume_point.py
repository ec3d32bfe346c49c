"""The resumed run's start rollout and its data cursor, told on the driver before anything starts (issue 27)."""

import json

import pytest

from slime_app.resume_point import check_data_cursor, start_rollout_id
from slime_core.config import parse_args


@pytest.fixture
def save(tmp_path):
    """An FSDP --save folder whose tracker names iter_0000002 (the save after rollout 1)."""
    root = tmp_path / "save"
    for step in (1, 2):
        (root / f"iter_{step:07d}").mkdir(parents=True)
        (root / f"iter_{step:07d}" / "meta.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    (root / "rollout").mkdir()
    return root


def _cfg(save, *extra):
    return parse_args(["--rollout-batch-size", "1", "--num-rollout", "4", "--train-backend", "fsdp", "--load",
                       str(save), "--no-load-optim", *extra])  # fmt: skip


def _cursor(**fields):
    state = {"epoch_id": 0, "sample_offset": 3, "sample_group_index": 3, "sample_index": 3, "metadata": {}}
    return json.dumps({**state, **fields})


def test_start_rollout_follows_the_backends_iteration_names(save, tmp_path):
    assert start_rollout_id(_cfg(save)) == 2  # FSDP: iter_{next_rollout_id}
    assert start_rollout_id(_cfg(save, "--ckpt-step", "1")) == 1
    assert start_rollout_id(_cfg(save, "--start-rollout-id", "3")) == 3
    assert start_rollout_id(_cfg(tmp_path / "none")) == 0
    megatron = tmp_path / "mcore"
    (megatron / "iter_0000005").mkdir(parents=True)
    (megatron / "iter_0000005" / ".metadata").write_text("")
    (megatron / "latest_checkpointed_iteration.txt").write_text("5")
    assert start_rollout_id(_cfg(megatron)) == 6  # Megatron: iter_{rollout_id}, resumed at the next one


def test_a_damaged_cursor_is_named_before_anything_starts(save):
    # Issue 27: a truncated rollout/data_source_1.json was read by the rollout manager only after Ray, the engines
    # and the model load; now the preflight (and --dry-run) names it.
    cursor = save / "rollout" / "data_source_1.json"
    cursor.write_text(_cursor()[:40])
    with pytest.raises(ValueError) as e:
        check_data_cursor(_cfg(save))
    message = str(e.value)
    assert message.startswith(f"--load {save}: the run resumes at rollout 2, whose data cursor cannot be restored: "
                              f"{cursor}: bad data-source cursor (")  # fmt: skip
    assert "\n" not in message


@pytest.mark.parametrize("text, said", [
    (_cursor(sample_offset="x"), "invalid literal for int()"),
    (json.dumps({"epoch_id": 0}), "no 'sample_offset' field"),
    ("[1, 2]", "not a JSON object but list"),
])  # fmt: skip
def test_a_cursor_missing_or_holding_bad_fields_is_named(save, text, said):
    (save / "rollout" / "data_source_1.json").write_text(text)
    with pytest.raises(ValueError, match="data_source_1.json: bad data-source cursor") as e:
        check_data_cursor(_cfg(save))
    assert said in str(e.value)


def test_a_sound_cursor_passes_and_other_runs_read_none(save):
    (save / "rollout" / "data_source_1.json").write_text(_cursor())
    assert check_data_cursor(_cfg(save)) == [
        f"--load {save}: data cursor {save / 'rollout' / 'data_source_1.json'} read, the prompts go on from rollout 2"
    ]
    (save / "rollout" / "data_source_1.json").write_text("{")
    assert check_data_cursor(_cfg(save).model_copy(update={"num_rollout": 0})) == []  # eval-only: draws no prompt
    assert check_data_cursor(_cfg(save, "--start-rollout-id", "0")) == []


def test_the_cli_refuses_a_damaged_cursor_before_ray_starts(save, tmp_path, cli_without_ray):
    from slime_app.demo import default_demo_argv

    cursor = save / "rollout" / "data_source_1.json"
    cursor.write_text("{")
    out = cli_without_ray([*default_demo_argv(tmp_path / "run"), "--load", str(save), "--no-load-optim"])
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.splitlines()[-1]
    assert last.startswith(f"slime: error: --load {save}: the run resumes at rollout 2, whose data cursor cannot be "
                           f"restored: {cursor}: bad data-source cursor (")  # fmt: skip
    assert "Traceback" not in out.stderr


def test_replayed_rollouts_need_their_dumps(save, tmp_path):
    from slime_app.resume_point import check_replay_dumps

    template = str(tmp_path / "dumps" / "rollout_{rollout_id}.pt")
    (tmp_path / "dumps").mkdir()
    for rollout_id in (2, 3):
        (tmp_path / "dumps" / f"rollout_{rollout_id}.pt").write_bytes(b"x")
    replay = ["--load-debug-rollout-data", template]
    # Resumed at rollout 2 (iter_0000002): rollouts 2 and 3 are replayed, both there.
    assert check_replay_dumps(_cfg(save, *replay)) == ["--load-debug-rollout-data: dumps of rollouts 2..3 are there"]
    fresh = parse_args(["--rollout-batch-size", "1", "--num-rollout", "4", "--train-backend", "fsdp", *replay])
    with pytest.raises(FileNotFoundError) as e:
        check_replay_dumps(fresh)
    assert str(e.value) == (
        f"--load-debug-rollout-data {template}: no dump for 2 of the 4 rollouts this run replays (0..3): rollout 0, 1 "
        f"(first missing: {tmp_path / 'dumps' / 'rollout_0.pt'}); lower --num-rollout or dump those rollouts"
    )


def test_the_cli_refuses_missing_replay_dumps_before_ray_starts(tmp_path, cli_without_ray):
    from slime_app.demo import default_demo_argv

    template = str(tmp_path / "nope_{rollout_id}.pt")
    out = cli_without_ray([*default_demo_argv(tmp_path / "run"), "--load-debug-rollout-data", template])
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1].startswith(f"slime: error: --load-debug-rollout-data {template}: no dump for ")
