"""Ray start-up and the placement group: one bundle per GPU (one per trainer rank on a CPU machine).

Layout (as in the original, §1.2 of the feature inventory):
- colocated: `max(actor_gpus, rollout_gpus)` bundles; trainer rank i and the engines share bundle i.
- disaggregated: `actor_gpus + rollout_gpus` bundles; engines start at bundle `actor_gpus`.
- `--debug-rollout-only`: rollout bundles only; `--debug-train-only`: actor bundles only.
- external engines (`--rollout-engine-urls`, `--rollout-external-engine-addrs`): no rollout bundles (the original's
  layout for them); `--rollout-num-gpus` then reserves nothing.
- PPO: the critic's ranks share the actor's bundles (the original's layout), or, with
  `--critic-num-nodes/--critic-num-gpus-per-node`, get `actor_gpus` bundles of their own right after the
  actor's (before the engines' when disaggregated).

Bundles are sorted by (node IP, node id, GPU id) so that logical rank i always maps to the same device and the
bundles of one node are consecutive (two nodes of one machine share an IP). An engine runs on the node of its first
rollout bundle (`slime_app.engine_hosts`); its other GPUs must be on that node.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from typing import Any

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # workers use this venv, not a uv-made one
# A loaded 2-core machine (CI) starts Ray's processes slowly: more time for workers to register and for the raylet to
# reach its runtime-env agent. The node's own start-up limits are fixed in Ray 2.60 (slime_app.ray_start).
os.environ.setdefault("RAY_raylet_start_wait_time_s", "300")
os.environ.setdefault("RAY_agent_register_timeout_ms", "300000")
os.environ.setdefault("RAY_worker_register_timeout_seconds", "300")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local single-user cluster; no token file in ~/.ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The raylet of a local instance prestarts Python workers for the first driver, one per logical CPU (on a CPU machine
# max(cores, 8), see init_ray); slime's actors start workers of their own, so these sat idle, each a process importing
# Ray while the engines and trainer start: a two-rollout CPU run took 33.1 s with them, 30.1 s without (two pairs).
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

import ray  # noqa: E402
from ray.util.placement_group import (  # noqa: E402
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from slime_app import interrupts  # noqa: E402
from slime_app.bundle_layout import bundle_layout, layout_text  # noqa: E402
from slime_app.ray_start import check_ray_address, ray_address, start_local_ray  # noqa: E402
from slime_core.config import SlimeArgs  # noqa: E402
from slime_rollout.engines.launch import nccl_cumem_enable  # noqa: E402

logger = logging.getLogger(__name__)

# How long the placement group may wait for its bundles on a cluster (a busy one frees GPUs slowly, an autoscaler adds
# nodes); a local node cannot grow, so there a layout it cannot hold is refused before the group is made.
PLACEMENT_GROUP_TIMEOUT_S = 600
PLACEMENT_LOG_S = 30  # how often a pending group says what it waits for (the original's interval)


class PlacementError(ValueError):
    """The cluster cannot hold the run's layout (flags asking for more GPUs than it has); the one line to show."""


class PlacementTimeout(RuntimeError):
    """The placement group was not placed within `PLACEMENT_GROUP_TIMEOUT_S`; the one line to show."""


def has_gpu() -> bool:
    """Whether this machine has a CUDA device (decides NCCL vs gloo, GPU vs CPU bundles)."""
    import torch

    return torch.cuda.is_available()


def init_ray(cfg: SlimeArgs) -> None:
    """Starts a local Ray instance, or connects to `--ray-address` / `RAY_ADDRESS` when given.

    A local node that times out during start-up is tried once more when the machine's load has fallen
    (`slime_app.ray_start`); a second time-out raises `RayStartupError` with one line. An explicit address is
    checked first with one TCP connection (`check_ray_address`): nothing there raises `RayAddressError` with
    one line within seconds, not after Ray's minutes of retries.

    Workers import `slime_app` (the actor classes live here) and the slime packages from the environment
    they run in: this venv for a local instance (where the workspace installs them), the cluster's own
    environment for `--ray-address`. Nothing is put on their `PYTHONPATH`.
    """
    address = ray_address(cfg)
    env_vars = {
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "TOKENIZERS_PARALLELISM": "false",
        # Required on the lent GPU hosts; harmless elsewhere.
        "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
        # One value for trainers and engines (a mismatch hangs the NCCL weight update), set before any NCCL use.
        "NCCL_CUMEM_ENABLE": nccl_cumem_enable(),
    }
    for key in ("SLIME_SGLANG_PYTHONPATH", "SLIME_SGLANG_ARGS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if key in os.environ:
            env_vars[key] = os.environ[key]
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env_vars}, "log_to_driver": True}
    if address:
        kwargs["address"] = address
    else:
        kwargs["include_dashboard"] = False
        if not has_gpu():
            # CPU machine: bundles are logical slots; never let Ray's CPU accounting block the run.
            kwargs["num_cpus"] = max(os.cpu_count() or 1, 8)
    if address:
        # Ray's own wait for an unreachable address is minutes of C++ retries: fail in seconds, with one line.
        check_ray_address(address, flag="--ray-address" if cfg.ray_address else "RAY_ADDRESS")
        ray.init(**kwargs)
    else:
        start_local_ray(ray.init, ray.shutdown, kwargs, retry_wait_s=cfg.ray_startup_retry_wait)
    # ray.init replaced the driver's SIGTERM handler and its core worker put a stack-printing one on top.
    interrupts.reclaim()


