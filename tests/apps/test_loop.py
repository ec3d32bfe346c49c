"""`Run.step` is the one training step of both schedules; what differs is when rollouts start and weights move.

Ray and the actors are replaced by fakes that record the calls in order (no processes are started).
"""

import contextlib
import time
import types

import pytest
from ray.exceptions import GetTimeoutError
from slime_app_loop_fakes import Actor, BuildTrainer, FakeRay, Tracker, Trainer, patch_ray, unbuilt_run

from slime_app import loop
from slime_app.failures import SaveFailed
from slime_core.config import SlimeArgs


def _run(monkeypatch, trainer=None, **fields):
    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 3, "eval_prompt_data": ["demo", "/e.jsonl"], **fields}
    )
    events = []
    patch_ray(monkeypatch, FakeRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.tracker = cfg, Actor(events), Tracker()
    run.trainer = Trainer(events) if trainer is None else trainer(events)
    run.start_rollout_id, run.last_hf_export = 0, None
    run.goodput, run.instability = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    run.rollouts = loop.Rollouts(
        run.manager, cfg.num_rollout, ahead=cfg.async_train, update_weights_interval=cfg.update_weights_interval
    )
    run.train_end = time.perf_counter()  # as `run` does once the trainer is up
    for rollout_id in range(cfg.num_rollout):
        run.step(rollout_id)
    run.tracker.history, run.tracker.tensorboard_dir, run.output_dir = [], None, "/unused"
    run.goodput.num_rollouts = 0
    logged = run.tracker.logged
    logged["outputs"] = run.finish()
    return events, logged


def test_sync_step_reads_rollout_train_save_sync_eval(monkeypatch, tmp_path):
    events, logged = _run(monkeypatch, save=str(tmp_path / "ckpt"), save_interval=2, eval_interval=2)
    # The tracker names a checkpoint (trainer.commit) once its run state is written: `Run._commit`.
    assert events == [
        ("got", 0), ("train", 0), ("update_weights", 1),
        ("got", 1), ("train", 1), ("save", 1), ("trainer.save", 1), ("update_weights", 2), ("trainer.commit", 1),
        ("eval", 2),
        ("got", 2), ("train", 2), ("save", 2), ("trainer.save", 2), ("update_weights", 3), ("trainer.commit", 2),
        ("eval", 3),
    ]  # fmt: skip
    assert {k for k in logged[1] if not k.startswith("goodput/")} == {
        "rollout/raw_reward", "train/loss", "perf/train_time", "perf/save_time", "perf/update_weights_time",
        "perf/step_time", "perf/rollout_wait_time", "perf/train_wait_time", "perf/wait_time_ratio",
    }  # fmt: skip
    # The original's trainer idle time: between train calls, i.e. this step's rollout wait and the last step's
    # save, weight sync and eval; its ratio to the whole span since the last train call ended.
    for step in (0, 1, 2):
        wait, ratio = logged[step]["perf/train_wait_time"], logged[step]["perf/wait_time_ratio"]
        assert wait >= logged[step]["perf/rollout_wait_time"] and 0 < ratio < 1
    assert logged[1]["goodput/cum/wall_time"] >= logged[1]["perf/step_time"]  # steps 0 and 1 + the eval
    assert logged[2]["eval/demo"] == 0.25  # the eval after rollout 1 is logged at rollout 2


@pytest.mark.parametrize("interval", [1, 2])
def test_async_step_generates_one_ahead_and_moves_weights_between_generations(monkeypatch, interval):
    events, logged = _run(monkeypatch, async_train=True, update_weights_interval=interval, eval_interval=3)
    if interval == 1:
        assert events == [
            ("got", 0), ("train", 0), ("waited", 1), ("update_weights", 1),
            ("got", 1), ("train", 1), ("waited", 2), ("update_weights", 2),
            ("got", 2), ("train", 2), ("eval", 3),  # the last rollout has no next generation to update for
        ]  # fmt: skip
    else:
        assert events == [
            ("got", 0), ("train", 0),
            ("got", 1), ("train", 1), ("waited", 2), ("update_weights", 2),
            ("got", 2), ("train", 2), ("eval", 3),
        ]  # fmt: skip
    # Each push at the weight version it pushed (the weights the next rollout generates with).
    assert sorted(step for step, m in logged.items() if "perf/update_weights_time" in m) == (
        [1, 2] if interval == 1 else [2]
    )


class _PointsTracker(Tracker):
    """The fake tracker, keeping every point: `(step, key)` in the order logged."""

    def __init__(self):
        super().__init__()
        self.points = []

    def log(self, step, metrics):
        self.points += [(step, key) for key in metrics]
        super().log(step, metrics)


def test_each_weight_push_is_one_point_at_the_version_it_pushed(monkeypatch):
    # The first push (`build`: `tracker.log(start, sync_weights(start))`) and the push after rollout 0 were both
    # logged at x = 0: two points per perf/update_weights_* key (and the memory swaps) at one step in TensorBoard.
    # The original logs at rollout N the push made before it (its Timer, reported by the rollout's train).
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 3, "colocate": True})
    events = []
    patch_ray(monkeypatch, FakeRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.tracker, run.trainer = cfg, Actor(events), _PointsTracker(), Trainer(events)
    run.start_rollout_id = 0
    run.goodput, run.instability = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    run.rollouts = loop.Rollouts(run.manager, 3, ahead=False, update_weights_interval=1)
    run.train_end = time.perf_counter()
    run.tracker.log(0, run.sync_weights(0))  # what `build` logs
    for rollout_id in range(3):
        run.step(rollout_id)
    points = run.tracker.points
    assert sorted({p for p in points if points.count(p) > 1}) == []
    for key in ("perf/update_weights_time", "perf/sleep_time", "perf/engine_resume_kv_cache_time"):
        assert [step for step, k in points if k == key] == [0, 1, 2, 3]
    assert [step for step, k in points if k == "perf/step_time"] == [0, 1, 2]
    # The step's goodput still counts its own push (its weight-sync time is that step's wall time).
    assert all(run.tracker.logged[step]["goodput/time/weight_sync"] > 0 for step in range(3))


def test_colocated_step_swaps_memory_around_training_and_times_each_swap(monkeypatch):
    events, logged = _run(monkeypatch, colocate=True, num_rollout=1, eval_prompt_data=None)
    assert events == [
        ("got", 0), ("offload",), ("trainer.wake_up",), ("train", 0),
        ("onload", ["weights"]), ("update_weights", 1), ("trainer.sleep",), ("onload", ["kv_cache", "cuda_graph"]),
    ]  # fmt: skip
    # Around training at the rollout; around the push at the weight version it pushed. The trainer's offload and onload
    # have the original's names (its @timer'd sleep and wake_up: perf/sleep_time, perf/wake_up_time); they were
    # perf/trainer_sleep_time and perf/trainer_wake_up_time, so a dashboard on the original's keys showed nothing.
    for step, swaps in ((0, {"perf/engine_release_time", "perf/wake_up_time"}),
                        (1, {"perf/engine_resume_weights_time", "perf/sleep_time",
                             "perf/engine_resume_kv_cache_time"})):  # fmt: skip
        assert swaps <= set(logged[step]) and all(logged[step][k] >= 0.0 for k in swaps)


def test_an_eval_config_alone_is_evaluated(monkeypatch, tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - {name: demo, path: /e.jsonl, rm_type: math}\n")
    events, logged = _run(monkeypatch, eval_prompt_data=None, eval_config=str(config), eval_interval=3)
    assert ("eval", 3) in events and logged[3]["eval/demo"] == 0.25


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"offload_train": False}, [
            ("got", 0), ("offload",), ("train", 0), ("onload", ["weights"]), ("update_weights", 1),
            ("onload", ["kv_cache", "cuda_graph"]),
        ]),
        ({"offload_rollout": False}, [
            ("got", 0), ("trainer.wake_up",), ("train", 0), ("update_weights", 1), ("trainer.sleep",),
        ]),
        ({"offload_train": False, "offload_rollout": False}, [("got", 0), ("train", 0), ("update_weights", 1)]),
    ],
)  # fmt: skip
def test_colocated_side_that_is_not_offloaded_stays_resident(monkeypatch, flags, expected):
    events, logged = _run(monkeypatch, colocate=True, num_rollout=1, eval_prompt_data=None, **flags)
    assert events == expected
    assert ("perf/sleep_time" in logged.get(1, {})) == flags.get("offload_train", True)  # with the push
    assert ("perf/engine_release_time" in logged[0]) == flags.get("offload_rollout", True)


