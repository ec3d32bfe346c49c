"""`Run` resumed from `--load`: the rollout it starts at, the data cursor, the tracker's iteration, and the driver's
metric state (goodput totals, instability baselines, the eval that was due) carried across the resume.

Ray and the actors are replaced by fakes that record the calls in order (`slime_app_loop_fakes`).
"""

import json
import types

import pytest
from slime_app_loop_fakes import Actor, BuildTrainer, FakeRay, Tracker, Trainer, patch_ray, unbuilt_run

from slime_app import loop
from slime_app.run_state import run_state_path
from slime_app.train_actor import TrainerStart, TrainGroup
from slime_core.config import SlimeArgs


class _ResumedTrainer(BuildTrainer):
    """A trainer whose `--load` checkpoint resumes at rollout `start` (0: none there)."""

    def __init__(self, events, start):
        super().__init__(events)
        self.start = start

    def init(self, cfg):
        super().init(cfg)
        self.cfg = cfg
        return TrainerStart(rollout_id=self.start, compile_layers_flag=None)


@pytest.mark.parametrize(
    ("trainer_start", "fields", "start", "cursor"),
    [
        (3, {"load": "/ckpt"}, 3, [("load", 2)]),  # the checkpoint's next rollout; the cursor saved with it
        # --start-rollout-id: the cursor of the rollout before it, as the original (was the checkpoint's: 2).
        (3, {"load": "/ckpt", "start_rollout_id": 5}, 5, [("load", 4)]),
        (0, {"load": "/ckpt", "start_rollout_id": 5}, 5, [("load", 4)]),  # Megatron without a checkpoint: none read
        (3, {"load": "/ckpt", "start_rollout_id": 0}, 0, []),  # from the start: the cursor at the beginning
        (0, {}, 0, []),
        # An eval-only run draws no prompt: no cursor is read (it warned that the cursor's prompt count differed).
        (3, {"load": "/ckpt", "num_rollout": 0, "eval_interval": 1, "eval_prompt_data": ["a", "a.jsonl"]}, 3, []),
    ],
)
def test_the_data_cursor_is_the_one_before_the_start_rollout(monkeypatch, trainer_start, fields, start, cursor):
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 8, **fields})
    events = []
    unbuilt_run(monkeypatch, events, lambda: _ResumedTrainer(events, trainer_start))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.placement, run.tracker = cfg, None, Tracker()
    assert run.build() == start
    assert [e for e in events if e[0] == "load"] == cursor
    # TensorBoard hides what an earlier run logged from the start rollout on (Tracker.begin_at); not for eval only.
    assert getattr(run.tracker, "began_at", None) == (start if cfg.num_rollout else None)
    assert getattr(run.tracker, "eval_only", False) == (cfg.num_rollout == 0)  # its own TensorBoard run instead


class _PinningGroup(TrainGroup):
    """The actor's `TrainGroup` without Ray: records the config its ranks' `init` gets."""

    def __init__(self, events):
        self.role, self.events, self.rank_cfgs, self.actors = "actor", events, [], []

    def preload(self, cfg):
        self.events.append(("trainer.preload",))

    def _all(self, method, *args):
        if method == "init":
            self.rank_cfgs.append(args[0])
            return [TrainerStart(rollout_id=0, compile_layers_flag=None)]
        return [0]


@pytest.mark.parametrize(("tracker", "ckpt_step", "pinned"), [("4\n", None, 4), ("4", 2, 2), ("release", None, None),
                                                            (None, None, None)])  # fmt: skip
def test_every_rank_loads_the_iteration_the_tracker_named_once(monkeypatch, tmp_path, tracker, ckpt_step, pinned):
    # Issue 27: each rank read --load's tracker itself; a run saving into that folder meanwhile could make two ranks
    # (or the actor and the PPO critic) load two iterations. The driver reads it once and passes --ckpt-step.
    if tracker is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(tracker)
    fields = {"rollout_batch_size": 1, "num_rollout": 8, "load": str(tmp_path), "ckpt_step": ckpt_step}
    cfg = SlimeArgs.from_dict(fields)
    events = []
    trainer = _PinningGroup(events)
    unbuilt_run(monkeypatch, events, lambda: trainer)
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.placement, run.tracker = cfg, None, Tracker()
    run.build()
    assert [c.ckpt_step for c in trainer.rank_cfgs] == [pinned]
    assert run.cfg.ckpt_step == ckpt_step  # the run's own config is unchanged


