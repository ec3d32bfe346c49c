"""The run's phases: events, plain log lines without a terminal, the live line's text in one."""

import io
import itertools
import logging
import threading
import types

import pytest
from rich.console import Console

from slime_app import loop, restore, rollout_schedule
from slime_app.progress import PhaseEvent, RunProgress, heartbeat_delays
from slime_core.config import SlimeArgs


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _plain(clock=None):
    console = Console(file=io.StringIO(), force_terminal=False)
    return RunProgress(console, clock=clock or FakeClock())


def test_without_a_terminal_each_phase_is_two_plain_log_lines(caplog):
    clock = FakeClock()
    progress = _plain(clock)
    assert not progress.live
    progress.start()  # nothing to draw
    with caplog.at_level(logging.INFO, logger="slime_app.progress"):
        with progress.phase("engines", detail="--rollout-engine reference"):
            clock.now += 12.5
        with progress.phase("eval", rollout_id=0):
            clock.now += 112.0
    assert [r.getMessage() for r in caplog.records] == [
        "engines (--rollout-engine reference): started",
        "engines (--rollout-engine reference): done in 12.5 s",
        "eval 0: started",
        "eval 0: done in 112.0 s",
    ]
    assert progress.events == [
        PhaseEvent(kind="start", name="engines", rollout_id=None),
        PhaseEvent(kind="end", name="engines", rollout_id=None, seconds=12.5),
        PhaseEvent(kind="start", name="eval", rollout_id=0),
        PhaseEvent(kind="end", name="eval", rollout_id=0, seconds=112.0),
    ]
    progress.stop()
    assert progress.console.file.getvalue() == ""  # no bar, no escape codes in a log file


def test_heartbeat_delays_double_from_a_minute_up_to_ten():
    assert list(itertools.islice(heartbeat_delays(), 7)) == [60, 120, 240, 480, 600, 600, 600]


class GatedClock(FakeClock):
    """A fake clock whose readings from other threads (the heartbeat) wait until the test has set the time."""

    def __init__(self):
        super().__init__()
        self.ready = threading.Event()

    def __call__(self):
        if threading.current_thread() is not threading.main_thread():
            assert self.ready.wait(30)
        return self.now


class _Seen(logging.Handler):
    """Sets an event when a record's message holds `text`."""

    def __init__(self, text):
        super().__init__()
        self.text, self.event = text, threading.Event()

    def emit(self, record):
        if self.text in record.getMessage():
            self.event.set()


def test_without_a_terminal_a_long_phase_says_it_is_still_running(caplog):
    # Ray's start-up took 8 min on a loaded 2-core machine with no line between "started" and "done" in a log file.
    clock = GatedClock()
    console = Console(file=io.StringIO(), force_terminal=False)
    progress = RunProgress(console, clock=clock, heartbeat_s=0.01)
    seen = _Seen("still running")
    logger = logging.getLogger("slime_app.progress")
    logger.addHandler(seen)
    try:
        with caplog.at_level(logging.INFO, logger="slime_app.progress"):
            with progress.phase("ray", detail="local node and placement group"):
                clock.now += 75.0
                clock.ready.set()
                assert seen.event.wait(30), "no still-running line while the phase ran"
                clock.now += 5.0
            after_end = len(caplog.records)
            seen.event.clear()
            assert not seen.event.wait(0.2)  # the phase ended: its heartbeat stopped
    finally:
        logger.removeHandler(seen)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "ray (local node and placement group): started"
    assert messages[1] == "ray (local node and placement group): still running after 75 s"
    assert messages[-1] == "ray (local node and placement group): done in 80.0 s"
    assert len(caplog.records) == after_end


def test_only_the_innermost_phase_says_it_is_still_running(caplog):
    clock = GatedClock()
    progress = RunProgress(Console(file=io.StringIO(), force_terminal=False), clock=clock, heartbeat_s=0.01)
    seen = _Seen("still running")
    logger = logging.getLogger("slime_app.progress")
    logger.addHandler(seen)
    try:
        with caplog.at_level(logging.INFO, logger="slime_app.progress"):
            with progress.phase("rollout", rollout_id=4):
                with progress.phase("weight sync"):
                    clock.now += 61.0
                    clock.ready.set()
                    assert seen.event.wait(30)
                    seen.event.clear()
                    assert seen.event.wait(30)  # a second one: the outer phase's thread kept quiet meanwhile
    finally:
        logger.removeHandler(seen)
    running = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
    assert len(running) >= 2 and set(running) == {"weight sync: still running after 61 s"}