def test_save_hf_exports_at_every_save_with_the_rollout_id_filled_in(monkeypatch, tmp_path):
    # The original exports inside save_model (slime/backends/megatron_utils/actor.py), to
    # save_hf.format(rollout_id=rollout_id); issue 27: it used to export once, at the end, to "{rollout_id}".
    events, logged = _run(
        monkeypatch,
        save=str(tmp_path / "ckpt"),
        save_interval=2,
        save_hf="/hf/iter_{rollout_id}",
        eval_prompt_data=None,
    )
    saves = [e for e in events if e[0].startswith("trainer.save")]
    assert saves == [
        ("trainer.save_hf", "/hf/iter_1"), ("trainer.save", 1), ("trainer.save_hf", "/hf/iter_2"), ("trainer.save", 2)
    ]  # fmt: skip
    assert "perf/save_hf_time" in logged[1] and "perf/save_hf_time" not in logged[0]
    assert logged["outputs"] == {"hf_checkpoint": "/hf/iter_2", "checkpoints": str(tmp_path / "ckpt")}


class _Killed(BaseException):
    """The run's process dying mid-call (SIGKILL): nothing after it runs."""


def test_a_run_killed_during_an_hf_export_has_not_committed_that_rollouts_checkpoint(monkeypatch, tmp_path):
    """The checkpoint's tracker (written by `trainer.commit_save`) is the commit point of the export too.

    The export was written after it: a kill during the export of rollout 1 left iteration 1 committed, the resumed
    run started at rollout 2, and `--save-hf`'s rollout-1 folder (the final model, after the last rollout) was never
    written. Now the resume starts at rollout 1 again and exports it.
    """

    class KilledInExport(Trainer):
        def __init__(self, events):
            super().__init__(events)
            KilledInExport.last_events = events

        def save_hf(self, path):
            super().save_hf(path)
            if path == "/hf/iter_1":
                raise _Killed

    with pytest.raises(_Killed):
        _run(monkeypatch, KilledInExport, save=str(tmp_path / "ckpt"), save_interval=2, save_hf="/hf/iter_{rollout_id}",
             eval_prompt_data=None)  # fmt: skip
    events = KilledInExport.last_events
    assert ("trainer.save_hf", "/hf/iter_1") in events and ("trainer.save", 1) not in events


