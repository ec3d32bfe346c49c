"""The trainer actor builds the backend that `--train-backend` names, through each package's public export."""

import subprocess
import sys

import pytest

from slime_app.train_actor import make_backend
from slime_core.config import SlimeArgs


def _cfg(**fields) -> SlimeArgs:
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})


@pytest.mark.parametrize(
    ("name", "module", "cls"),
    [("fsdp", "slime_train_fsdp.backend", "FSDPTrainBackend"),
     ("megatron", "slime_train_megatron.backend", "MegatronTrainBackend")],
)  # fmt: skip
def test_make_backend_builds_the_named_backend(name, module, cls):
    backend = make_backend(_cfg().model_copy(update={"train_backend": name}))
    assert type(backend).__module__ == module and type(backend).__name__ == cls
    for method in ("init", "train", "compute_log_probs", "named_hf_weights", "sleep", "wake_up", "save"):
        assert callable(getattr(backend, method)), f"{cls} lacks {method}"


@pytest.mark.parametrize(
    ("name", "module", "cls"),
    [("fsdp", "slime_train_fsdp.critic_backend", "FSDPCriticBackend"),
     ("megatron", "slime_train_megatron.critic_backend", "MegatronCriticBackend")],
)  # fmt: skip
def test_make_critic_backend_builds_the_named_backend(name, module, cls):
    from slime_app.train_actor import make_critic_backend
    from slime_core.protocols import CriticBackend

    backend = make_critic_backend(_cfg().model_copy(update={"train_backend": name}))
    assert type(backend).__module__ == module and type(backend).__name__ == cls
    assert isinstance(backend, CriticBackend)


def test_make_backend_rejects_unknown_name():
    with pytest.raises(ValueError, match="--train-backend: unknown train backend 'jax'"):
        make_backend(_cfg().model_copy(update={"train_backend": "jax"}))  # past the config's Literal


