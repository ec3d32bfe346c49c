"""A separately installed package (tests/plugin_pkg) extends slime through entry points alone.

It registers a train backend, a rollout engine, a reward function and an advantage estimator; each is found,
validated by the config and used. Tolerance: advantages are exact (10 × a centred reward of 0.25 steps).

The package is installed for this module only, as an installer lays it out (its source and a `.dist-info` with
the entry points of its pyproject.toml on `sys.path`): installed in the workspace, its toy entries would show in
every user's `uv run apps/train --help`.
"""

import importlib
import importlib.metadata
import pathlib
import sys
import tomllib

import pytest
import torch

from slime_app import preflight
from slime_app.train_actor import make_backend
from slime_core import extensions
from slime_core.algorithms import compute_advantages_and_returns
from slime_core.config import ConfigError, SlimeArgs, build_parser
from slime_core.estimators import ESTIMATORS
from slime_core.extensions import REWARDS, ROLLOUT_ENGINES, TRAIN_BACKENDS
from slime_core.registry import Registry
from slime_core.sample import Sample
from slime_core.train_data import postprocess_rewards
from slime_rollout.rewards import async_rm

PLUGIN_DIR = pathlib.Path(__file__).resolve().parents[1] / "plugin_pkg"


def _refresh_registries() -> None:
    for registry in [*(r for r in vars(extensions).values() if isinstance(r, Registry)), ESTIMATORS._installed]:
        registry.refresh()
    build_parser.cache_clear()  # its help lists each registry's names


@pytest.fixture(scope="module", autouse=True)
def installed_plugin(tmp_path_factory):
    """tests/plugin_pkg installed on `sys.path` (its source, its metadata) while this module runs."""
    project = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())["project"]
    site = tmp_path_factory.mktemp("site-packages")
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = [f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for group, eps in
              project["entry-points"].items()]  # fmt: skip
    (info / "entry_points.txt").write_text("\n".join(groups))
    paths = [str(site), str(PLUGIN_DIR / "src")]
    sys.path[:0] = paths
    importlib.invalidate_caches()
    _refresh_registries()
    yield
    for path in paths:
        sys.path.remove(path)
    importlib.invalidate_caches()
    _refresh_registries()
    for name in [m for m in sys.modules if m.split(".")[0] == "slime_test_plugin"]:
        del sys.modules[name]


BASE = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "num_rollout": 1, "rollout_max_response_len": 8}
PLUGIN = {
    "train_backend": "toy_backend",
    "rm_type": "response_length",
    "advantage_estimator": "toy_centred_x10",
    "rollout_engine": "reference",
}


def test_the_entries_come_from_the_installed_distribution():
    dist = importlib.metadata.distribution("slime-test-plugin")
    groups = {(ep.group, ep.name) for ep in dist.entry_points}
    assert groups == {
        ("slime.train_backends", "toy_backend"),
        ("slime.rollout_engines", "toy_gpu_engine"),
        ("slime.rewards", "response_length"),
        ("slime.advantage_estimators", "toy_centred_x10"),
    }
    help_text = {a.dest: a.help for a in build_parser()._actions}
    assert "toy_backend" in help_text["train_backend"] and "toy_gpu_engine" in help_text["rollout_engine"]
    assert "response_length" in help_text["rm_type"] and "toy_centred_x10" in help_text["advantage_estimator"]


def test_the_config_accepts_them_and_asks_their_capabilities():
    cfg = SlimeArgs.from_dict({**BASE, **PLUGIN, "lora_rank": 4})  # toy_backend declares supports_lora
    assert (cfg.train_backend, cfg.rm_type, cfg.advantage_estimator) == tuple(PLUGIN.values())[:3]
    assert cfg.weight_sync == "lora"
    with pytest.raises(ConfigError, match=r"--lora-rank needs a LoRA backend \(--train-backend .*toy_backend"):
        SlimeArgs.from_dict({**BASE, **PLUGIN, "train_backend": "megatron", "lora_rank": 4})
    with pytest.raises(ConfigError, match=r'--rm-type: unknown reward function .*"slime.rewards"'):
        SlimeArgs.from_dict({**BASE, **PLUGIN, "rm_type": "response_lenght"})


def test_the_app_factory_builds_the_plugin_backend():
    from slime_test_plugin import ToyBackend

    assert type(make_backend(SlimeArgs.from_dict({**BASE, **PLUGIN}))) is ToyBackend


