"""Engines on the nodes of their rollout bundles: one `EngineHost` actor per engine, `HostedEngines` for the manager.

The rollout manager runs on the driver's node; an engine must run where its GPUs are, on the node of its first
rollout bundle of the placement group. `EngineHost` is a small actor scheduled into that bundle (it asks for no
resources of its own: the bundle's GPUs belong to the engine, which SGLang addresses with `--base-gpu-id`). It
starts the engine process there, bound to the node's address (`ray.util.get_node_ip_address()`, so trainer ranks
and the manager on other nodes reach it), and supervises it: is it alive, restart on the same port, shutdown. The
engine process gets a parent-death signal, so it dies with its host (and the host with the manager that owns it).

`HostedEngines` is the manager's handle; it has `slime_rollout.engines.EngineGroup`'s interface (`urls`,
`router_url`, `alive`, `restart`, `shutdown`), so the health monitor (`slime_app.engine_faults`) restarts an engine
on any node the same way. A host that died (its node went away) is made again in the same bundle on the next restart.
Without a rollout bundle (a CPU run without `--rollout-num-gpus`), the host runs on the manager's node.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import urllib.parse
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["EngineHost", "EngineSite", "HostedEngines", "engine_sites"]

RAY_SLACK_S = 120.0  # beyond --rollout-engine-startup-timeout: the host's own wait fails first, with the engine's log
ALIVE_TIMEOUT_S = 10.0  # a host that does not say whether its engine runs: unknown, the HTTP check decides
SHUTDOWN_TIMEOUT_S = 60.0
PORT_STRIDE = 10  # engine i probes ports from base + i * stride: hosts on one machine rarely race for a port
# First engine port probed. Several runs started at once on one machine race for the same free port (an engine
# binds it only after loading its model): give each its own range with SLIME_ENGINE_BASE_PORT.
BASE_PORT_ENV = "SLIME_ENGINE_BASE_PORT"


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSite:
    """Where one engine runs.

    Attributes:
        index: the engine's position in the run (its seed and log file follow it).
        bundle: index of its first rollout bundle in the placement group; None: on the rollout manager's node.
        base_gpu_id: its first GPU on that node (physical id); None: GPU `index * gpus_per_engine` (CPU runs).
    """

    index: int
    bundle: int | None
    base_gpu_id: int | None


def engine_sites(cfg: SlimeArgs, rollout_bundles: list[int], rollout_gpu_ids: list[int]) -> list[EngineSite]:
    """One site per engine: `--rollout-num-gpus / --rollout-num-gpus-per-engine` engines (at least one).

    Args:
        cfg: reads `rollout_num_gpus` and `rollout_num_gpus_per_engine`.
        rollout_bundles: the placement's rollout bundles, sorted (`slime_app.cluster.Placement`); engine i takes
            bundles `[i * per_engine, (i + 1) * per_engine)`. Empty: no bundle (the manager's node).
        rollout_gpu_ids: physical GPU id of each rollout bundle (empty on CPU).
    """
    per_engine = cfg.rollout_num_gpus_per_engine
    num_engines = max(1, (cfg.rollout_num_gpus or 1) // per_engine)
    return [
        EngineSite(
            index=i,
            bundle=rollout_bundles[i * per_engine] if i * per_engine < len(rollout_bundles) else None,
            base_gpu_id=rollout_gpu_ids[i * per_engine] if i * per_engine < len(rollout_gpu_ids) else None,
        )
        for i in range(num_engines)
    ]


class EngineHost:
    """Starts and supervises one engine process on this actor's node (see the module docstring).

    Methods may run at once (a threaded actor): `alive` answers while a restart waits for the new engine.

    Args:
        cfg: the run config (what `slime_rollout.engines.launch.EngineLauncher` reads).
        site: which engine, and its first GPU.
        log_dir: the engine's log goes to `<log_dir>/engine_<index>.log` on this node.
        base_port: first port probed on this node.
    """

    def __init__(self, cfg: SlimeArgs, site: EngineSite, *, log_dir: str, base_port: int):
        from slime_rollout.engines.launch import EngineLauncher

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.site = site
        self.node_ip = ray.util.get_node_ip_address()
        self.launcher = EngineLauncher(
            cfg,
            gpus_per_engine=cfg.rollout_num_gpus_per_engine,
            # The memory saver (and, for partial syncs, a host copy of the weights) only where the loop releases
            # the engines' memory: colocated engines that stay resident (--no-offload-rollout) never release it.
            colocate=bool(cfg.colocate and cfg.offload_rollout),
            startup_timeout_s=cfg.rollout_engine_startup_timeout,
            log_dir=log_dir,
            host=self.node_ip,  # the node's address, not loopback: reached from the other nodes
            base_port=base_port,
        )
        self.proc = None
        self._lock = threading.Lock()  # one start or restart at a time

    def start(self) -> tuple[str, int]:
        """Starts the engine and waits until it serves; returns its URL and pid."""
        with self._lock:
            self.proc = self.launcher.launch(self.site.index, base_gpu_id=self.site.base_gpu_id)
            return self.proc.url, self.proc.pid

    def alive(self) -> bool:
        """Whether the engine's main process runs."""
        proc = self.proc
        return proc is not None and proc.alive()

    def restart(self, grace_s: float = 2.0) -> tuple[str, int]:
        """Kills the engine's process group (SIGTERM, SIGKILL after `grace_s`) and starts a new engine on its port.

        Returns:
            The new engine's URL (the old one when its port could be bound again) and pid.
        """
        with self._lock:
            old = self.proc
            port = None
            if old is not None:
                port = urllib.parse.urlsplit(old.url).port
                old.shutdown(grace_s=grace_s)
            self.proc = self.launcher.launch(self.site.index, base_gpu_id=self.site.base_gpu_id, same_port=port)
            return self.proc.url, self.proc.pid

    def shutdown(self) -> None:
        """Stops the engine (its whole process group)."""
        if self.proc is not None:
            self.proc.shutdown()


_RemoteEngineHost = ray.remote(num_cpus=0, max_concurrency=4)(EngineHost)


class HostedEngines:
    """The run's engines, each started by its `EngineHost` on its bundle's node (see the module docstring).

    Args:
        cfg: the run config.
        sites: one site per engine (`engine_sites`).
        placement_group: the run's placement group (None when no site has a bundle).
    """

    def __init__(self, cfg: SlimeArgs, sites: list[EngineSite], placement_group: Any | None):
        self.cfg, self.sites, self.placement_group = cfg, sites, placement_group
        self._start_wait_s = cfg.rollout_engine_startup_timeout + RAY_SLACK_S
        self.log_dir = os.path.join(cfg.output_dir, "engine_logs")
        self.hosts: list[Any] = []
        self.urls: list[str] = []
        self.router = None  # a router process started for these engines (`attach_router`), else None
        self.router_url: str | None = None

    def _make_host(self, site: EngineSite) -> Any:
        if site.bundle is not None:
            strategy: Any = PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=site.bundle
            )
        else:
            strategy = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        base_port = int(os.environ.get(BASE_PORT_ENV, "15000")) + site.index * PORT_STRIDE
        return _RemoteEngineHost.options(scheduling_strategy=strategy).remote(
            self.cfg, site, log_dir=self.log_dir, base_port=base_port
        )

    def start(self) -> HostedEngines:
        """Starts every engine on its node at once, waits until all serve, registers them with a named router.

        Raises:
            ray.exceptions.RayTaskError: an engine failed to start (its log tail is in the message); every engine
                started is shut down first.
        """
        from slime_rollout.engines.launch import attach_router

        try:
            self.hosts = [self._make_host(site) for site in self.sites]
            started = ray.get([h.start.remote() for h in self.hosts], timeout=self._start_wait_s)
            self.urls = [url for url, _ in started]
            attach_router(self.cfg, self, ray.util.get_node_ip_address(), start_router=False)
        except BaseException:
            self.shutdown()
            raise
        logger.info("%d %s engine(s) ready: %s", len(self.urls), self.cfg.rollout_engine, ", ".join(self.urls))
        return self

    async def alive(self, index: int) -> bool:
        """Whether engine `index`'s process runs, asked of its host; a host that is gone counts as a dead engine."""
        try:
            return bool(await asyncio.wait_for(self.hosts[index].alive.remote(), timeout=ALIVE_TIMEOUT_S))
        except TimeoutError:
            return True  # not known: the /health_generate check decides
        except ray.exceptions.RayActorError:
            return False

    def restart(self, index: int, *, grace_s: float = 2.0) -> str:
        """Replaces engine `index` by a fresh one on its node and returns its URL (the old URL when its port is free).

        Blocking; the health monitor runs it in a thread. The new engine serves the initial `--hf-checkpoint`
        weights: push the current ones afterwards.

        Raises:
            ray.exceptions.RayTaskError, ray.exceptions.GetTimeoutError: the new engine did not start.
        """
        from slime_rollout.engines import router

        self._unregister([self.urls[index]])
        try:
            url, pid = ray.get(self.hosts[index].restart.remote(grace_s), timeout=self._start_wait_s)
        except ray.exceptions.RayActorError:
            logger.warning("engine host %d is gone (its node?); starting a new one in the same bundle", index)
            self.hosts[index] = self._make_host(self.sites[index])
            url, pid = ray.get(self.hosts[index].start.remote(), timeout=self._start_wait_s)
        self.urls[index] = url
        if self.router_url:
            router.register_worker(self.router_url, url)
        logger.info("engine %d restarted at %s (pid %d)", index, url, pid)
        return url

    def _unregister(self, urls: list[str]) -> None:
        from slime_rollout.engines import router

        if not self.router_url or self.router is not None:
            return  # no router, or our own, which goes away with the engines
        for url in urls:
            try:
                router.unregister_worker(self.router_url, url)
            except Exception as exc:  # noqa: BLE001 - the engine is going away anyway; only log
                logger.warning("could not unregister %s from %s: %s", url, self.router_url, exc)

    def shutdown(self) -> None:
        """Stops every engine and its host (engines that do not stop within a minute die with their host)."""
        self._unregister(list(self.urls))
        refs = [h.shutdown.remote() for h in self.hosts]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=SHUTDOWN_TIMEOUT_S)
        for host in self.hosts:
            ray.kill(host)
        self.hosts = []
        if self.router is not None:
            self.router.shutdown()
            self.router = None
