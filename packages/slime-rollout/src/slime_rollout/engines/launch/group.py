"""A group of running engines (`EngineGroup`), `launch_engines` that starts one, and `attach_router`.

`launch_engines(cfg, num_engines=..., gpus_per_engine=...)` starts one engine per index through an
`EngineLauncher` (`launcher.py`: command line by engine kind, subprocess, `/health_generate` wait), optionally
registers them with a router (`slime_rollout.engines.router`), and returns an `EngineGroup` (a context manager that
shuts everything down) whose `urls` / `router_url` are the run's engine addresses: the caller passes them on as values
(e.g. into `slime_core.config.PluginArgs.from_config`); the config is never written.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slime_rollout.engines import router
from slime_rollout.engines.launch.launcher import EngineLauncher

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs
    from slime_rollout.engines.process import EngineProcess

__all__ = ["EngineGroup", "attach_router", "launch_engines"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class EngineGroup:
    """Engines started together; shut them down with `shutdown()` or by leaving the `with` block.

    Attributes:
        processes: one `EngineProcess` per engine.
        router: the router process when one was started by `launch_engines`, else None.
        router_url: base URL of the router (started here or external), else None.
    """

    processes: list[EngineProcess]
    router: EngineProcess | None = None
    router_url: str | None = None
    _launcher: EngineLauncher | None = None
    _base_gpu_ids: Sequence[int] | None = None

    @property
    def urls(self) -> list[str]:
        """Engine base URLs in launch order."""
        return [p.url for p in self.processes]

    def dead_engines(self, timeout_s: float = 30.0) -> list[int]:
        """Indices of engines whose process exited or whose `/health_generate` fails within `timeout_s`."""
        import httpx

        dead = []
        for i, p in enumerate(self.processes):
            ok = p.alive()
            if ok:
                try:
                    ok = httpx.get(p.url + "/health_generate", timeout=timeout_s, trust_env=False).status_code == 200
                except httpx.HTTPError:
                    ok = False
            if not ok:
                dead.append(i)
        return dead

    def restart(self, index: int, *, grace_s: float = 2.0) -> str:
        """Replaces engine `index` by a fresh one and returns its URL (the same URL when its port is free again).

        The old process group is killed (SIGTERM, then SIGKILL after `grace_s`: a hung or stopped engine gets no
        longer). The new engine holds the initial `--hf-checkpoint` weights and version: push the current weights
        afterwards. When the URL changed, rebuild the clients that use it.

        Raises:
            RuntimeError: the group was not built by `launch_engines`, or the new engine failed to start.
        """
        if self._launcher is None:
            raise RuntimeError("this EngineGroup was not built by launch_engines and cannot restart engines")
        old = self.processes[index]
        self._unregister([old.url])
        old.shutdown(grace_s=grace_s)
        base_gpu = self._base_gpu_ids[index] if self._base_gpu_ids is not None else None
        port = urllib.parse.urlsplit(old.url).port
        self.processes[index] = self._launcher.launch(index, base_gpu_id=base_gpu, same_port=port)
        if self.router_url:
            router.register_worker(self.router_url, self.processes[index].url)
        logger.info("engine %d restarted at %s (pid %d)", index, self.processes[index].url, self.processes[index].pid)
        return self.processes[index].url

    def alive(self, index: int) -> bool:
        """Whether engine `index`'s main process is still running."""
        return self.processes[index].alive()

    def _unregister(self, urls: list[str]) -> None:
        if not self.router_url or self.router is not None:
            return  # no router, or our own router which goes away with the group
        for url in urls:
            try:
                router.unregister_worker(self.router_url, url)
            except Exception as exc:  # the engine is going away anyway; only log
                logger.warning("could not unregister %s from %s: %s", url, self.router_url, exc)

    def shutdown(self) -> None:
        """Unregisters from an external router (best effort) and stops every process; safe to call twice."""
        self._unregister([p.url for p in self.processes if p.alive()])
        for p in self.processes:
            p.shutdown()
        if self.router is not None:
            self.router.shutdown()

    def __enter__(self) -> EngineGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def launch_engines(
    cfg: SlimeArgs,
    *,
    num_engines: int,
    gpus_per_engine: int,
    base_gpu_ids: Sequence[int] | None = None,
    colocate: bool = False,
    startup_timeout_s: float | None = None,
    log_dir: str | os.PathLike | None = None,
    host: str = "127.0.0.1",
    base_port: int = 15000,
    mem_fraction_static: float | None = None,
    start_router: bool = False,
) -> EngineGroup:
    """Starts `num_engines` engines and waits until all answer `/health_generate`.

    Args:
        cfg: run config; reads `rollout_engine` ("sglang" | "reference"), `hf_checkpoint`, `seed` (engine i
            samples with seed `seed + i * gpus_per_engine`), `offload_rollout` (memory saver),
            `engine_python`, `sglang_args`, `router_args`, and `sglang_router_ip` / `sglang_router_port`
            (an existing router to register the engines with).
        num_engines: how many engines.
        gpus_per_engine: TP size of each SGLang engine (ignored by the reference engine).
        base_gpu_ids: first GPU of each engine (default `i * gpus_per_engine`).
        colocate: the engines release their memory while a trainer on their GPUs runs (colocated with
            `--offload-rollout`): enable SGLang's memory saver.
        startup_timeout_s: per-engine health wait in seconds (None: `--rollout-engine-startup-timeout`).
        log_dir: write each engine's output to `<log_dir>/engine_<i>.log` (None: inherit stdout).
        host: interface the engines bind (and the router started here).
        base_port: ports are probed upwards from here (each engine takes the next free one).
        mem_fraction_static: SGLang `--mem-fraction-static` (see `build_sglang_command`).
        start_router: start sglang-router for the engines unless `--sglang-router-ip/port` name one (needs
            `slime-rollout[router]`).

    Returns:
        The running group: its `urls` and `router_url` are the engine addresses of the run (`cfg` is frozen
        and not modified).

    Raises:
        ValueError: bad engine kind or counts, or no `--hf-checkpoint` (naming the flag).
        RuntimeError/TimeoutError: an engine failed to start (already-started engines are shut down).
    """
    if num_engines < 1:
        raise ValueError(f"need num_engines >= 1, got {num_engines}")
    if base_gpu_ids is not None and len(base_gpu_ids) != num_engines:
        raise ValueError(f"base_gpu_ids has {len(base_gpu_ids)} entries for {num_engines} engines")
    launcher = EngineLauncher(
        cfg,
        gpus_per_engine=gpus_per_engine,
        colocate=colocate,
        startup_timeout_s=startup_timeout_s,
        log_dir=log_dir,
        host=host,
        base_port=base_port,
        mem_fraction_static=mem_fraction_static,
    )
    gpu_of = (lambda i: base_gpu_ids[i]) if base_gpu_ids is not None else (lambda i: None)
    group = EngineGroup(processes=[], _launcher=launcher, _base_gpu_ids=base_gpu_ids)
    try:
        # All engines load at once; then each is waited for.
        group.processes = [launcher.start(i, base_gpu_id=gpu_of(i)) for i in range(num_engines)]
        for i in range(num_engines):
            group.processes[i] = launcher.ready(i, group.processes[i], base_gpu_id=gpu_of(i))
        attach_router(cfg, group, host, start_router=start_router)
    except BaseException:
        group.shutdown()
        raise
    logger.info("%d %s engine(s) ready: %s", num_engines, cfg.rollout_engine, ", ".join(group.urls))
    return group


def attach_router(cfg: SlimeArgs, group: Any, host: str, *, start_router: bool) -> None:
    """Registers the engines with the router given by `--sglang-router-ip/port`, or with one started here.

    Args:
        cfg: run config (`sglang_router_ip`, `sglang_router_port`, what `router.start_router` reads).
        group: an engine group: its `urls` are registered; its `router` / `router_url` are set here.
        host: interface a router started here binds.
        start_router: start sglang-router when no router is named.
    """
    ip, port = cfg.sglang_router_ip, cfg.sglang_router_port
    if ip and port:
        group.router_url = f"http://{ip}:{port}"
    elif start_router:
        # As many requests in flight as the client sends (--sglang-server-concurrency per engine): the router's
        # own limit must not cap them silently.
        limit = cfg.sglang_server_concurrency * len(group.urls)
        group.router = router.start_router(cfg, host=host, max_concurrent_requests=limit)  # needs sglang-router
        group.router_url = group.router.url
    else:
        return
    for url in group.urls:
        router.register_worker(group.router_url, url)
