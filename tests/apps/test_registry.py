"""Training backends and weight-sync transports are found by name: built-ins, entry points, registrations."""

import importlib.metadata
import subprocess
import sys

import pytest

from slime_app.registry import CRITIC_BACKENDS, TRAIN_BACKENDS, WEIGHT_UPDATERS, UnknownNameError
from slime_app.train_actor import make_backend
from slime_app.weights import distributed_weight_updater, make_weight_updater
from slime_core import registry
from slime_core.config import SlimeArgs
from slime_core.extensions import PREFLIGHT_CHECKS, REWARDS, ROLLOUT_ENGINES, TrainBackendSpec
from slime_rollout.rewards import RM_TYPES


def test_both_backends_resolve_by_name_with_their_capabilities():
    from slime_train_fsdp import FSDPCriticBackend, FSDPTrainBackend
    from slime_train_megatron import MegatronTrainBackend

    fsdp, megatron = TRAIN_BACKENDS.get("fsdp"), TRAIN_BACKENDS.get("megatron")
    assert fsdp.load() is FSDPTrainBackend and megatron.load() is MegatronTrainBackend
    assert (fsdp.needs_gpu, fsdp.supports_lora, fsdp.checkpoint_format) == (False, True, "fsdp")
    assert (megatron.needs_gpu, megatron.supports_lora, megatron.checkpoint_format) == (True, False, "torch_dist")
    assert CRITIC_BACKENDS.get("fsdp").load() is FSDPCriticBackend
    assert {"fsdp", "megatron"} <= set(TRAIN_BACKENDS.names())


def test_every_weight_updater_resolves_by_name():
    from slime_rollout.weight_sync.lora import LoraWeightUpdater
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater, TensorWeightUpdater

    assert WEIGHT_UPDATERS.get("tensor").load() is TensorWeightUpdater
    assert WEIGHT_UPDATERS.get("disk").load() is DiskWeightUpdater
    assert WEIGHT_UPDATERS.get("distributed").load() is distributed_weight_updater
    assert WEIGHT_UPDATERS.get("lora").load() is LoraWeightUpdater
    assert WEIGHT_UPDATERS.names() == ["disk", "distributed", "lora", "tensor"]


def test_unknown_names_are_rejected_listing_the_registered_ones_and_the_group():
    with pytest.raises(KeyError, match=r"--train-backend: unknown train backend 'jax' \(registered: fsdp, megatron"):
        TRAIN_BACKENDS.get("jax")
    with pytest.raises(ValueError, match=r'--weight-sync: unknown transport .*"slime.weight_updaters"'):
        WEIGHT_UPDATERS.get("rdma")
    assert issubclass(UnknownNameError, KeyError) and issubclass(UnknownNameError, ValueError)


def test_builtins_resolve_without_entry_point_metadata(monkeypatch):
    # The GPU machines run from source on PYTHONPATH: no dist-info, so no entry points.
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [])
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater

    registries = (TRAIN_BACKENDS, WEIGHT_UPDATERS, ROLLOUT_ENGINES)
    try:
        for reg in registries:
            reg.refresh()
        assert TRAIN_BACKENDS.get("fsdp").name == "fsdp"
        assert WEIGHT_UPDATERS.get("disk").load() is DiskWeightUpdater
        assert ROLLOUT_ENGINES.get("reference").needs_gpu is False
        assert TRAIN_BACKENDS._entry_points() == {}  # found through the built-in fallback
    finally:
        monkeypatch.undo()
        for reg in registries:
            reg.refresh()


def test_installed_packages_declare_the_builtins_as_entry_points():
    for reg in (TRAIN_BACKENDS, CRITIC_BACKENDS, ROLLOUT_ENGINES, REWARDS, PREFLIGHT_CHECKS):
        declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=reg.group)}
        builtins = reg._builtins
        assert {name: declared[name] for name in builtins} == builtins, reg.group
    # The graders slime_rollout.rewards dispatches itself are exactly the built-in reward records.
    assert set(RM_TYPES) == set(REWARDS._builtins) and all(REWARDS.get(n).factory is None for n in RM_TYPES)
    declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=WEIGHT_UPDATERS.group)}
    assert declared.items() <= WEIGHT_UPDATERS._builtins.items()  # `distributed` is the app's own


def test_in_process_registration_is_selected_by_the_app_factory(tmp_path):
    class Backend:
        pass

    TRAIN_BACKENDS.register(TrainBackendSpec(name="local", factory=Backend, needs_gpu=False))
    try:
        cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "local"})
        assert isinstance(make_backend(cfg), Backend)
        with pytest.raises(ValueError, match="already registered"):
            TRAIN_BACKENDS.register(TrainBackendSpec(name="local", factory=Backend))
    finally:
        TRAIN_BACKENDS.unregister("local")
    with pytest.raises(KeyError):
        TRAIN_BACKENDS.get("local")


def test_fsdp_does_not_import_megatron():
    code = (
        "import sys\n"
        "from slime_app.registry import TRAIN_BACKENDS\n"
        "TRAIN_BACKENDS.get('fsdp').load()\n"
        "print(sorted(m for m in ('megatron', 'slime_train_megatron') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_make_weight_updater_builds_the_configured_transport(tmp_path):
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater

    cfg = SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "weight_sync": "disk", "output_dir": str(tmp_path)}
    )
    assert isinstance(make_weight_updater(cfg, ["http://127.0.0.1:1"], rank=0), DiskWeightUpdater)
    assert make_weight_updater(cfg, ["http://127.0.0.1:1"], rank=1) is None  # only rank 0 talks to the engines
    assert make_weight_updater(cfg, [], rank=0) is None