def test_a_failing_phase_still_ends_and_says_it_failed(caplog):
    clock = FakeClock()
    progress = _plain(clock)
    with caplog.at_level(logging.INFO, logger="slime_app.progress"), pytest.raises(RuntimeError, match="boom"):
        with progress.phase("train", rollout_id=3):
            clock.now += 2.5
            raise RuntimeError("boom")
    assert [r.getMessage() for r in caplog.records] == ["train 3: started", "train 3: failed after 2.5 s: RuntimeError"]
    assert progress.events[-1] == PhaseEvent(kind="end", name="train", rollout_id=3, seconds=2.5, error="RuntimeError")


def test_printed_lines_are_not_read_as_markup():
    progress = _plain()
    line = "rollout 3: reward [bold]0.5[/bold] sample '[x=1]' path [/tmp/a]"
    progress.print(line)  # a closing tag with nothing open raised MarkupError
    assert progress.console.file.getvalue() == line + "\n"


def test_metric_lines_print_user_dataset_names_verbatim(tmp_path):
    from slime_app.tracking import Tracker

    progress = _plain()
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "use_tensorboard": False})
    tracker = Tracker(cfg, str(tmp_path), progress)
    tracker.eval_line(2, {"eval/gsm8k[test]": 0.5, "eval/[bold]": 1.0})
    assert progress.console.file.getvalue() == "eval @ rollout 2 eval/gsm8k[test]=0.5 eval/[bold]=1\n"


def _screen(progress: RunProgress) -> str:
    """What the live display shows now, as plain text."""
    out = Console(file=io.StringIO(), width=120, force_terminal=False)
    out.print(progress._progress.get_renderable())
    return out.file.getvalue()


def test_in_a_terminal_the_line_shows_the_current_phase_and_the_rollout_count():
    clock = FakeClock()
    progress = RunProgress(Console(file=io.StringIO(), force_terminal=True, width=120), clock=clock)
    assert progress.live
    progress.set_rollouts(0, 4)
    with progress.phase("model load"):
        with progress.phase("eval", rollout_id=0):
            clock.now += 75
            assert "eval 0 1:15" in _screen(progress) and "0/4" in _screen(progress)  # a 75 s eval, not a silent 0/4
        assert "model load 1:15" in _screen(progress)  # back to the phase around it
    progress.advance()
    assert "1/4" in _screen(progress)


class _Call:
    def __init__(self, result):
        self.result = result

    def remote(self, *args):
        return self.result


class _Manager:
    """The rollout manager's calls, each answering at once (ray.get is the identity here)."""

    generate = _Call(([], {"rollout/raw_reward": 0.5}))
    eval = _Call({"eval/d": 0.25})
    save = _Call(None)


def _loop_phases(monkeypatch, compile_layers_flag=None, critic_compile_layers_flag=None, **fields):
    """The (name, rollout id) of every phase two steps of the loop start, with fake actors; the trainer's `init`
    reported `compile_layers_flag` (`Run.compile_layers_flag`, None: eager layers) and, PPO, the critic's
    `critic_compile_layers_flag`."""
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 2, **fields})

    class Trainer:
        def train(self, rollout_id, refs):
            return {"loss": 0.1}

        def save(self, rollout_id, commit=True):
            pass

        def commit_save(self, rollout_id):
            pass

    fake_ray = type("R", (), {"get": staticmethod(lambda ref, **kw: ref)})()
    for module in (loop, restore, rollout_schedule):  # the loop, its rollout schedule and restorer
        monkeypatch.setattr(module, "ray", fake_ray)
    run = loop.Run.__new__(loop.Run)
    run.cfg, run.manager, run.trainer = cfg, _Manager(), Trainer()
    run.progress = _plain()
    run.tracker = type("T", (), {"log": lambda *a: None, "rollout_done": lambda *a: None,
                                 "eval_line": lambda *a: None, "state": lambda self: {}})()  # fmt: skip
    monkeypatch.setattr(loop, "save_run_state", lambda *a: None)  # a save's run state goes nowhere here
    run.start_rollout_id, run.compile_layers_flag = 0, compile_layers_flag
    run.critic_compile_layers_flag = critic_compile_layers_flag
    run.placement = types.SimpleNamespace(use_gpu=True)  # on GPUs, where layers compile by default
    run.goodput, run.instability = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    monkeypatch.setattr(run.restorer, "push", lambda version: {"update_weights_time": 0.1})
    run.rollouts = loop.Rollouts(run.manager, cfg.num_rollout, ahead=False, update_weights_interval=1)
    for rollout_id in range(cfg.num_rollout):
        run.step(rollout_id)
    return [(e.name, e.rollout_id) for e in run.progress.events if e.kind == "start"]


