"""Test doubles of the training loop (`slime_app.loop`): Ray, the rollout manager and the trainer, recording calls.

Importable as module `slime_app_loop_fakes` (registered by this folder's conftest) by `test_loop.py` and
`test_loop_resume.py`.
"""

import types

from slime_app import loop, restore, rollout_schedule
from slime_app.train_actor import TrainerStart

__all__ = ["Actor", "BuildTrainer", "FakeRay", "Tracker", "Trainer", "patch_ray", "unbuilt_run"]


def patch_ray(monkeypatch, fake) -> None:
    """Puts `fake` in place of the driver's Ray: the loop's, its rollout schedule's (`Rollouts`) and restorer's."""
    for module in (loop, restore, rollout_schedule):
        monkeypatch.setattr(module, "ray", fake)


class FakeRay:
    """`ray.get` / `ray.wait` over the fake refs: a generate ref resolves to (no batches, its metrics)."""

    def __init__(self, events):
        self.events = events

    def get(self, ref, timeout=None):
        kind, args = ref
        if kind == "generate":
            self.events.append(("got", *args))
            return [], {"rollout/raw_reward": 0.5}
        if kind == "eval":
            return {"eval/demo": 0.25}
        if kind == "start":
            self.events.append(("engines up",))
        return None

    def wait(self, refs, num_returns):
        self.events.extend(("waited", *args) for _, args in refs)


class Actor:
    """The rollout manager: every `method.remote(...)` is recorded and returns a fake ref."""

    def __init__(self, events):
        self.events = events

    def __getattr__(self, name):
        def remote(*args):
            if name != "generate":  # generation is recorded when it is taken (`got`)
                self.events.append((name, *args))
            return (name, args)

        return types.SimpleNamespace(remote=remote)


class Trainer:
    def __init__(self, events):
        self.events = events

    def train(self, rollout_id, batch_refs):
        self.events.append(("train", rollout_id))
        return {"train/loss": 1.0}

    def save(self, rollout_id, commit=True):
        self.events.append(("trainer.save", rollout_id))  # `commit` False from the loop: `commit_save` follows

    def commit_save(self, rollout_id):
        self.events.append(("trainer.commit", rollout_id))

    def save_hf(self, path):
        self.events.append(("trainer.save_hf", path))

    def update_weights(self, version):
        self.events.append(("update_weights", version))
        return {"update_weights_time": 0.1}

    def wake_up(self):
        self.events.append(("trainer.wake_up",))

    def sleep(self):
        self.events.append(("trainer.sleep",))


class Tracker:
    def __init__(self):
        self.logged = {}

    def log(self, step, metrics):
        again = set(metrics) & set(self.logged.get(step, {}))
        assert not again, f"two points at step {step} for {sorted(again)}"  # TensorBoard would show both
        self.logged.setdefault(step, {}).update(metrics)

    def begin_at(self, rollout_id):
        self.began_at = rollout_id

    def begin_eval_only(self):
        self.eval_only = True

    def rollout_done(self, step, metrics):
        pass

    def eval_line(self, step, metrics):
        pass

    def state(self):
        return {"curves": {}}

    def restore(self, state):
        pass


class BuildTrainer:
    """The trainer group as `Run.build` calls it; its `init` reports `compile_layers_flag` (None: eager layers)."""

    def __init__(self, events, compile_layers_flag=None):
        self.events = events
        self.compile_layers_flag = compile_layers_flag

    def preload(self, cfg):
        self.events.append(("trainer.preload",))

    def start_compile_warm_up(self, cfg, gated=False):
        self.events.append(("trainer.start_compile_warm_up" + (" gated" if gated else ""),))

    def release_compile_warm_up(self):
        self.events.append(("trainer.release_compile_warm_up",))

    def init(self, cfg):
        self.events.append(("trainer.init",))
        return TrainerStart(rollout_id=0, compile_layers_flag=self.compile_layers_flag)


def unbuilt_run(monkeypatch, events, make_trainer):
    """`loop`'s Ray, rollout manager and trainer factory faked, for `Run.build`: the trainer is `make_trainer()`."""
    patch_ray(monkeypatch, FakeRay(events))
    monkeypatch.setattr(
        loop, "RolloutManager", types.SimpleNamespace(options=lambda **_: types.SimpleNamespace(
            remote=lambda *args: Actor(events)))
    )  # fmt: skip
    monkeypatch.setattr(loop, "make_trainers", lambda cfg, placement: make_trainer())
