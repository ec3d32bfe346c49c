"""Training backends and weight-sync transports are found by name: built-ins, entry points, registrations."""

import importlib.metadata
import subprocess
import sys

import pytest

from slime_app import registry
from slime_app.registry import CRITIC_BACKENDS, TRAIN_BACKENDS, WEIGHT_UPDATERS, UnknownNameError
from slime_app.weights import distributed_weight_updater, make_weight_updater
from slime_core.config import SlimeArgs


def test_both_backends_resolve_by_name():
    from slime_train_fsdp import FSDPTrainBackend
    from slime_train_megatron import MegatronTrainBackend

    assert TRAIN_BACKENDS.get("fsdp") is FSDPTrainBackend
    assert TRAIN_BACKENDS.get("megatron") is MegatronTrainBackend
    assert TRAIN_BACKENDS.names() == ["fsdp", "megatron"]


def test_every_weight_updater_resolves_by_name():
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater, TensorWeightUpdater

    assert WEIGHT_UPDATERS.get("tensor") is TensorWeightUpdater
    assert WEIGHT_UPDATERS.get("disk") is DiskWeightUpdater
    assert WEIGHT_UPDATERS.get("distributed") is distributed_weight_updater
    from slime_rollout.weight_sync.lora import LoraWeightUpdater

    assert WEIGHT_UPDATERS.get("lora") is LoraWeightUpdater
    assert WEIGHT_UPDATERS.names() == ["disk", "distributed", "lora", "tensor"]


def test_unknown_names_are_rejected_listing_the_known_ones():
    with pytest.raises(KeyError, match=r"--train-backend: unknown backend 'jax' \(known: fsdp, megatron\)"):
        TRAIN_BACKENDS.get("jax")
    with pytest.raises(
        ValueError, match=r"--weight-sync: unknown transport 'rdma' \(known: disk, distributed, lora, tensor\)"
    ):
        WEIGHT_UPDATERS.get("rdma")
    assert issubclass(UnknownNameError, KeyError) and issubclass(UnknownNameError, ValueError)


def test_builtins_resolve_without_entry_point_metadata(monkeypatch):
    # The GPU machines run from source on PYTHONPATH: no dist-info, so no entry points.
    monkeypatch.setattr(registry.importlib.metadata, "entry_points", lambda group: [])
    from slime_rollout.weight_sync.updaters import DiskWeightUpdater
    from slime_train_fsdp import FSDPTrainBackend

    assert TRAIN_BACKENDS.get("fsdp") is FSDPTrainBackend
    assert WEIGHT_UPDATERS.get("disk") is DiskWeightUpdater


def test_installed_packages_declare_the_builtins_as_entry_points():
    groups = (
        ("slime.train_backends", TRAIN_BACKENDS),
        ("slime.critic_backends", CRITIC_BACKENDS),
        ("slime.weight_updaters", WEIGHT_UPDATERS),
    )
    for group, reg in groups:
        declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}
        assert declared == reg._builtins, group


def test_third_party_entry_points_and_registrations(monkeypatch):
    fake = importlib.metadata.EntryPoint(name="mine", value="collections:OrderedDict", group="slime.train_backends")
    monkeypatch.setattr(
        registry.importlib.metadata, "entry_points", lambda group: [fake] if group == fake.group else []
    )
    from collections import OrderedDict

    assert TRAIN_BACKENDS.get("mine") is OrderedDict and "mine" in TRAIN_BACKENDS.names()

    def factory():
        return "backend"

    TRAIN_BACKENDS.register("local", factory)
    try:
        assert TRAIN_BACKENDS.get("local") is factory
        with pytest.raises(ValueError, match="already registered"):
            TRAIN_BACKENDS.register("local", factory)
    finally:
        TRAIN_BACKENDS.unregister("local")
    with pytest.raises(KeyError):
        TRAIN_BACKENDS.get("local")


def test_fsdp_does_not_import_megatron():
    code = (
        "import sys\n"
        "from slime_app.registry import TRAIN_BACKENDS\n"
        "TRAIN_BACKENDS.get('fsdp')\n"
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