def test_save_hf_without_save_exports_after_the_last_rollout(monkeypatch):
    events, logged = _run(monkeypatch, save_hf="/hf/{rollout_id}", eval_prompt_data=None)
    assert [e for e in events if e[0].startswith("trainer.save")] == [("trainer.save_hf", "/hf/2")]
    assert logged["outputs"] == {"hf_checkpoint": "/hf/2"}


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_two_saves_give_two_loadable_hf_exports_fsdp(monkeypatch, tmp_path, make_tiny_qwen3, one_rank):
    """The real FSDP backend (one gloo rank, CPU) behind the loop: each save exports its own loadable folder."""
    import torch
    from transformers import AutoModelForCausalLM

    from slime_train_fsdp import FSDPTrainBackend

    source = make_tiny_qwen3(tmp_path / "model")
    fields = {"hf_checkpoint": str(source), "train_backend": "fsdp", "save": str(tmp_path / "ckpt")}
    backend = FSDPTrainBackend()
    backend.init(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 3, **fields}), with_ref=False)
    norm = "model.norm.weight"  # ones at init; "training" adds the rollout id + 1 to it

    class FSDPTrainer(Trainer):
        def train(self, rollout_id, batch_refs):
            super().train(rollout_id, batch_refs)
            with torch.no_grad():
                backend.model.get_parameter(norm).add_(rollout_id + 1.0)  # a stand-in for an optimizer step
            return {"train/loss": 1.0}

        def save(self, rollout_id, commit=True):
            super().save(rollout_id, commit)
            backend.save(rollout_id, commit=commit)

        def commit_save(self, rollout_id):
            super().commit_save(rollout_id)
            backend.commit_save(rollout_id)

        def save_hf(self, path):
            super().save_hf(path)
            backend.save_hf(path)

    template = str(tmp_path / "hf" / "iter_{rollout_id}")
    _run(monkeypatch, FSDPTrainer, save_interval=2, save_hf=template, eval_prompt_data=None, **fields)
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["iter_1", "iter_2"]  # no .tmp, no "{rollout_id}"
    for rollout_id, expected in ((1, 1.0 + 1 + 2), (2, 1.0 + 1 + 2 + 3)):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / f"iter_{rollout_id}", dtype=torch.float32)
        assert torch.equal(model.get_parameter(norm), torch.full((64,), expected)), rollout_id


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # Own GPUs: the warm-up overlaps the engines' start.
        ({}, ["start", "trainer.preload", "trainer.start_compile_warm_up", "engines up", "trainer.init"]),
        # Colocated: started gated (its CPU part) with the engines; on the GPU only once the engines measured their
        # free memory, and (swapping) released it.
        ({"colocate": True},
         ["start", "trainer.preload", "trainer.start_compile_warm_up gated", "engines up", "offload",
          "trainer.release_compile_warm_up", "trainer.init", "onload"]),
        ({"colocate": True, "offload_train": False, "offload_rollout": False, "async_train": True},
         ["start", "trainer.preload", "trainer.start_compile_warm_up gated", "engines up",
          "trainer.release_compile_warm_up", "trainer.init"]),
    ],
)  # fmt: skip
def test_build_starts_the_compile_warm_up_before_init_and_never_while_colocated_engines_start(
    monkeypatch, fields, expected
):
    """A warm-up on a GPU whose engine is measuring its free memory would shrink the engine's KV cache."""
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})
    events = []
    unbuilt_run(monkeypatch, events, lambda: BuildTrainer(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.placement, run.tracker = cfg, None, Tracker()
    assert run.build() == 0
    assert [e[0] for e in events] == expected


@pytest.mark.parametrize(
    ("fields", "detail"),
    [({}, "--rollout-engine reference"), ({"debug_train_only": True}, "none: --debug-train-only")],
)
def test_the_engines_phase_says_when_no_engine_starts(monkeypatch, fields, detail):
    # Reproducer: the original's SFT recipe (--debug-train-only) showed "engines (--rollout-engine reference):
    # started ... done in 19.5 s", though no engine starts.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rollout_engine": "reference", **fields})
    events, phases = [], []

    class Progress:
        def phase(self, name, rollout_id, detail):
            phases.append((name, detail))
            return contextlib.nullcontext()

    unbuilt_run(monkeypatch, events, lambda: BuildTrainer(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.placement, run.tracker, run.progress = cfg, None, Tracker(), Progress()
    run.build()
    assert phases[0] == ("engines", detail)


@pytest.mark.parametrize("reported", [None, "--megatron-compile-layers"])
def test_build_keeps_what_the_trainer_s_init_reported_about_compiling_its_layers(monkeypatch, reported):
    # The loop names the first step from this (`step`: "compile+train"), not from its own copy of a backend's rule.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron"})
    events = []
    unbuilt_run(monkeypatch, events, lambda: BuildTrainer(events, compile_layers_flag=reported))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.placement, run.tracker = cfg, None, Tracker()
    assert run.build() == 0
    assert run.compile_layers_flag == reported


class _HungSaveRay:
    """`ray.get` over fake refs: a manager save never answers (past `timeout`, Ray's GetTimeoutError)."""

    def __init__(self):
        self.timeouts = []

    def get(self, ref, timeout=None):
        self.timeouts.append(timeout)
        raise GetTimeoutError("Get timed out: some object(s) not ready.")


class _SaveManager:
    """The rollout manager's `save`, recording the concurrency group of each call."""

    def __init__(self):
        self.groups = []
        self.save = types.SimpleNamespace(remote=lambda rid: self._call(None, rid), options=self._options)

    def _options(self, concurrency_group):
        return types.SimpleNamespace(remote=lambda rid: self._call(concurrency_group, rid))

    def _call(self, group, rollout_id):
        self.groups.append(group)
        return ("save", rollout_id)


FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"


@pytest.mark.parametrize(
    ("fields", "group", "deadline", "flags"),
    [
        # Fully async: through its own group, not queued behind the collection of rollout N+1 in flight.
        ({"rollout_function_path": FULLY_ASYNC}, "save", 100 + loop.SAVE_GRACE_S, "(--plugin-timeout-secs)"),
        # Any other rollout: behind the generation in flight, which has its own deadline.
        ({}, None, 100 + 1000 + loop.SAVE_GRACE_S, "(--plugin-timeout-secs + --rollout-timeout-secs)"),
    ],
)
def test_a_hung_rollout_state_save_ends_the_run_in_one_line(monkeypatch, tmp_path, fields, group, deadline, flags):
    # Issue 27: the fully-async save queued behind the collection of rollout N+1 in the manager's default group,
    # which (--async) waits for this step's weights; the driver's ray.get had no timeout, so the run hung.
    cfg = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 3, "async_train": True, "save": str(tmp_path / "ckpt"),
        "plugin_timeout_secs": 100, "rollout_timeout_secs": 1000, **fields,
    })  # fmt: skip
    fake_ray = _HungSaveRay()
    patch_ray(monkeypatch, fake_ray)
    run = loop.Run.__new__(loop.Run)
    run.cfg, run.manager, run.trainer = cfg, _SaveManager(), Trainer([])
    run.rollouts = loop.Rollouts(run.manager, 3, ahead=True, update_weights_interval=1)
    run.rollouts._pending = ("generate", (1,))  # rollout 1 is being generated while rollout 0 is saved
    with pytest.raises(SaveFailed) as err:
        run.save(0)
    assert run.manager.groups == [group] and fake_ray.timeouts == [deadline]
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"saving the checkpoint of rollout 0 to --save {tmp_path / 'ckpt'} failed: ")
    assert f"did not finish within {deadline:g} s {flags}" in message
    assert "no complete checkpoint there yet" in message


class _GenerateLog(Actor):
    """The rollout manager, recording when each generation is started (not when it is taken)."""

    def __getattr__(self, name):
        if name != "generate":
            return super().__getattr__(name)

        def remote(*args):
            self.events.append(("generate", *args))
            return (name, args)

        return types.SimpleNamespace(remote=remote)


def test_async_saves_the_data_cursor_before_the_next_rollout_draws(monkeypatch, tmp_path):
    # Issue 27: with --async the cursor save of rollout N queued behind the generation of N+1, so it held N+1's
    # prompts as drawn and a resume at N+1 skipped them (as the original's train_async.py). Now the cursor is saved
    # between the two generations (what a sync run saves), and the trainer's checkpoint still follows training.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 3, "async_train": True,
                               "save": str(tmp_path / "ckpt"), "save_interval": 2})  # fmt: skip
    events = []
    patch_ray(monkeypatch, FakeRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.tracker = cfg, _GenerateLog(events), Tracker()
    run.trainer = Trainer(events)
    run.start_rollout_id, run.last_hf_export = 0, None
    run.goodput, run.instability = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    run.rollouts = loop.Rollouts(run.manager, cfg.num_rollout, ahead=True, update_weights_interval=1,
                                 before_next=run._save_cursor_early)  # fmt: skip
    for rollout_id in range(cfg.num_rollout):
        run.step(rollout_id)
    assert [e for e in events if e[0] in ("generate", "save", "trainer.save", "train")] == [
        ("generate", 0), ("generate", 1), ("train", 0),
        ("save", 1), ("generate", 2), ("train", 1), ("trainer.save", 1),  # was: ("generate", 2) before ("save", 1)
        ("save", 2), ("train", 2), ("trainer.save", 2),  # the last rollout: no generation follows
    ]  # fmt: skip


@pytest.mark.parametrize(("fields", "evals"), [({}, []), ({"eval_interval": 5}, [("eval", 0)]),
                                               ({"eval_interval": 5, "skip_eval_before_train": True}, [])])  # fmt: skip
def test_eval_data_without_eval_interval_is_never_evaluated_as_in_the_original(monkeypatch, fields, evals):
    # The original evaluates before training only with --eval-interval (train.py: `args.eval_interval is not None and
    # rollout_id == 0`), and its run-qwen3-235B-A22B.sh turns eval off by commenting out `--eval-interval 20` while
    # keeping --eval-prompt-data (AIME, 16 samples of up to 16k tokens): here that ran the whole eval before step 0.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "eval_prompt_data": ["aime", "/a.jsonl"],
                               "debug_rollout_only": True, **fields})  # fmt: skip
    events = []
    patch_ray(monkeypatch, FakeRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.tracker = cfg, Actor(events), Tracker()
    run.tracker.start = lambda *a: None
    run.trainer = None
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    run.goodput, run.instability, run.last_hf_export = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg), None
    monkeypatch.setattr(run, "build", lambda: 0, raising=False)
    run.run()
    assert [e for e in events if e[0] == "eval"] == evals + ([("eval", 1)] if fields.get("eval_interval") else [])


