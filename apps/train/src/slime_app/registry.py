"""The app's view of the extension points: the backends (`slime_core.extensions`) and the weight transports.

The `distributed` transport's built-in lives in this app, so its registry is declared here.

A third-party package adds a transport by declaring, in its `pyproject.toml`::

    [project.entry-points."slime.weight_updaters"]
    my_transport = "my_pkg.sync:make_updater"        # called as factory(cfg, client), returns a WeightUpdater

Backends, engines, rewards and estimators are registered the same way (`slime_core.extensions` lists the
groups and their capability records).
"""

from __future__ import annotations

from slime_core.extensions import CRITIC_BACKENDS, TRAIN_BACKENDS
from slime_core.registry import Entry, Registry, UnknownNameError

__all__ = ["CRITIC_BACKENDS", "TRAIN_BACKENDS", "WEIGHT_UPDATERS", "UnknownNameError"]

#: `--weight-sync` (after validation resolved `auto`): `factory(cfg, client)` returning an object with
#: `update(buckets, weight_version)`; `client` is a `slime_rollout.engines.client.RolloutClient` of the engines.
WEIGHT_UPDATERS: Registry[Entry] = Registry(
    "slime.weight_updaters",
    flag="--weight-sync",
    kind="transport",
    entry_type=Entry,
    builtins={
        "tensor": "slime_rollout.weight_sync.updaters:TensorWeightUpdater",
        "disk": "slime_rollout.weight_sync.updaters:DiskWeightUpdater",
        "distributed": "slime_app.weights:distributed_weight_updater",
        "lora": "slime_rollout.weight_sync.lora:LoraWeightUpdater",
    },
)