def test_a_run_whose_start_is_past_num_rollout_says_it_has_nothing_to_train(monkeypatch, caplog):
    # Resumed after its last rollout, the run started Ray, the engines and the trainer, trained nothing and ended
    # with no word (as the original). (--start-rollout-id past --num-rollout is refused with the flags.)
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 3, "load": "/ckpt"})
    events = []
    patch_ray(monkeypatch, FakeRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.tracker = cfg, Actor(events), types.SimpleNamespace(start=lambda *a: None)
    run.trainer = Trainer(events)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    monkeypatch.setattr(run, "build", lambda: 5, raising=False)
    with caplog.at_level("WARNING", logger=loop.__name__):
        run.run()
    assert events == []  # no rollout, no train, no save
    assert [r.getMessage() for r in caplog.records if r.name == loop.__name__] == [
        "nothing to train: the run starts at rollout 5 (--load /ckpt) and --num-rollout is 3; raise --num-rollout "
        "to train on"
    ]


class _TokenRay(FakeRay):
    """Each rollout generates 10 tokens and trains 4 (`goodput/tokens_*`, as the rollout manager reports them)."""

    def get(self, ref, timeout=None):
        out = super().get(ref, timeout)
        if ref[0] == "generate":
            return out[0], {**out[1], "goodput/tokens_generated": 10.0, "goodput/tokens_trained": 4.0}
        return out


def _run_from(monkeypatch, cfg, start):
    """`Run.run` from rollout `start` (what `build` returned) over the fakes; returns `{rollout: logged metrics}`."""
    events = []
    patch_ray(monkeypatch, _TokenRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.tracker = cfg, Actor(events), Tracker()
    run.tracker.start = lambda *args: None
    run.trainer, run.last_hf_export = Trainer(events), None
    run.goodput, run.instability = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    monkeypatch.setattr(run, "build", lambda: start, raising=False)
    run.run()
    return run.tracker.logged


def test_cumulative_goodput_goes_on_across_a_resume(monkeypatch, tmp_path):
    """`goodput/cum/*` of a resumed run count from the run's first rollout, as an uninterrupted run's do.

    They restarted from zero at the resumed rollout (a drop in every cumulative curve, and an end-of-run report of
    the resumed part only): the meter's totals were not kept with the checkpoint.
    """
    ckpt = tmp_path / "ckpt"
    fields = {"rollout_batch_size": 1, "num_rollout": 4, "save": str(ckpt), "save_interval": 2}
    straight = _run_from(monkeypatch, SlimeArgs.from_dict(fields), 0)
    assert [straight[r]["goodput/cum/tokens_generated"] for r in range(4)] == [10.0, 20.0, 30.0, 40.0]
    saved = json.loads(run_state_path(ckpt, 1).read_text())["goodput"]
    assert saved["num_rollouts"] == 2 and saved["tokens"]["generated"] == 20.0 and saved["tokens"]["trained"] == 8.0
    # Resumed from the checkpoint of rollout 1 (its tracker named it; `build` returns the next rollout).
    resumed = _run_from(monkeypatch, SlimeArgs.from_dict({**fields, "load": str(ckpt)}), 2)
    assert [resumed[r]["goodput/cum/tokens_generated"] for r in (2, 3)] == [30.0, 40.0]
    assert resumed[3]["goodput/cum/trained_fraction"] == pytest.approx(0.4)


@pytest.mark.parametrize(("start", "fields", "evals"), [
    (2, {}, [("eval", 2), ("eval", 4)]),  # the eval after rollout 1 was due: run before rollout 2
    (3, {}, [("eval", 4)]),  # none was due after rollout 2
    (4, {}, [("eval", 4)]),  # after the last rollout: the final model's eval, and nothing to train
    (2, {"start_rollout_id": 2}, [("eval", 4)]),  # not the weights of rollout 1
])  # fmt: skip
def test_a_resumed_run_evaluates_the_checkpoint_whose_eval_was_due(monkeypatch, tmp_path, start, fields, evals):
    # The eval after a saved rollout runs after its save and weight sync: a run stopped in between committed the
    # checkpoint, and the run resumed from it started at the next rollout, so that checkpoint never had its eval/*.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 4, "eval_prompt_data": ["demo", "/e.jsonl"],
                               "eval_interval": 2, "save": str(tmp_path), "load": str(tmp_path), **fields})  # fmt: skip
    logged = _run_from(monkeypatch, cfg, start)
    assert sorted(step for step, metrics in logged.items() if "eval/demo" in metrics) == [e[1] for e in evals]


def test_the_run_state_of_a_checkpoint_holds_no_eval_after_it(monkeypatch, tmp_path):
    # The resume runs that eval again (above): kept in the state as well, the curve and the reward-vs-eval rule had
    # it twice.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 4, "eval_prompt_data": ["demo", "/e.jsonl"],
                               "eval_interval": 2, "save": str(tmp_path), "save_interval": 2})  # fmt: skip
    logged = _run_from(monkeypatch, cfg, 0)
    assert sorted(step for step, metrics in logged.items() if "eval/demo" in metrics) == [0, 2, 4]
    state = json.loads(run_state_path(tmp_path, 1).read_text())
    assert state["instability"]["last_eval"] == {"eval/demo": [0, 0.25]}  # the eval before training, not the one at 2


