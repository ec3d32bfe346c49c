"""The metrics sink: TensorBoard directory and x-axis, and the W&B calls built from the `--wandb-*` flags."""

import math
import sys
import types

import pytest

from slime_app.tracking import Tracker, tensorboard_log_dir, wandb_init_kwargs, wandb_login_kwargs
from slime_core.config import parse_args


def _args(*extra: str):
    return parse_args(
        ["--train-backend", "fsdp", "--hf-checkpoint", "/models/m", "--prompt-data", "/data/d.jsonl",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "2",
         "--num-rollout", "3", "--rollout-max-response-len", "8", *extra]
    )  # fmt: skip


def test_wandb_kwargs_from_the_original_flags():
    args = _args(
        *("--use-wandb", "--wandb-team", "rl-team", "--wandb-project", "proj", "--wandb-group", "exp1"),
        *("--wandb-mode", "offline", "--wandb-dir", "/tmp/wb", "--wandb-run-id", "abc123"),
    )
    kw = wandb_init_kwargs(args, suffix="x7")
    assert {k: v for k, v in kw.items() if k != "config"} == {
        "entity": "rl-team",
        "project": "proj",
        "group": "exp1_x7",
        "name": "exp1_x7",
        "mode": "offline",
        "dir": "/tmp/wb",
        "id": "abc123",
        "resume": "allow",
    }
    assert kw["config"]["wandb_group"] == "exp1" and kw["config"]["rollout_batch_size"] == 4
    plain = wandb_init_kwargs(
        _args("--use-wandb", "--wandb-group", "exp1", "--disable-wandb-random-suffix"), suffix="x"
    )
    assert plain["group"] == plain["name"] == "exp1"
    assert not {"mode", "dir", "id", "resume"} & set(plain)
    assert wandb_init_kwargs(_args("--use-wandb"), suffix="x")["group"] is None  # no group: no suffix either


def test_the_wandb_key_is_neither_uploaded_nor_printed():
    # The W&B run config is readable by everyone on the project and --dry-run's listing ends up in logs.
    from slime_app.dry_run import render_config

    args = _args("--use-wandb", "--wandb-key", "sk-secret-123", "--wandb-project", "proj", "--sglang-api-key", "sk-eng")
    config = wandb_init_kwargs(args, suffix="x")["config"]
    assert config["wandb_key"] == "REDACTED" and config["wandb_project"] == "proj"
    assert config["sglang_args"]["api_key"] == "REDACTED"
    listing = "\n".join(render_config(args))
    assert "sk-secret-123" not in listing and "--wandb-key" in listing and "REDACTED" in listing
    assert "sk-eng" not in listing and "--sglang-api-key REDACTED" in listing
    assert args.wandb_key == "sk-secret-123" and wandb_login_kwargs(args)["key"] == "sk-secret-123"  # login still
    assert wandb_init_kwargs(_args("--use-wandb"), suffix="x")["config"]["wandb_key"] is None  # unset stays None


