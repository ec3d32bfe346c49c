"""PPO's trainers: the order of the actor's and critic's steps, memory swaps and checkpoints; the critic's bundles.

The trainer groups are fakes that record calls (no Ray); the placement test replaces Ray's placement-group calls.
"""

import types

import pytest

from slime_app import cluster
from slime_app.actor_critic import ActorCritic, critic_resume_step
from slime_app.train_actor import TrainerStart
from slime_core.checkpoint_dirs import critic_dirs
from slime_core.config import SlimeArgs


def _cfg(**fields) -> SlimeArgs:
    return SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 4, "advantage_estimator": "ppo", "actor_num_gpus_per_node": 2,
         **fields}
    )  # fmt: skip


class _Group:
    def __init__(self, role, events):
        self.role, self.events, self.dp_ranks = role, events, [0, 1]

    def _log(self, *what):
        self.events.append((self.role, *what))

    compile_layers_flag = None  # what the group's `init` reports

    def init(self, cfg):
        self._log("init")
        return TrainerStart(rollout_id=3 if self.role == "actor" else 2, compile_layers_flag=self.compile_layers_flag)

    def wake_up(self):
        self._log("wake_up")

    def sleep(self):
        self._log("sleep")

    def train_critic(self, rollout_id, batch_refs):
        self._log("train_critic", rollout_id)
        return {"train/critic-value_loss": 0.5, **self.prediction}, ["values-rank0", "values-rank1"]

    prediction: dict = {}  # the critic's prediction metrics (`slime_core.critic`)

    def train(self, rollout_id, batch_refs, values=None):
        self._log("train", rollout_id, tuple(values))
        return {"train/loss": 1.0}

    def save(self, rollout_id, commit=True):
        self._log("save", rollout_id, *([] if commit else ["uncommitted"]))

    def commit_save(self, rollout_id):
        self._log("commit_save", rollout_id)

    def update_weights(self, version, engine_urls=None):
        self._log("update_weights", version, *([engine_urls] if engine_urls else []))
        return {}


def _pair(shared, **fields):
    events = []
    pair = ActorCritic(_cfg(**fields), _Group("actor", events), _Group("critic", events), shared=shared)
    return pair, events


def test_shared_gpus_alternate_and_the_actor_trains_on_the_critic_values(caplog):
    pair, events = _pair(shared=True)
    assert pair.init(pair.cfg).rollout_id == 3  # the actor's start; the differing critic's is logged
    assert "the critic resumes at rollout 2, the actor at 3" in caplog.text
    # Never both on the GPU: the actor sleeps while the critic is built; the critic sleeps after.
    assert events == [("actor", "init"), ("actor", "sleep"), ("critic", "init"), ("critic", "sleep")]
    events.clear()
    assert pair.update_weights(0) == {}  # the first weight sync wakes the actor
    assert events == [("actor", "wake_up"), ("actor", "update_weights", 0)]
    events.clear()
    pair.sleep()  # colocated: after the weight sync both give the GPUs to the engines
    pair.wake_up()  # ... and the loop wakes the trainer for the step: nothing moves yet
    metrics = pair.train(0, ["b0", "b1"])
    assert events == [
        ("actor", "sleep"),
        ("critic", "wake_up"),
        ("critic", "train_critic", 0),
        ("critic", "sleep"),
        ("actor", "wake_up"),
        ("actor", "train", 0, ("values-rank0", "values-rank1")),
    ]
    assert metrics["train/loss"] == 1.0 and metrics["train/critic-value_loss"] == 0.5
    assert metrics["perf/critic_train_time"] >= 0
    events.clear()
    pair.save(0)  # the critic's checkpoint first; the actor's tracker commits the resume point
    assert events == [
        ("actor", "sleep"),
        ("critic", "wake_up"),
        ("critic", "save", 0),
        ("critic", "sleep"),
        ("actor", "wake_up"),
        ("actor", "save", 0),
    ]
    events.clear()
    pair.update_weights(1, ["http://restarted:1"])  # a restarted engine's weights (fault tolerance's restorer)
    assert events == [("actor", "update_weights", 1, ["http://restarted:1"])]


@pytest.mark.parametrize(("actor", "critic"), [(None, "--fsdp-compile-layers"), ("--fsdp-compile-layers", None)])
def test_init_reports_the_critics_compile_flag_beside_the_actors(actor, critic):
    """Issue 27: the pair returned the actor's start only, so the driver never heard that the critic compiles."""
    pair, _ = _pair(shared=True)
    pair.actor.compile_layers_flag, pair.critic.compile_layers_flag = actor, critic
    assert pair.init(pair.cfg) == TrainerStart(rollout_id=3, compile_layers_flag=actor,
                                               critic_compile_layers_flag=critic)  # fmt: skip