@dataclasses.dataclass(kw_only=True)
class Placement:
    """The placement group and which sorted bundles serve the trainer and the engines.

    Attributes:
        group: the Ray placement group (None when nothing needs a bundle).
        actor_bundles: bundle indices of trainer ranks, rank order.
        rollout_bundles: bundle indices of engine GPUs, in order.
        rollout_gpu_ids: physical GPU id for each rollout bundle (empty on CPU).
        use_gpu: whether bundles hold GPUs.
        critic_bundles: bundle indices of the PPO critic's ranks, rank order (the actor's when it shares them;
            empty without a critic).
        bundle_nodes: Ray node id of every bundle, by bundle index (empty without a group).
    """

    group: PlacementGroup | None
    actor_bundles: list[int]
    rollout_bundles: list[int]
    rollout_gpu_ids: list[int]
    use_gpu: bool
    critic_bundles: list[int] = dataclasses.field(default_factory=list)
    bundle_nodes: list[str] = dataclasses.field(default_factory=list)

    @property
    def critic_shares_actor_gpus(self) -> bool:
        """Whether the critic runs on the actor's bundles (the two are then offloaded in turn)."""
        return bool(self.critic_bundles) and self.critic_bundles == self.actor_bundles

    def strategy(self, bundle: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy that pins an actor to one bundle."""
        return PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=bundle)


@ray.remote(num_cpus=0)
def _bundle_info() -> tuple[str, str, int]:
    gpu_ids = ray.get_gpu_ids()
    node_id = ray.get_runtime_context().get_node_id()
    return ray.util.get_node_ip_address(), node_id, int(gpu_ids[0]) if gpu_ids else -1


def bundle_sites(group: PlacementGroup, num_bundles: int, use_gpu: bool) -> list[tuple[str, str, int]]:
    """Where each bundle of a placed group is: `(node IP, Ray node id, GPU id)`, by bundle index.

    The GPU id Ray gave a bundle is known only inside it, so with GPUs a task runs in each bundle. Without (GPU id
    -1), the group's table and the node list say the rest: a task would start a Ray worker process per bundle (~2.5
    CPU-s each on the 2-core CI machine) that then sat idle for the whole run, since a worker that ran a task never
    hosts an actor.

    Args:
        group: a placement group that is ready.
        num_bundles: its bundle count.
        use_gpu: whether its bundles hold GPUs.
    """
    if use_gpu:
        return ray.get(
            [
                _bundle_info.options(
                    num_gpus=0.01,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=i
                    ),
                ).remote()
                for i in range(num_bundles)
            ]
        )
    node_of = placement_group_table(group)["bundles_to_node_id"]
    ip_of = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    return [(ip_of[node_of[i]], node_of[i], -1) for i in range(num_bundles)]


def _sort_key(info: tuple[str, str, int]) -> tuple:
    ip, node_id, gpu = info
    try:
        ip_key = tuple(int(x) for x in ip.split("."))
    except ValueError:
        ip_key = (ip,)
    return ip_key, node_id, gpu


def check_engines_within_nodes(rollout_nodes: list[str], gpus_per_engine: int) -> None:
    """Every engine's bundles are on one node (an SGLang engine spans GPUs of one machine).

    Args:
        rollout_nodes: Ray node id of each rollout bundle, in engine order.
        gpus_per_engine: `--rollout-num-gpus-per-engine`.

    Raises:
        PlacementError: an engine's bundles are on several nodes (naming the engine and the flag); the command line
            prints it as one line (exit 2), as any layout the cluster cannot hold (it was a traceback).
    """
    for start in range(0, len(rollout_nodes), gpus_per_engine):
        nodes = set(rollout_nodes[start : start + gpus_per_engine])
        if len(nodes) > 1:
            raise PlacementError(
                f"engine {start // gpus_per_engine} would span {len(nodes)} nodes: --rollout-num-gpus-per-engine "
                f"{gpus_per_engine} must divide the rollout GPUs of each node"
            )


def create_placement(cfg: SlimeArgs) -> Placement:
    """Creates the placement group for the run's layout (see the module docstring)."""
    use_gpu = has_gpu()
    actor_gpus = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
    if cfg.rollout_engine_urls and (cfg.rollout_num_gpus or 0) > (actor_gpus if cfg.colocate else 0):
        logger.warning(
            "--rollout-num-gpus %d: no GPUs are reserved for engines given by --rollout-engine-urls "
            "(--rollout-external-engine-addrs); they run where they were started", cfg.rollout_num_gpus,
        )  # fmt: skip
    layout = bundle_layout(cfg)
    num_bundles, actor_count, rollout_offset = layout.num_bundles, layout.actor_count, layout.rollout_offset
    rollout_gpus, critic_offset, critic_gpus = layout.rollout_gpus, layout.critic_offset, layout.critic_gpus
    if num_bundles == 0:
        return Placement(group=None, actor_bundles=[], rollout_bundles=[], rollout_gpu_ids=[], use_gpu=use_gpu)

    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    resource, local = ("GPU" if use_gpu else "CPU"), not ray_address(cfg)
    need = f"{num_bundles} {resource} bundle(s): {layout_text(cfg)}"
    totals = ray.cluster_resources()
    for kind in bundle:  # a GPU bundle also takes a CPU (a container's CPU limit can be below its GPU count)
        check_capacity(num_bundles, kind, totals.get(kind, 0), need, local=local, gpu_machine=use_gpu)
    group = placement_group([dict(bundle) for _ in range(num_bundles)], strategy="PACK")
    wait_for_group(group, num_bundles, resource, need)
    infos = bundle_sites(group, num_bundles, use_gpu)
    order = sorted(range(num_bundles), key=lambda i: _sort_key(infos[i]))
    rollout = order[rollout_offset : rollout_offset + rollout_gpus]
    actor = order[:actor_count]
    critic = order[critic_offset : critic_offset + critic_gpus] if critic_gpus else []
    check_engines_within_nodes([infos[i][1] for i in rollout], cfg.rollout_num_gpus_per_engine)
    placement = Placement(
        group=group,
        actor_bundles=actor,
        rollout_bundles=rollout,
        rollout_gpu_ids=[infos[i][2] for i in rollout] if use_gpu else [],
        use_gpu=use_gpu,
        critic_bundles=critic if critic else (list(actor) if cfg.use_critic and actor_count else []),
        bundle_nodes=[info[1] for info in infos],
    )
    logger.info(
        "placement: %d bundles (%s) on %d node(s) (%s), trainer bundles %s, rollout bundles %s%s",
        num_bundles,
        "GPU" if use_gpu else "CPU",
        len({info[1] for info in infos}),
        ", ".join(f"bundle {i}: {infos[i][0]}" for i in range(num_bundles)),
        placement.actor_bundles,
        placement.rollout_bundles,
        f", critic bundles {placement.critic_bundles}" if placement.critic_bundles else "",
    )
    return placement