def test_megatron_export_names_the_extra_when_megatron_core_is_missing():
    # A fresh interpreter where `megatron` cannot be imported: the package still imports, the backend
    # export fails with the install line.
    code = (
        "import sys; sys.modules['megatron'] = None\n"
        "import slime_train_megatron\n"
        "try:\n"
        "    slime_train_megatron.MegatronTrainBackend\n"
        "except ImportError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERR MegatronTrainBackend needs megatron-core: pip install 'slime-train-megatron[megatron]'" in out.stdout


def test_trainer_runtime_env_from_train_env_vars():
    from slime_app.train_actor import trainer_runtime_env
    from slime_core.config import parse_args

    base = ["--train-backend", "fsdp", "--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--num-rollout", "1",
            "--rollout-batch-size", "1", "--rollout-max-response-len", "8"]  # fmt: skip
    args = parse_args([*base, "--train-env-vars", '{"NCCL_DEBUG": "INFO", "MY_FLAG": "1"}'])
    assert trainer_runtime_env(args) == {"env_vars": {"NCCL_DEBUG": "INFO", "MY_FLAG": "1"}}
    assert trainer_runtime_env(parse_args(base)) is None
    # --deterministic-mode (the original's Qwen2.5-0.5B reproducibility script): the recipe's variables, user's win.
    deterministic = parse_args([*base, "--deterministic-mode", "--train-env-vars", '{"NCCL_ALGO": "Tree"}'])
    assert trainer_runtime_env(deterministic) == {
        "env_vars": {"NCCL_ALGO": "Tree", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0"}
    }


@pytest.mark.slow
def test_train_env_vars_reach_the_trainer_process_next_to_the_job_env():
    # A real Ray actor built by TrainGroup: the rank sees --train-env-vars, and the job-level env of init_ray
    # is merged, not replaced. The actor class itself imports in the worker because slime_app is installed.
    import os

    import ray

    from slime_app.cluster import create_placement, init_ray
    from slime_app.train_actor import TrainGroup

    cfg = _cfg(
        actor_num_nodes=1, actor_num_gpus_per_node=1, rollout_num_gpus=0, debug_train_only=True,
        train_env_vars={"SLIME_TEST_TRAIN_ENV": "42"},
    )  # fmt: skip
    init_ray(cfg)
    try:
        group = TrainGroup(cfg, create_placement(cfg))
        env = ray.get(
            group.actors[0].__ray_call__.remote(
                lambda self: (os.environ.get("SLIME_TEST_TRAIN_ENV"), os.environ.get("TOKENIZERS_PARALLELISM"))
            )
        )
        assert env == ("42", "false")  # ours, and one of init_ray's job-level variables
    finally:
        ray.shutdown()


def test_the_backends_compile_warm_up_starts_when_asked_and_steps_run_eagerly_until_it_ends(monkeypatch):
    import contextlib
    from types import SimpleNamespace

    import slime_app.train_actor as ta

    events: list[str] = []
    state = {"eager": False, "compiling": [True, True, False]}  # pending() at the steps 0, 1 and 2

    class WarmUp:
        def pending(self):
            return state["compiling"].pop(0)

        @contextlib.contextmanager
        def eager(self):
            state["eager"] = True
            yield
            state["eager"] = False

        def wait(self):
            events.append("wait")
            return {"graphs": 1}  # a finished warm-up's report

        def stop(self):
            events.append("stop")

    class Backend:
        @staticmethod
        def start_compile_warm_up(cfg, gated=False):
            events.append("start")
            return WarmUp()

        def train(self, rollout_id, batch):
            events.append(f"train {rollout_id}" + (" eager" if state["eager"] else ""))
            return {}

    cfg = _cfg()  # before the registry is patched (the config's checks read it)
    monkeypatch.setattr(ta.TRAIN_BACKENDS, "get", lambda name: SimpleNamespace(load=lambda: Backend))
    actor = ta.TrainActor(world_size=1, rank=0, master_addr="127.0.0.1", master_port=1)
    actor.preload(cfg)
    assert events == []  # importing the backend starts nothing: the driver says when (slime_app.loop.Run.build)
    actor.start_compile_warm_up(cfg)
    actor.backend = Backend()
    steps = [actor.train(i, object()) for i in range(4)]
    actor.shutdown()
    assert [m.get("perf/compile_warmup_pending") for m in steps] == [1.0, 1.0, None, None]
    assert steps[2]["perf/compile_warmup_finished"] == 1.0 and steps[2]["perf/compile_warmup_wait_time"] >= 0.0
    assert "perf/compile_warmup_wait_time" not in steps[3]
    # Eager while it compiles; collected once, before the first step after it ended; compiled from then on.
    assert events == ["start", "train 0 eager", "train 1 eager", "wait", "train 2", "train 3"]

    # A rank shutting down before its first step stops the warm-up; a critic rank starts none.
    events.clear()
    actor = ta.TrainActor(world_size=1, rank=0, master_addr="127.0.0.1", master_port=1)
    actor.start_compile_warm_up(cfg)
    actor.shutdown()
    actor.start_compile_warm_up(cfg, role="critic")
    assert events == ["start", "stop"]


def test_a_colocated_rank_starts_its_warm_up_gated_and_opens_the_gate_when_told(monkeypatch):
    """The driver starts it while the engines start (gated) and releases it once they are up (slime_app.loop)."""
    from types import SimpleNamespace

    import slime_app.train_actor as ta

    events = []

    class WarmUp:
        def release(self):
            events.append("release")

        def stop(self):
            events.append("stop")

    class Backend:
        @staticmethod
        def start_compile_warm_up(cfg, gated=False):
            events.append(f"start gated={gated}")
            return WarmUp()

    cfg = _cfg()
    monkeypatch.setattr(ta.TRAIN_BACKENDS, "get", lambda name: SimpleNamespace(load=lambda: Backend))
    actor = ta.TrainActor(world_size=1, rank=0, master_addr="127.0.0.1", master_port=1)
    actor.release_compile_warm_up()  # none started: nothing to open
    actor.start_compile_warm_up(cfg, "actor", True)
    assert events == ["start gated=True"]
    actor.release_compile_warm_up()
    actor.shutdown()
    assert events == ["start gated=True", "release", "stop"]


def test_a_rank_saves_uncommitted_only_when_asked_so_a_critic_backend_keeps_its_signature():
    # The PPO e2e run failed at its first save with "FSDPCriticBackend.save() got an unexpected keyword argument
    # 'commit'": the critic group's save passed `commit=True` to a backend whose save takes the rollout id only.
    from slime_app import train_actor as ta

    calls = []

    class CriticBackend:
        def save(self, rollout_id):
            calls.append(("critic", rollout_id))

    class ActorBackend:
        def save(self, rollout_id, *, commit=True):
            calls.append(("actor", rollout_id, commit))

        def commit_save(self, rollout_id):
            calls.append(("actor commit", rollout_id))

    rank = ta.TrainActor(world_size=1, rank=0, master_addr="127.0.0.1", master_port=1)
    rank.backend = CriticBackend()
    rank.save(3)
    rank.backend = ActorBackend()
    rank.save(3, False)
    rank.commit_save(3)
    rank.save(4)
    assert calls == [("critic", 3), ("actor", 3, False), ("actor commit", 3), ("actor", 4, True)]


def test_a_registered_backend_written_before_commit_save_still_saves_and_starts():
    # A third-party `--train-backend` with the older protocol (save(rollout_id), no commit_save, no
    # compile_layers_flag) failed with a TypeError at its first save.
    from slime_app import train_actor as ta

    calls = []

    class OldBackend:
        def save(self, rollout_id):
            calls.append(("save", rollout_id))

    rank = ta.TrainActor(world_size=1, rank=0, master_addr="127.0.0.1", master_port=1)
    rank.backend = OldBackend()
    rank.save(3, False)  # commits in save, as it always did
    rank.commit_save(3)  # nothing left to commit
    assert calls == [("save", 3)]


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_init_reports_the_roles_backend_compile_flag(monkeypatch, role):
    # Issue 27: a critic rank answered `compile_layers_flag=None` whatever its backend compiled.
    import torch.distributed as dist

    from slime_app import train_actor as ta

    class Backend:
        compile_layers_flag = "--fsdp-compile-layers"

        def init(self, cfg, **kwargs):
            return 2

    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: None)
    monkeypatch.setattr(ta, "make_backend" if role == "actor" else "make_critic_backend", lambda cfg: Backend())
    rank = ta.TrainActor(world_size=1, rank=0, master_addr="127.0.0.1", master_port=1)
    rank.store = type("Store", (), {"set_timeout": lambda self, timeout: None})()
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "advantage_estimator": "ppo"})
    assert rank.init(cfg, role) == ta.TrainerStart(rollout_id=2, compile_layers_flag="--fsdp-compile-layers")