def test_rollouts_without_explained_variance_are_counted_and_the_first_named(caplog):
    """All returns equal: the critic leaves the undefined explained variance out; the driver says so once."""
    pair, _ = _pair(shared=False)
    equal = {"train/critic-return_mean": 0.0, "train/critic-return_std": 0.0}
    pair.critic.prediction = equal
    caplog.set_level("DEBUG", logger="slime_app.actor_critic")
    for rollout_id in (0, 1):
        metrics = pair.train(rollout_id, ["b0"])
        assert "train/critic-explained_variance" not in metrics and metrics["train/critic-return_std"] == 0.0
    pair.critic.prediction = {**equal, "train/critic-return_std": 0.5, "train/critic-explained_variance": 0.25}
    pair.train(2, ["b0"])
    notes = [(r.levelname, r.getMessage()) for r in caplog.records if "explained_variance" in r.getMessage()]
    assert notes == [
        ("INFO", "rollout 0: no train/critic-explained_variance: every return is 0, so it is undefined "
                 "(1 rollout(s) so far; later ones are logged at DEBUG)"),
        ("DEBUG", "rollout 1: no train/critic-explained_variance: every return is 0, so it is undefined "
                  "(2 rollout(s) so far; later ones are logged at DEBUG)"),
    ]  # fmt: skip
    assert pair.num_undefined_ev == 2


def test_critic_only_steps_and_own_gpus():
    pair, events = _pair(shared=False, num_critic_only_steps=2, critic_num_nodes=1)
    pair.init(pair.cfg)
    for rollout_id in range(3):
        pair.train(rollout_id, ["b0", "b1"])
    trained = [e for e in events if e[1] in ("train", "train_critic")]
    assert trained == [
        ("critic", "train_critic", 0),
        ("critic", "train_critic", 1),
        ("critic", "train_critic", 2),
        ("actor", "train", 2, ("values-rank0", "values-rank1")),
    ]
    assert not [e for e in events if e[1] in ("sleep", "wake_up")]  # its own GPUs: nothing to swap


@pytest.mark.parametrize(
    ("fields", "actor", "critic", "rollout", "total"),
    [
        ({"colocate": True}, [0, 1], [0, 1], [0, 1], 2),  # shared: the original's layout
        ({"colocate": True, "critic_num_nodes": 1}, [0, 1], [2, 3], [0, 1], 4),
        ({"rollout_num_gpus": 2, "critic_num_gpus_per_node": 2}, [0, 1], [2, 3], [4, 5], 6),
        ({"rollout_num_gpus": 2}, [0, 1], [0, 1], [2, 3], 4),
        ({"debug_train_only": True, "critic_num_nodes": 1}, [0, 1], [2, 3], [], 4),
        ({"advantage_estimator": "grpo", "rollout_num_gpus": 2}, [0, 1], [], [2, 3], 4),
    ],
)
def test_critic_bundles(monkeypatch, fields, actor, critic, rollout, total):
    made = {}

    def fake_group(bundles, strategy):
        made["bundles"] = len(bundles)
        return types.SimpleNamespace(ready=lambda: None)

    def fake_info_options(num_gpus, scheduling_strategy):
        index = scheduling_strategy.placement_group_bundle_index
        return types.SimpleNamespace(remote=lambda: ("10.0.0.1", "node-a", index))  # (ip, node id, gpu)

    monkeypatch.setattr(cluster, "has_gpu", lambda: True)
    monkeypatch.setattr(cluster, "placement_group", fake_group)
    monkeypatch.setattr(cluster, "_bundle_info", types.SimpleNamespace(options=fake_info_options))
    monkeypatch.setattr(cluster.ray, "get", lambda refs, timeout=None: refs)
    monkeypatch.setattr(cluster.ray, "wait", lambda refs, timeout=None: (refs, []))
    monkeypatch.setattr(cluster.ray, "cluster_resources", lambda: {"GPU": 8, "CPU": 64})
    placement = cluster.create_placement(_cfg(**fields))
    assert made["bundles"] == total
    assert (placement.actor_bundles, placement.critic_bundles, placement.rollout_bundles) == (actor, critic, rollout)
    assert placement.critic_shares_actor_gpus == (bool(critic) and critic == actor)


class _LoadingGroup(_Group):
    """A group recording the `--ckpt-step` its ranks would load."""

    def init(self, cfg):
        self._log("init", cfg.ckpt_step)
        return TrainerStart(rollout_id=0, compile_layers_flag=None)


def _saves(root, actor, critic):
    """A --save directory: the actor's complete iterations `actor`, the critic's `critic` (trackers: the last)."""
    for where, steps in ((root, actor), (root / "critic", critic)):
        for step in steps:
            (where / f"iter_{step:07d}").mkdir(parents=True)
            (where / f"iter_{step:07d}" / "meta.json").write_text("{}")
        if steps:
            (where / "latest_checkpointed_iteration.txt").write_text(str(steps[-1]))