@pytest.mark.parametrize(("start", "skip"), [(0, False), (0, True), (4, False)])
def test_num_rollout_0_evaluates_the_loaded_model_once(monkeypatch, start, skip):
    # The original's eval-only run (train.py: `args.num_rollout == 0 and args.eval_interval is not None`): one eval at
    # rollout 0, also for a checkpoint loaded at a later rollout and with --skip-eval-before-train. --num-rollout 0
    # was refused here, so a trained checkpoint could not be evaluated without training it further.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 0, "eval_prompt_data": ["aime", "/a.jsonl"],
                               "eval_interval": 5, "skip_eval_before_train": skip})  # fmt: skip
    events = []
    patch_ray(monkeypatch, FakeRay(events))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.tracker = cfg, Actor(events), Tracker()
    run.tracker.start = lambda *a: None
    run.trainer = Trainer(events)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    run.goodput, run.instability, run.last_hf_export = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg), None
    monkeypatch.setattr(run, "build", lambda: start, raising=False)
    run.run()
    assert events == [("eval", 0)]  # nothing generated, trained, saved or synced
    assert run.tracker.logged[0]["eval/demo"] == 0.25


def test_a_train_only_run_skips_its_evals_as_the_original(monkeypatch, caplog):
    # --debug-train-only (or --load-debug-rollout-data) starts no engine; the original's RolloutManager.eval returns at
    # once. Here the eval asked the absent engines and stopped the run ("neither a router nor engine URLs are
    # configured") before its first training step, so a replay script that kept its eval flags could not run.
    with caplog.at_level("WARNING"):
        events, logged = _run(monkeypatch, debug_train_only=True, eval_interval=1)
    assert [e for e in events if e[0] == "eval"] == []
    assert [e for e in events if e[0] == "train"] == [("train", 0), ("train", 1), ("train", 2)]
    said = "--eval-interval with --debug-train-only (or --load-debug-rollout-data): no engines run, so no eval runs"
    assert said in caplog.text


