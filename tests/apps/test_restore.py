"""The driver's restorer hands every engine a failed push names back for a restart, whatever the transport.

A real `DistributedWeightUpdater` (gloo) pushes to a fake engine (aiohttp on its own thread) that refuses to join
the broadcast group; Ray and the rollout manager are fakes that record the calls.
"""

import asyncio
import threading
import types

import pytest
import torch
from aiohttp import web

from slime_app import restore
from slime_core.config import SlimeArgs
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.process import find_free_port
from slime_rollout.weight_sync.updaters import DistributedWeightUpdater


class _Manager:
    def __init__(self, urls):
        self.urls, self.calls = urls, []

    def __getattr__(self, name):
        def remote(*args):
            self.calls.append((name, *args))
            return self.urls if name == "live_engine_urls" else None

        return types.SimpleNamespace(remote=remote)


class _Trainer:
    """Rank 0 of a disaggregated run: its push goes through the real distributed updater."""

    def __init__(self):
        self.updater = None

    def update_weights(self, version, urls):
        self.updater = DistributedWeightUpdater(
            SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}), RolloutClient(urls),
            master_address="127.0.0.1", master_port=find_free_port(start=29650), backend="gloo",
            group_name="slime-restore-test",
        )  # fmt: skip
        self.updater.update(iter([[("w", torch.ones(2))]]), str(version))
        return {"perf/update_weights_time": 0.1}


def _serve(handler):
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def start():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    runner, url = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    return loop, runner, url


def test_a_refused_distributed_push_restarts_the_engine_instead_of_ending_a_fault_tolerant_run(monkeypatch):
    # Was: the collective transport raised EngineError, the restorer handled only WeightPushError, and the run ended
    # with a traceback although --use-fault-tolerance was on.
    async def handler(request):
        if request.path == "/init_weights_update_group":
            return web.json_response({"success": False, "message": "NCCL init failed on the test engine"}, status=400)
        return web.json_response({"success": True})

    loop, runner, url = _serve(handler)
    try:
        monkeypatch.setattr(restore, "ray", types.SimpleNamespace(get=lambda ref: ref))
        cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "use_fault_tolerance": True})
        manager = _Manager([url])
        restorer = restore.EngineRestorer(cfg, manager, _Trainer())
        assert restorer.push(1) == {}
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
    (failed,) = [c for c in manager.calls if c[0] == "engines_failed"]
    assert failed[1] == [url] and "NCCL init failed on the test engine" in failed[2]
    assert failed[2].startswith("weight push failed: weight push '1' failed on 1 engine(s)")
    assert manager.calls[-1] == ("engines_restored", [])  # nothing reached: the engine gets the weights once back
    assert restorer.weight_version == 1


class _RecordingTrainer:
    def __init__(self, manager, fail=False):
        self.manager, self.fail = manager, fail

    def update_weights(self, version, urls=None):
        self.manager.calls.append(("update_weights", version))
        if self.fail:
            raise RuntimeError("push failed")
        return {"perf/update_weights_time": 0.1}


FULLY_ASYNC = {"rollout_function_path": "slime.rollout.fully_async_rollout.generate_rollout_fully_async"}


def test_fully_async_pushes_hold_the_managers_health_probes_while_the_weights_move(monkeypatch):
    monkeypatch.setattr(restore, "ray", types.SimpleNamespace(get=lambda ref: ref))
    for faults in (False, True):
        cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "use_fault_tolerance": faults,
                                   **FULLY_ASYNC})  # fmt: skip
        manager = _Manager(["http://e0"])
        assert restore.EngineRestorer(cfg, manager, _RecordingTrainer(manager)).push(3) == {
            "perf/update_weights_time": 0.1
        }
        moves = [c for c in manager.calls if c[0] in ("weights_moving", "update_weights")]
        assert moves == [("weights_moving", True), ("update_weights", 3), ("weights_moving", False)]
    # A failed push still ends the hold; a run that does not generate around pushes never asks for one.
    manager = _Manager(["http://e0"])
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **FULLY_ASYNC})
    with pytest.raises(RuntimeError, match="push failed"):
        restore.EngineRestorer(cfg, manager, _RecordingTrainer(manager, fail=True)).push(4)
    assert manager.calls == [("weights_moving", True), ("update_weights", 4), ("weights_moving", False)]
    manager = _Manager(["http://e0"])
    restore.EngineRestorer(SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1}), manager,
                           _RecordingTrainer(manager)).push(5)  # fmt: skip
    assert manager.calls == [("update_weights", 5)]


class _AwaitingManager(_Manager):
    """A manager with `awaiting` restarted engines waiting for weights."""

    def __init__(self, urls, awaiting):
        super().__init__(urls)
        self.awaiting = awaiting

    def __getattr__(self, name):
        if name == "engines_awaiting_weights":
            return types.SimpleNamespace(remote=lambda: list(self.awaiting))
        return super().__getattr__(name)


def test_an_engine_restarted_after_a_train_step_gets_the_trainers_weights_under_their_own_version(monkeypatch):
    # Was: `--async` (or --update-weights-interval > 1) restores during the generation that follows a train step
    # pushed the trainer's already-trained weights labelled with the previous version: the restarted engine served
    # other weights than its peers under their version, and its samples recorded the wrong weight version.
    monkeypatch.setattr(restore, "ray", types.SimpleNamespace(get=lambda ref: ref))
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 4, "use_fault_tolerance": True})
    manager = _AwaitingManager(["http://e0", "http://e1"], awaiting=["http://e1"])
    restorer = restore.EngineRestorer(cfg, manager, _RecordingTrainer(manager))
    restorer.push(3)
    restorer.restore_waiting()  # the trainer still holds v3: the served version
    restorer.trained(4)  # one train step; its weights are synced later
    restorer.restore_waiting()
    pushes = [c for c in manager.calls if c[0] == "update_weights"]
    assert pushes == [("update_weights", 3), ("update_weights", 3), ("update_weights", 4)]
    assert restorer.weight_version == 3  # what the others serve until the regular sync


def test_a_train_step_tells_the_restorer_which_version_the_trainer_now_holds(monkeypatch):
    from slime_app import loop

    monkeypatch.setattr(restore, "ray", types.SimpleNamespace(get=lambda ref: ref))
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 9, "use_fault_tolerance": True})
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.train_end = cfg, None
    run.trainer = types.SimpleNamespace(train=lambda rollout_id, refs: {"loss": 0.5})
    run.restorer = restore.EngineRestorer(cfg, _Manager([]), run.trainer)
    run.train(7, [])
    assert run.restorer.trainer_version == 8  # what the sync after rollout 7 pushes