async def test_the_rollout_scores_with_the_plugin_reward():
    cfg = SlimeArgs.from_dict({**BASE, **PLUGIN})
    sample = Sample(prompt="q", tokens=[1, 2, 3], response="twelve chars", response_length=2, label="x")
    assert await async_rm(cfg, sample) == pytest.approx(1.2)
    assert REWARDS.get("response_length").needs_url is False


def test_the_shared_step_computes_advantages_with_the_plugin_estimator():
    cfg = SlimeArgs.from_dict({**BASE, **PLUGIN})
    samples = [Sample(tokens=[1, 2], response_length=1, reward=r, index=i) for i, r in enumerate([1.0, 0.5, 0.0, 0.0])]
    _, rewards = postprocess_rewards(cfg, samples)  # the spec's group_mean normalization
    assert rewards == pytest.approx([0.25, -0.25, 0.0, 0.0], abs=1e-6)
    adv, returns = compute_advantages_and_returns(cfg, rewards=rewards[:2], loss_masks=[torch.ones(2), torch.ones(1)])
    assert [a.tolist() for a in adv] == [[2.5, 2.5], [-2.5]]
    assert [r.tolist() for r in returns] == [[2.5, 2.5], [-2.5]]


def test_preflight_sees_the_engine_capability_and_runs_the_backend_check(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ROLLOUT_ENGINES.get("toy_gpu_engine").needs_gpu and not TRAIN_BACKENDS.get("toy_backend").needs_gpu
    cfg = SlimeArgs.from_dict({**BASE, **PLUGIN, "rollout_engine": "toy_gpu_engine", "actor_num_gpus_per_node": 1})
    with pytest.raises(ValueError, match=r"--rollout-engine toy_gpu_engine needs CUDA GPUs; .*engine reference"):
        preflight._check_hardware(cfg)
    preflight._check_hardware(cfg.model_copy(update={"rollout_engine": "reference"}))
    assert "--train-backend toy_backend: toy backend checked --lr" in preflight._run_owned_checks(cfg)
    with pytest.raises(ValueError, match=r"--train-backend toy_backend: --lr -1.0: the toy backend needs a positive"):
        preflight._run_owned_checks(cfg.model_copy(update={"lr": -1.0}))


def test_an_engine_slime_cannot_start_needs_the_urls_of_its_servers(tmp_path):
    cfg = SlimeArgs.from_dict({**BASE, **PLUGIN, "rollout_engine": "toy_gpu_engine"})
    assert ROLLOUT_ENGINES.get("reference").launchable and not ROLLOUT_ENGINES.get("toy_gpu_engine").launchable
    with pytest.raises(ValueError, match="--rollout-engine toy_gpu_engine: slime does not start this engine's servers"):
        preflight._check_engine_launch(cfg)
    preflight._check_engine_launch(cfg.model_copy(update={"rollout_engine_urls": ["http://127.0.0.1:1"]}))


def test_capabilities_the_plugin_lacks_are_refused_by_name():
    # toy_backend declares neither a critic nor colocation; toy_gpu_engine cannot release its memory.
    with pytest.raises(ConfigError, match="--advantage-estimator ppo trains a critic, which --train-backend "
                                          "toy_backend does not have"):  # fmt: skip
        SlimeArgs.from_dict({**BASE, **PLUGIN, "advantage_estimator": "ppo"})
    with pytest.raises(ConfigError, match="--colocate: --train-backend toy_backend cannot offload its state"):
        SlimeArgs.from_dict({**BASE, **PLUGIN, "colocate": True})
    cfg = SlimeArgs.from_dict({**BASE, **PLUGIN, "rollout_engine": "toy_gpu_engine"})
    with pytest.raises(ValueError, match="--colocate: --rollout-engine toy_gpu_engine cannot release its memory"):
        preflight._check_engine_launch(cfg.model_copy(update={"colocate": True}))


def test_the_engine_record_not_its_name_picks_the_weight_sync(monkeypatch):
    from slime_app.dry_run import gpu_plan

    gpu_engine = {**BASE, **PLUGIN, "rollout_engine": "toy_gpu_engine"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert SlimeArgs.from_dict(gpu_engine).weight_sync == "distributed"  # needs_gpu: NCCL broadcasts, as SGLang
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu_run = SlimeArgs.from_dict(gpu_engine)
    assert cpu_run.weight_sync == "disk"
    assert gpu_plan(cpu_run, cuda=False)[:2] == ("toy_gpu_engine", "distributed")
    # Tensor deltas need /update_weights_from_delta, which only a record with applies_weight_deltas serves.
    delta = {"update_weight_mode": "delta", "weight_sync": "tensor"}
    with pytest.raises(ConfigError, match="--rollout-engine toy_gpu_engine cannot verify and apply an encoded delta"):
        SlimeArgs.from_dict({**gpu_engine, **delta})
    assert SlimeArgs.from_dict({**BASE, **PLUGIN, **delta}).weight_sync == "tensor"  # the reference engine


def test_a_registered_weight_transport_is_accepted_and_built(monkeypatch):
    from slime_app import weights
    from slime_core.extensions import WEIGHT_UPDATERS
    from slime_core.registry import Entry

    built = []
    WEIGHT_UPDATERS.register(Entry(name="toy_sync", factory=lambda cfg, client: built.append(client.urls) or "u"))
    try:
        cfg = SlimeArgs.from_dict({**BASE, **PLUGIN, "weight_sync": "toy_sync"})
        assert cfg.weight_sync == "toy_sync"
        assert weights.make_weight_updater(cfg, ["http://127.0.0.1:1"], rank=0) == "u"
        assert built == [["http://127.0.0.1:1"]]
    finally:
        WEIGHT_UPDATERS.unregister("toy_sync")
    with pytest.raises(ConfigError, match=r'--weight-sync: unknown transport \'toy_sync\' \(registered: '
                                          r'disk, distributed, lora, tensor; .*"slime.weight_updaters"'):  # fmt: skip
        SlimeArgs.from_dict({**BASE, **PLUGIN, "weight_sync": "toy_sync"})
    assert SlimeArgs.from_dict({**BASE, **PLUGIN}).weight_sync == "disk"  # auto still resolves


def test_a_backend_claiming_a_critic_must_declare_one():
    # supports_critic names a slime.critic_backends entry of the same name; without it the run failed after start-up.
    from slime_core.extensions import TrainBackendSpec

    TRAIN_BACKENDS.register(TrainBackendSpec(name="critic_less", factory=dict, needs_gpu=False, supports_critic=True))
    try:
        with pytest.raises(ConfigError, match=r"--advantage-estimator ppo: --train-backend critic_less declares "
                                              r'supports_critic, but no package declares its critic under '
                                              r'\[project.entry-points."slime.critic_backends"\] \(registered: fsdp, '
                                              r"megatron\)"):  # fmt: skip
            SlimeArgs.from_dict({**BASE, **PLUGIN, "train_backend": "critic_less", "advantage_estimator": "ppo"})
    finally:
        TRAIN_BACKENDS.unregister("critic_less")
    assert SlimeArgs.from_dict({**BASE, **PLUGIN, "train_backend": "fsdp", "advantage_estimator": "ppo"}).use_critic


def test_a_backend_of_its_own_checkpoint_format_resumes_from_its_save_dir(tmp_path):
    # The app tells hf / torch_dist / fsdp apart; a plugin's own format was "an unknown checkpoint" and refused.
    from slime_app.checkpoints import check_checkpoints
    from slime_core.extensions import TrainBackendSpec

    save = tmp_path / "save"
    save.mkdir()
    (save / "step_3.bin").write_bytes(b"x")
    TRAIN_BACKENDS.register(TrainBackendSpec(name="own_format", factory=dict, needs_gpu=False, checkpoint_format="own"))
    try:
        cfg = SlimeArgs.from_dict({**BASE, **PLUGIN, "train_backend": "own_format", "load": str(save)})
        assert check_checkpoints(cfg) == [
            f"--load {save}: --train-backend own_format saves own checkpoints, which this check does not recognize; "
            "the backend reads it when it starts"
        ]
    finally:
        TRAIN_BACKENDS.unregister("own_format")
    with pytest.raises(ValueError, match=r"an unknown checkpoint; --train-backend fsdp resumes its own fsdp"):
        check_checkpoints(SlimeArgs.from_dict({**BASE, **PLUGIN, "train_backend": "fsdp", "load": str(save)}))