def test_the_critic_resumes_the_actors_iteration_after_a_save_cut_between_them(tmp_path):
    # Issue 27: the save of rollout 2 wrote the critic's iteration 3, then died before the actor's; each side resumed
    # its own latest (critic 3, actor 2) with only a warning: a critic one update ahead of its actor.
    _saves(tmp_path, actor=[1, 2], critic=[1, 2, 3])
    events = []
    pair = ActorCritic(_cfg(load=str(tmp_path)), _LoadingGroup("actor", events), _LoadingGroup("critic", events),
                       shared=False)  # fmt: skip
    pair.init(pair.cfg)
    assert events == [("actor", "init", 2), ("critic", "init", 2)]  # the actor's tracker, pinned for both


def test_a_critic_without_the_actors_iteration_is_refused_before_anything_loads(tmp_path):
    _saves(tmp_path, actor=[1, 2, 4], critic=[1, 2, 3])
    events = []
    pair = ActorCritic(_cfg(load=str(tmp_path)), _LoadingGroup("actor", events), _LoadingGroup("critic", events),
                       shared=False)  # fmt: skip
    with pytest.raises(ValueError) as e:
        pair.init(pair.cfg)
    assert str(e.value) == (
        f"--load {tmp_path}: the actor resumes from iter_0000004, which the critic's checkpoints in "
        f"{tmp_path / 'critic'} do not have (they hold iterations 1, 2, 3: a save cut between the critic's and the "
        "actor's, or another run's critic); resume both from one with --ckpt-step 2"
    )
    assert events == []
    pair = ActorCritic(_cfg(load=str(tmp_path), ckpt_step=2), _LoadingGroup("actor", events),
                       _LoadingGroup("critic", events), shared=False)  # fmt: skip
    pair.init(pair.cfg)
    assert events == [("actor", "init", 2), ("critic", "init", 2)]


def test_a_run_without_critic_checkpoints_starts_the_critic_from_its_weights(tmp_path):
    _saves(tmp_path, actor=[1, 2], critic=[])  # a GRPO run resumed as PPO: the critic starts afresh, as before
    events = []
    pair = ActorCritic(_cfg(load=str(tmp_path)), _LoadingGroup("actor", events), _LoadingGroup("critic", events),
                       shared=False)  # fmt: skip
    pair.init(pair.cfg)
    assert events == [("actor", "init", 2), ("critic", "init", None)]  # only the actor's iteration is pinned


def test_another_runs_critic_load_keeps_its_own_latest(tmp_path):
    # A value model trained elsewhere (--critic-load of another run's critic saves, iteration 50) beside the actor's
    # own --load at iteration 2: not paired with the actor's iteration, and not given the tracker step the driver
    # pinned for the actor; an explicit --ckpt-step would still reach both (as the original's critic config).
    _saves(tmp_path / "run", actor=[1, 2], critic=[])
    _saves(tmp_path / "other", actor=[], critic=[50])
    other = str(tmp_path / "other" / "critic")
    events = []
    cfg = _cfg(load=str(tmp_path / "run"), critic_load=other)
    pair = ActorCritic(cfg, _LoadingGroup("actor", events), _LoadingGroup("critic", events), shared=False)
    pair.init(cfg)  # the driver passes the run config; the actor's path pins its tracker's iteration
    assert events == [("actor", "init", 2), ("critic", "init", None)]
    events.clear()
    pair.init(cfg.model_copy(update={"ckpt_step": 1}))
    assert events == [("actor", "init", 1), ("critic", "init", 1)]  # a --ckpt-step given reaches both


def test_a_critic_load_naming_this_runs_critic_save_is_paired(tmp_path):
    _saves(tmp_path, actor=[1, 2], critic=[1, 2, 3])
    events = []
    critic = str(tmp_path / "critic")
    cfg = _cfg(load=str(tmp_path), critic_load=critic, save=str(tmp_path / "next"), critic_save=critic)
    pair = ActorCritic(cfg, _LoadingGroup("actor", events), _LoadingGroup("critic", events), shared=False)
    pair.init(cfg)
    assert events == [("actor", "init", 2), ("critic", "init", 2)]


def test_a_load_naming_one_iteration_folder_pairs_the_critic_of_that_iteration(tmp_path):
    # Megatron resumes `--load <save>/iter_0000002`; the critic's checkpoints are `<save>/critic/iter_*`. The critic
    # looked for `<save>/iter_0000002/critic`, found none and started from its initial weights (a warning that the
    # critic resumes at rollout 0), while the actor went on from iteration 2.
    _saves(tmp_path, actor=[1, 2, 3], critic=[1, 2, 3])
    cfg = _cfg(load=str(tmp_path / "iter_0000002"))
    assert critic_dirs(cfg)[0] == str(tmp_path / "critic")
    assert critic_resume_step(cfg) == 2
    events = []
    pair = ActorCritic(cfg, _LoadingGroup("actor", events), _LoadingGroup("critic", events), shared=False)
    pair.init(pair.cfg)
    assert events == [("actor", "init", None), ("critic", "init", 2)]