def test_wandb_login_only_with_credentials_and_online(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_login_kwargs(_args("--wandb-key", "k", "--wandb-host", "https://wb.local")) == {
        "key": "k",
        "host": "https://wb.local",
    }
    assert wandb_login_kwargs(_args("--wandb-host", "https://wb.local")) == {"key": None, "host": "https://wb.local"}
    assert wandb_login_kwargs(_args()) is None
    assert wandb_login_kwargs(_args("--wandb-key", "k", "--wandb-mode", "offline")) is None
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_login_kwargs(_args("--wandb-key", "k")) is None


class _FakeWandb(types.ModuleType):
    """Records the calls the tracker makes on the `wandb` module and its run."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []

    def login(self, **kw):
        self.calls.append(("login", kw))

    def init(self, **kw):
        self.calls.append(("init", kw))
        run = types.SimpleNamespace()
        run.define_metric = lambda name, **kw: self.calls.append(("define_metric", name, kw))
        run.log = lambda data: self.calls.append(("log", data))
        run.finish = lambda: self.calls.append(("finish",))
        return run


@pytest.mark.parametrize(("train_step", "expected_x"), [(False, 2), (True, 8)])
def test_tracker_logs_to_wandb_and_tensorboard_on_the_chosen_axis(monkeypatch, tmp_path, train_step, expected_x):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    extra = ["--wandb-always-use-train-step"] if train_step else []
    args = _args(
        *("--use-wandb", "--wandb-key", "k", "--wandb-project", "p", "--wandb-dir", str(tmp_path / "wb")),
        *("--tb-project-name", str(tmp_path / "tb"), "--tb-experiment-name", "run-a", *extra),
    )
    tracker = Tracker(args, str(tmp_path / "out"))
    tracker.log(2, {"rollout/raw_reward": 0.5})
    tracker.log(2, {"train/loss": 0.25, "eval/gsm8k": 0.75})
    tracker.close()

    # rollout 2 of 4 prompts x 2 samples with global batch 2: 2 * 4 * 2 // 2 = 8 optimizer steps before it.
    assert fake.calls[0] == ("login", {"key": "k", "host": None})
    assert fake.calls[1][0] == "init" and fake.calls[1][1]["project"] == "p"
    assert (tmp_path / "wb").is_dir()
    assert ("define_metric", "*", {"step_metric": "rollout/step"}) in fake.calls
    assert ("log", {"rollout/raw_reward": 0.5, "rollout/step": expected_x}) in fake.calls
    # The original's other W&B axes are logged too (its dashboards plot train/* against train/step): rollout 2
    # with 4 optimizer steps per rollout starts at step 8.
    assert ("define_metric", "train/step", {}) in fake.calls and ("define_metric", "eval/step", {}) in fake.calls
    logged = {"train/loss": 0.25, "eval/gsm8k": 0.75, "train/step": 8, "eval/step": expected_x}
    assert ("log", {**logged, "rollout/step": expected_x}) in fake.calls
    assert fake.calls[-1] == ("finish",)
    assert tracker.tensorboard_dir == str(tmp_path / "tb" / "run-a")
    acc = EventAccumulator(tracker.tensorboard_dir)
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("rollout/raw_reward")] == [(expected_x, 0.5)]
    assert tracker.history["rollout/raw_reward"] == [(2, 0.5)]  # printed curves stay in rollout ids


def test_tensorboard_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    out = str(tmp_path)
    assert tensorboard_log_dir(_args(), out) == str(tmp_path / "tensorboard")
    assert tensorboard_log_dir(_args("--tb-experiment-name", "e"), out) == str(tmp_path / "tensorboard" / "e")
    assert tensorboard_log_dir(_args("--tb-project-name", "/tb"), out) == "/tb"
    assert tensorboard_log_dir(_args("--tb-project-name", "proj", "--tb-experiment-name", "e"), out) == str(
        tmp_path / "proj" / "e"
    )
    assert tensorboard_log_dir(_args("--tensorboard-dir", "/x", "--tb-project-name", "/tb"), out) == "/x"
    # The original's environment variable: used as given over the project/experiment names; the flag still wins.
    monkeypatch.setenv("TENSORBOARD_DIR", "/env/tb")
    assert tensorboard_log_dir(_args("--tb-project-name", "proj", "--tb-experiment-name", "e"), out) == "/env/tb"
    assert tensorboard_log_dir(_args(), out) == "/env/tb"
    assert tensorboard_log_dir(_args("--tensorboard-dir", "/x"), out) == "/x"


def test_tensorboard_is_on_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    # The field's default (True) decides; the tracker used to fall back to False when it could not read it.
    tracker = Tracker(_args(), str(tmp_path))
    tracker.close()
    assert tracker.tensorboard_dir == str(tmp_path / "tensorboard")
    assert Tracker(_args("--no-use-tensorboard"), str(tmp_path)).tensorboard_dir is None


def test_a_wandb_finish_that_never_returns_does_not_hold_the_run(monkeypatch, tmp_path, caplog):
    # W&B's finish waits for every upload with no deadline (wandb/wandb#11179: "wandb finish runs forever" once the
    # network is gone); Tracker.close() called it directly, so a run whose training was done never ended.
    import threading

    from slime_app import tracking

    fake, release = _FakeWandb(), threading.Event()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setattr(tracking, "WANDB_FINISH_TIMEOUT_S", 0.2)
    tracker = Tracker(_args("--use-wandb", "--wandb-mode", "offline"), str(tmp_path / "out"))
    tracker._wandb.finish = release.wait  # blocks until the test ends (or 60 s: an unbounded close then fails below)
    threading.Timer(60, release.set).start()
    tracker._wandb.dir = str(tmp_path / "wandb" / "run-1" / "files")
    try:
        with caplog.at_level("WARNING", logger="slime_app.tracking"):
            tracker.close()  # returns after the 0.2 s deadline
        assert f"the run's files are in {tmp_path / 'wandb' / 'run-1' / 'files'}" in caplog.text
        assert "`wandb sync` uploads them later" in caplog.text
    finally:
        release.set()
    assert tracking.finish_wandb(types.SimpleNamespace(finish=lambda: None), 5.0) is True


def test_the_curve_of_a_resumed_run_starts_at_the_first_rollout(tmp_path):
    # A resumed run drew only the rollouts since its start, over the PNG of the same --output-dir: the curve of
    # rollouts 0-1 was gone. The points kept with the checkpoint (`Tracker.state`, `slime_app.run_state`) come first.
    import json

    first = Tracker(_args("--no-use-tensorboard"), str(tmp_path))
    for step, reward in ((0, 0.1), (1, 0.2)):
        first.log(step, {"rollout/raw_reward": reward, "train/loss": 1.0})
    first.log(2, {"eval/gsm8k": 0.5, "eval/gsm8k-truncated_ratio": 0.0})
    saved = json.loads(json.dumps(first.state()))
    assert saved == {"curves": {"rollout/raw_reward": [[0, 0.1], [1, 0.2]], "eval/gsm8k": [[2, 0.5]]}}
    resumed = Tracker(_args("--no-use-tensorboard"), str(tmp_path))
    resumed.log(2, {"rollout/raw_reward": 0.3})
    resumed.restore(saved)
    assert resumed.history["rollout/raw_reward"] == [(0, 0.1), (1, 0.2), (2, 0.3)]
    assert resumed.eval_series() == {"eval/gsm8k": [(2, 0.5)]}
    assert resumed.save_curve(str(tmp_path / "curve.png")) == str(tmp_path / "curve.png")


def test_eval_curves_are_the_dataset_scores_not_their_pass_at_k_or_aborted_share(tmp_path):
    # With --log-passrate the eval also writes eval/<name>-pass@<k> (and eval/<name>-aborted_ratio when samples were
    # aborted): they were taken as datasets of their own, printed as accuracy series at the end of the run and drawn
    # as "(mean reward)" curves in the PNG.
    tracker = Tracker(_args("--no-use-tensorboard"), str(tmp_path))
    for step, score in ((0, 0.25), (1, 0.5)):
        tracker.log(step, {
            "eval/gsm8k": score, "eval/gsm8k-truncated_ratio": 0.0, "eval/gsm8k-aborted_ratio": 0.125,
            "eval/gsm8k-pass@1": score, "eval/gsm8k-pass@4": 0.75, "eval/gsm8k/response_len/mean": 7.0,
            "eval/math-500": 0.125, "perf/eval_time": 3.0,
        })  # fmt: skip
    assert tracker.eval_series() == {"eval/gsm8k": [(0, 0.25), (1, 0.5)], "eval/math-500": [(0, 0.125), (1, 0.125)]}
    assert set(tracker.state()["curves"]) == {"eval/gsm8k", "eval/math-500"}  # what a resumed run draws


class _AuthenticationError(Exception):
    """Stands for `wandb.errors.AuthenticationError` (no common base with wandb's other errors)."""


@pytest.mark.parametrize(
    ("failing", "error", "expected"),
    [
        ("login", _AuthenticationError("API key must have 40+ characters,\n has 3."),
         "--use-wandb: W&B login failed (--wandb-key, --wandb-host https://wb.local): _AuthenticationError: API key "
         "must have 40+ characters, has 3."),
        ("init", TimeoutError("Run initialization has timed out after 90.0 sec."),
         "--use-wandb: W&B could not start the run (--wandb-team team, --wandb-project p): TimeoutError: Run "
         "initialization has timed out after 90.0 sec.; --wandb-mode offline keeps it on disk (`wandb sync` "
         "uploads it later)"),
    ],
)  # fmt: skip
def test_a_wandb_login_or_start_failure_is_one_line_naming_the_flags(monkeypatch, tmp_path, failing, error, expected):
    # wandb.login / wandb.init raised their own errors out of the Tracker, past the command line's one-line
    # handlers: a traceback (the key given with --wandb-key stays out of the line).
    from slime_app.guards import StartRefused

    fake = _FakeWandb()

    def fail(**kw):
        raise error

    monkeypatch.setattr(fake, failing, fail)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    args = _args("--use-wandb", "--wandb-key", "secret-key-123", "--wandb-host", "https://wb.local",
                 "--wandb-team", "team", "--wandb-project", "p", "--no-use-tensorboard")  # fmt: skip
    with pytest.raises(StartRefused) as caught:
        Tracker(args, str(tmp_path))
    assert str(caught.value) == expected and "secret-key-123" not in str(caught.value)


def test_a_nan_or_infinite_metric_is_written_and_said_once(tmp_path, caplog):
    # NaN and infinite values went to TensorBoard and W&B with no word (a dashboard shows them as gaps).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(_args("--tensorboard-dir", str(tmp_path / "tb")), str(tmp_path))
    with caplog.at_level("WARNING", logger="slime_app.tracking"):
        tracker.log(0, {"train/loss": 0.5, "train/grad_norm": 1.0})
        tracker.log(1, {"train/loss": float("nan"), "train/grad_norm": float("inf")})
        tracker.log(2, {"train/loss": float("nan"), "train/grad_norm": 2.0})  # still NaN: not said again
        tracker.log(3, {"train/loss": 0.25, "train/grad_norm": float("-inf")})
        tracker.log(4, {"train/loss": float("nan")})
    tracker.close()
    assert [r.getMessage() for r in caplog.records] == [
        "rollout 1: non-finite metrics: train/grad_norm=inf, train/loss=nan",
        "rollout 3: non-finite metrics: train/grad_norm=-inf",
        "rollout 4: non-finite metrics: train/loss=nan",
    ]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [0, 1, 2, 3, 4]  # written, not dropped
    assert math.isnan(acc.Scalars("train/loss")[1].value)


@pytest.mark.parametrize(("train_step", "scale"), [(False, 1), (True, 4)])
def test_a_resumed_run_replaces_the_points_of_the_rollouts_it_does_again(tmp_path, train_step, scale):
    # Resumed from the checkpoint of rollout 1 in the same folder, the run logged rollouts 2-3 again: TensorBoard
    # showed two points at each of those steps for every key. `begin_at` marks the restart (SummaryWriter's
    # purge_step), so TensorBoard keeps only the resumed run's points from there on.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flags = ("--tensorboard-dir", str(tmp_path / "tb"), *(["--wandb-always-use-train-step"] if train_step else []))
    first = Tracker(_args(*flags), str(tmp_path))
    for step in range(4):
        first.log(step, {"rollout/raw_reward": step / 10, "perf/update_weights_time": 1.0})
    first.close()
    resumed = Tracker(_args(*flags), str(tmp_path))
    resumed.begin_at(2)
    for step in (2, 3):
        resumed.log(step, {"rollout/raw_reward": 0.5 + step / 10})
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    points = [(e.step, round(e.value, 6)) for e in acc.Scalars("rollout/raw_reward")]
    assert points == [(0, 0.0), (1 * scale, 0.1), (2 * scale, 0.7), (3 * scale, 0.8)]
    # A key the resumed run did not log again keeps only the points before the restart.
    assert [e.step for e in acc.Scalars("perf/update_weights_time")] == [0, 1 * scale]


def test_a_metric_that_is_not_a_number_stops_the_run_in_one_line_naming_it(tmp_path):
    # A rollout function or custom log function returning {"rollout/dataset": "gsm8k"} ended the run in float()'s
    # traceback ("could not convert string to float") after the rollout had trained, naming neither key nor function.
    import numpy as np
    import torch

    from slime_app.guards import RunStopped

    args = _args("--tensorboard-dir", str(tmp_path / "tb"), "--custom-rollout-log-function-path", "my.log_fn")
    tracker = Tracker(args, str(tmp_path))
    # (The history keeps the curve's series only: the train reward and the eval scores.)
    tracker.log(0, {"rollout/raw_reward": np.float32(0.5), "eval/b": torch.tensor(2.0), "eval/c": True, "eval/d": None})
    assert {k: v for k, v in tracker.history.items()} == {"rollout/raw_reward": [(0, 0.5)], "eval/b": [(0, 2.0)],
                                                         "eval/c": [(0, 1.0)]}  # fmt: skip
    with pytest.raises(RunStopped) as caught:
        tracker.log(1, {"rollout/raw_reward": 0.5, "rollout/dataset": "gsm8k"})
    assert str(caught.value) == (
        "metric 'rollout/dataset' at rollout 1 is str 'gsm8k', not a number (from --custom-rollout-log-function-path "
        "my.log_fn?): TensorBoard and W&B take numbers only"
    )
    assert tracker.history["rollout/raw_reward"] == [(0, 0.5)]  # nothing of the row written
    tracker.close()


def test_a_new_run_in_the_folder_of_an_earlier_one_shows_only_its_own_points(tmp_path, caplog):
    # Run twice with the same --output-dir, the demo wrote both runs' points at every step (the original writes each
    # run into a new timestamped folder). A first run in an empty folder writes no restart mark.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flags = ("--tensorboard-dir", str(tmp_path / "tb"))
    for reward in (0.25, 0.75):
        tracker = Tracker(_args(*flags), str(tmp_path))
        with caplog.at_level("INFO", logger="slime_app.tracking"):
            tracker.begin_at(0)
        assert (tracker._tb_purge_step == 0) == (reward == 0.75)
        for step in range(3):
            tracker.log(step, {"rollout/raw_reward": reward})
        tracker.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"TensorBoard: {tmp_path / 'tb'} holds an earlier run's events; this run starts at rollout 0, so TensorBoard "
        "shows its points only (another --tensorboard-dir or --tb-experiment-name keeps both)"
    ]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("rollout/raw_reward")] == [(0, 0.75), (1, 0.75), (2, 0.75)]