@pytest.mark.parametrize("fields", [{}, {"async_train": True}, {"colocate": True}])
def test_a_train_only_run_pushes_no_weights_as_the_original(monkeypatch, fields):
    # Reproducer: the original's SFT recipe (--debug-train-only, no engine) walked the trainer's whole weight gather
    # after every step (perf/update_weights_time and update_weights_gb_per_s logged for a push to no engine); the
    # original's update_weights returns at once with --debug-train-only.
    events, logged = _run(monkeypatch, debug_train_only=True, **fields)
    assert [e for e in events if e[0] == "train"] == [("train", 0), ("train", 1), ("train", 2)]
    assert [e for e in events if e[0] == "update_weights"] == []
    assert not [k for m in logged.values() if isinstance(m, dict) for k in m if k.startswith("perf/update_weights")]
    if fields.get("colocate"):  # the trainer still sleeps between its steps and wakes for the next
        assert [e[0] for e in events if e[0].startswith("trainer.")][:3] == ["trainer.wake_up", "trainer.sleep",
                                                                          "trainer.wake_up"]  # fmt: skip


@pytest.mark.parametrize(("fields", "synced"), [({}, True), ({"debug_train_only": True}, False),
                                                ({"debug_train_only": True, "colocate": True}, False)])  # fmt: skip
def test_a_train_only_run_shows_no_weight_sync_phase(monkeypatch, fields, synced):
    # Reproducer: with --debug-train-only nothing is pushed, yet each step logged "weight sync (weight version N):
    # done in 0.0 s".
    phases = []

    class Progress:
        def phase(self, name, rollout_id=None, detail=""):
            phases.append(name)
            return contextlib.nullcontext()

    monkeypatch.setattr(loop.Run, "progress", Progress(), raising=False)
    events, _ = _run(monkeypatch, **fields)
    assert phases.count("weight sync") == (3 if synced else 0)
    assert [e for e in events if e[0] == "train"] == [("train", 0), ("train", 1), ("train", 2)]