def check_capacity(
    num_bundles: int, resource: str, total: float, need: str, *, local: bool, gpu_machine: bool = False
) -> None:
    """Refuses a layout a local Ray node cannot hold, before its placement group would wait for it forever.

    Args:
        num_bundles: bundles the layout needs (one `resource` each).
        resource: "GPU" or "CPU" (on a machine without CUDA a bundle is one of the node's CPU slots; with CUDA each
            GPU bundle also takes one CPU).
        total: how many of `resource` the Ray cluster has registered (`ray.cluster_resources()`).
        need: the layout in words (`layout_text`), named in the message.
        local: whether the run started this Ray node (it cannot grow); on a cluster an autoscaler may add nodes, so
            a shortfall is only logged and `wait_for_group` bounds the wait.
        gpu_machine: whether the bundles hold GPUs (words the CPU shortfall).

    Raises:
        PlacementError: a local node with fewer than `num_bundles` of `resource` (the message names the flags).
    """
    if num_bundles <= total:
        return
    if local:
        if resource == "GPU":
            where = f"this machine has {total:g} GPU(s) (CUDA_VISIBLE_DEVICES)"
        elif gpu_machine:
            where = f"the local Ray node has {total:g} CPUs (each GPU bundle also takes one; Ray counts the CPU limit)"
        else:
            where = (
                f"the local Ray node has {total:g} CPU slots (no CUDA here: each GPU the flags name takes one slot, "
                "max(cores, 8) of them)"
            )
        raise PlacementError(f"the run needs {need}, and {where}; lower those flags")
    logger.warning(
        "the run needs %s; the Ray cluster has %g %s registered: waiting up to %d s for nodes to join",
        need, total, resource, PLACEMENT_GROUP_TIMEOUT_S,
    )  # fmt: skip


def wait_for_group(group: PlacementGroup, num_bundles: int, resource: str, need: str) -> None:
    """Waits for the placement group, saying every `PLACEMENT_LOG_S` what it waits for; bounded.

    Raises:
        PlacementTimeout: not placed within `PLACEMENT_GROUP_TIMEOUT_S` (the group is removed; the message names the
            layout and what the cluster has).
    """
    ready = group.ready()
    waited = 0
    while not ray.wait([ready], timeout=PLACEMENT_LOG_S)[0]:
        waited += PLACEMENT_LOG_S
        total = ray.cluster_resources().get(resource, 0)
        free = ray.available_resources().get(resource, 0)
        state = f"the cluster has {total:g} {resource} registered, {free:g} free"
        if waited >= PLACEMENT_GROUP_TIMEOUT_S:
            remove_placement_group(group)
            raise PlacementTimeout(f"the run's placement group ({need}) was not placed within {waited} s: {state}")
        logger.info("waiting for the placement group of %d %s bundle(s) (%d s): %s", num_bundles, resource, waited,
                    state)  # fmt: skip


def free_port() -> int:
    """A free TCP port on this host (for torch.distributed rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]