def test_an_online_wandb_run_without_a_key_is_refused_instead_of_prompting(monkeypatch, tmp_path):
    # Pass 48: --wandb-host without --wandb-key called wandb.login(key=None, host=...), which waits on an
    # interactive prompt for the key on a terminal; now one line naming --wandb-key, before W&B is called.
    from slime_app.guards import StartRefused

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no netrc file: no stored key
    flags = ("--use-wandb", "--wandb-host", "https://wb.local", "--wandb-project", "p", "--no-use-tensorboard")
    with pytest.raises(StartRefused) as caught:
        Tracker(_args(*flags), str(tmp_path))
    assert str(caught.value) == (
        "--use-wandb: no W&B API key for https://wb.local (W&B would wait on an interactive prompt for one): give "
        "--wandb-key (or WANDB_API_KEY, or run `wandb login --host https://wb.local` once), or --wandb-mode offline"
    )
    assert fake.calls == []  # neither login nor init was called
    # A key stored by `wandb login --host` (netrc), or in the environment, is used as W&B would.
    (tmp_path / "netrc").write_text("machine wb.local\n  login user\n  password 0123456789abcdef\n")
    Tracker(_args(*flags), str(tmp_path))
    assert fake.calls[0] == ("login", {"key": None, "host": "https://wb.local"})
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    Tracker(_args(*flags), str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY")
    Tracker(_args(*flags, "--wandb-mode", "offline"), str(tmp_path))  # offline never logs in


def test_an_eval_only_run_in_the_folder_of_a_trained_run_writes_its_eval_as_its_own_run(tmp_path, caplog):
    # Before: an eval-only run (--num-rollout 0) into the folder of a training run added a second eval/* point at
    # step 0 of that run's series. As the original's new timestamped folder per run: its own subfolder now, the
    # training run's points untouched.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flags = ("--tensorboard-dir", str(tmp_path / "tb"))
    trained = Tracker(_args(*flags), str(tmp_path))
    trained.begin_at(0)
    for step in range(3):
        trained.log(step, {"eval/gsm8k": 0.1 * (step + 1)})
    trained.close()
    eval_only = Tracker(_args(*flags), str(tmp_path))
    with caplog.at_level("INFO", logger="slime_app.tracking"):
        eval_only.begin_eval_only()
    eval_only.log(0, {"eval/gsm8k": 0.9})
    eval_only.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("eval/gsm8k")] == [(0, 0.1), (1, 0.2), (2, 0.3)]
    (own,) = [p for p in (tmp_path / "tb").iterdir() if p.is_dir()]
    assert own.name.startswith("eval_only_") and eval_only.tensorboard_dir == str(own)
    acc = EventAccumulator(str(own))
    acc.Reload()
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("eval/gsm8k")] == [(0, 0.9)]
    assert caplog.records[-1].getMessage().startswith(f"TensorBoard: {tmp_path / 'tb'} holds an earlier run's events")
    # A first (eval-only) run in an empty folder writes there.
    fresh = Tracker(_args("--tensorboard-dir", str(tmp_path / "empty")), str(tmp_path))
    fresh.begin_eval_only()
    assert fresh.tensorboard_dir == str(tmp_path / "empty")


def test_eval_only_runs_started_in_the_same_second_each_get_their_own_folder(tmp_path, monkeypatch):
    # Before: both were named `eval_only_<second>`, so the second run's events went into the first one's folder.
    from slime_app import tracking

    monkeypatch.setattr(tracking.time, "strftime", lambda fmt: "20261207_120000")  # one start second for all
    flags = ("--tensorboard-dir", str(tmp_path / "tb"))
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out.tfevents.1.host").write_bytes(b"")  # an earlier training run's events
    dirs = []
    for _ in range(3):
        run = Tracker(_args(*flags), str(tmp_path))
        run.begin_eval_only()
        dirs.append(run.tensorboard_dir)
    names = ["eval_only_20261207_120000", "eval_only_20261207_120000_2", "eval_only_20261207_120000_3"]
    assert dirs == [str(tmp_path / "tb" / n) for n in names]
    assert sorted(p.name for p in (tmp_path / "tb").iterdir() if p.is_dir()) == names  # in start order
