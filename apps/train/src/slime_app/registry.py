"""The app's view of the extension points: the backends and weight transports of `slime_core.extensions`.

A third-party package adds a transport by declaring, in its `pyproject.toml`::

    [project.entry-points."slime.weight_updaters"]
    my_transport = "my_pkg.sync:make_updater"        # called as factory(cfg, client), returns a WeightUpdater

and `--weight-sync my_transport` selects it (the config checks the name). The `distributed` transport's code lives
in this app (`slime_app.weights`). Backends, engines, rewards and estimators are registered the same way
(`slime_core.extensions` lists the groups and their capability records).
"""

from __future__ import annotations

from slime_core.extensions import CRITIC_BACKENDS, TRAIN_BACKENDS, WEIGHT_UPDATERS
from slime_core.registry import UnknownNameError

__all__ = ["CRITIC_BACKENDS", "TRAIN_BACKENDS", "WEIGHT_UPDATERS", "UnknownNameError"]