def test_a_finished_run_extended_from_its_last_checkpoint_evaluates_it_again(monkeypatch, tmp_path):
    # A run's last rollout is always evaluated (at x = num_rollout) and saved. Extended with --load and a larger
    # --num-rollout, the resumed run hides that point in TensorBoard (`Tracker.begin_at`: purge from its start, x =
    # num_rollout) and did not evaluate again, its own schedule not making that rollout the last: the first run's
    # final eval was gone from the curves.
    common = {"rollout_batch_size": 1, "eval_prompt_data": ["demo", "/e.jsonl"], "eval_interval": 2,
              "save": str(tmp_path)}  # fmt: skip
    first = _run_from(monkeypatch, SlimeArgs.from_dict({**common, "num_rollout": 3}), 0)
    assert sorted(step for step, metrics in first.items() if "eval/demo" in metrics) == [0, 2, 3]
    extended = _run_from(monkeypatch, SlimeArgs.from_dict({**common, "num_rollout": 6, "load": str(tmp_path)}), 3)
    assert sorted(step for step, metrics in extended.items() if "eval/demo" in metrics) == [3, 4, 6]
    # Without eval in the extended run, none runs at its start either.
    quiet = {**common, "num_rollout": 6, "load": str(tmp_path), "eval_interval": None, "eval_prompt_data": None}
    assert not any("eval/demo" in m for m in _run_from(monkeypatch, SlimeArgs.from_dict(quiet), 3).values())


class _Killed(BaseException):
    """A SIGKILL of the driver at this point: nothing after it runs (not an Exception: no handler turns it into a
    save error)."""


class _TrackerTrainer(Trainer):
    """Writes the tracker as the backends do (`latest_checkpointed_iteration.txt`: the last committed rollout id) and
    is killed right after it names rollout `kill_after`."""

    def __init__(self, events, root, kill_after):
        super().__init__(events)
        self.root, self.kill_after = root, kill_after

    def save(self, rollout_id, commit=True):
        super().save(rollout_id, commit)
        if commit:
            self.commit_save(rollout_id)

    def commit_save(self, rollout_id):
        (self.root / "latest_checkpointed_iteration.txt").write_text(str(rollout_id))
        if rollout_id == self.kill_after:
            raise _Killed


@pytest.mark.parametrize("kill", ["after_the_run_state", "after_the_tracker"])
def test_a_run_killed_between_its_run_state_and_tracker_writes_resumes_with_its_goodput(monkeypatch, tmp_path, kill):
    # Issue 27: the trainer's save wrote the tracker and the loop wrote `run_state_<id>.json` after the weight sync:
    # a SIGKILL in between left a checkpoint named by the tracker without its run state, and the resumed run
    # restarted `goodput/cum/*` (and the instability baselines and the curve) from zero.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    fields = {"rollout_batch_size": 1, "num_rollout": 4, "save": str(ckpt), "save_interval": 1}
    events = []
    patch_ray(monkeypatch, _TokenRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    cfg = SlimeArgs.from_dict(fields)
    run.cfg, run.manager, run.tracker = cfg, Actor(events), Tracker()
    run.tracker.start = lambda *args: None
    run.trainer, run.last_hf_export = _TrackerTrainer(events, ckpt, kill_after=1), None
    run.goodput, run.instability = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    monkeypatch.setattr(run, "build", lambda: 0, raising=False)
    real_save_run_state = loop.save_run_state
    if kill == "after_the_run_state":  # the run state of rollout 1 is written; the kill comes before anything else

        def save_then_die(root, rollout_id, parts):
            real_save_run_state(root, rollout_id, parts)
            if rollout_id == 1:
                raise _Killed

        monkeypatch.setattr(loop, "save_run_state", save_then_die)
    with pytest.raises(_Killed):
        run.run()
    monkeypatch.setattr(loop, "save_run_state", real_save_run_state)
    # The resume point is what the tracker names; its run state must be there, with the rollouts through it.
    committed = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert run_state_path(ckpt, committed).is_file()
    resumed = _run_from(monkeypatch, SlimeArgs.from_dict({**fields, "load": str(ckpt)}), committed + 1)
    assert [resumed[r]["goodput/cum/tokens_generated"] for r in range(committed + 1, 4)] == [
        10.0 * (r + 1) for r in range(committed + 1, 4)
    ]