def test_the_loop_reports_rollout_train_save_sync_and_eval_phases(monkeypatch):
    started = _loop_phases(monkeypatch, eval_prompt_data=["d", "/e.jsonl"], eval_interval=2, save="/ckpt",
                           save_interval=2)  # fmt: skip
    assert started == [
        ("rollout", 0), ("train", 0), ("weight sync", None),
        ("rollout", 1), ("train", 1), ("save", 1), ("weight sync", None), ("eval", 2),
    ]  # fmt: skip


@pytest.mark.parametrize(("train_backend", "megatron_args", "reported", "first"), [
    # Issue 27: a Qwen3-MoE Megatron run on GPUs (TP = CP = 1, flag unset) was named "compile+train" by the loop's own
    # copy of the rule, which left out the MoE exception `slime_train_megatron.settings.compiles_layers` makes: the
    # trainer reports that it did not compile.
    ("megatron", [], None, "train"),
    ("megatron", [], "--megatron-compile-layers", "compile+train"),  # a dense model
    ("megatron", ["--megatron-compile-layers"], "--megatron-compile-layers", "compile+train"),
    ("fsdp", [], "--fsdp-compile-layers", "compile+train"),
    ("fsdp", [], None, "train"),  # e.g. --lora-rank or --true-on-policy-mode: eager
])  # fmt: skip
def test_the_first_step_is_named_compile_only_where_the_trainer_reported_compiling(
    monkeypatch, caplog, train_backend, megatron_args, reported, first
):
    with caplog.at_level(logging.INFO, logger="slime_app.progress"):
        started = _loop_phases(monkeypatch, compile_layers_flag=reported, train_backend=train_backend,
                               megatron_args=megatron_args)  # fmt: skip
    assert [p for p in started if p[0] not in ("weight sync", "rollout")] == [(first, 0), ("train", 1)]
    named = [r.getMessage() for r in caplog.records if "the first step compiles" in r.getMessage()]
    assert all(f"{reported}: the first step compiles" in m for m in named) and bool(named) is (reported is not None)


@pytest.mark.parametrize(("actor", "critic", "critic_only", "expected"), [
    # Issue 27: the critic's init reported nothing, so a PPO run whose critic compiles and actor does not named its
    # first step "train"; with critic-only steps the actor's first step (rollout 1 here) was not named at all, and
    # rollout 0 (the critic's alone) was named after the actor's flag.
    (None, "--fsdp-compile-layers", 0,
     [("compile+train", 0, "--fsdp-compile-layers: the critic's first step compiles"), ("train", 1, "")]),
    ("--fsdp-compile-layers", "--fsdp-compile-layers", 0,
     [("compile+train", 0, "--fsdp-compile-layers: the critic's and the actor's first steps compile"),
      ("train", 1, "")]),
    ("--megatron-compile-layers", "--megatron-compile-layers", 1,
     [("compile+train", 0, "--megatron-compile-layers: the critic's first step compiles"),
      ("compile+train", 1, "--megatron-compile-layers: the actor's first step compiles")]),
    ("--megatron-compile-layers", None, 1,
     [("train", 0, ""), ("compile+train", 1, "--megatron-compile-layers: the actor's first step compiles")]),
    (None, None, 0, [("train", 0, ""), ("train", 1, "")]),
])  # fmt: skip
def test_a_ppo_run_names_the_step_where_the_critic_or_the_actor_compiles(monkeypatch, actor, critic, critic_only,
                                                                         expected):  # fmt: skip
    backend = "megatron" if "megatron" in str(actor) + str(critic) else "fsdp"
    phases: list[tuple[str, int, str]] = []
    real_phase = loop.Run._phase

    def phase(self, name, rollout_id=None, detail=""):
        phases.append((name, rollout_id, detail))
        return real_phase(self, name, rollout_id, detail)

    monkeypatch.setattr(loop.Run, "_phase", phase)
    _loop_phases(monkeypatch, compile_layers_flag=actor, critic_compile_layers_flag=critic, train_backend=backend,
                 advantage_estimator="ppo", num_critic_only_steps=critic_only)  # fmt: skip
    assert [p for p in phases if p[0] in ("train", "compile+train")] == expected
