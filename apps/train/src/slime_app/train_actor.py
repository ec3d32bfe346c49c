"""Trainer ranks as Ray actors: one process per rank, torch.distributed inside (gloo on CPU, NCCL on GPU).

`TrainGroup` is the driver-side handle: it creates the ranks (rank 0 first, for the rendezvous
address), and fans every call out to all ranks, returning rank 0's answer. A group plays one role: the
actor (the policy, `--train-backend`'s `TrainBackend`) or the PPO critic (its `CriticBackend`, a process group
of its own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import time
from typing import Any

import ray

from slime_app.actor_watch import ActorWatch, Watched, kill_stopped
from slime_app.cluster import Placement
from slime_app.guards import RunStopped
from slime_app.registry import CRITIC_BACKENDS, TRAIN_BACKENDS
from slime_core.checkpoint_dirs import tracker_step
from slime_core.config import SlimeArgs

ROLES = ("actor", "critic")

logger = logging.getLogger(__name__)


def make_backend(cfg: SlimeArgs) -> Any:
    """A new, uninitialized training backend of the kind `--train-backend` names.

    Raises:
        slime_app.registry.UnknownNameError: (a KeyError and a ValueError) no backend of that name.
        ImportError: the backend's package or extra is not installed (e.g. megatron-core).
    """
    return TRAIN_BACKENDS.get(cfg.train_backend).load()()


def make_critic_backend(cfg: SlimeArgs) -> Any:
    """A new, uninitialized PPO critic backend of the kind `--train-backend` names.

    Raises:
        slime_app.registry.UnknownNameError: the backend has no critic.
        ImportError: the backend's package or extra is not installed.
    """
    return CRITIC_BACKENDS.get(cfg.train_backend).load()()


def trainer_runtime_env(cfg: SlimeArgs) -> dict[str, Any] | None:
    """Ray `runtime_env` of the trainer ranks: `--train-env-vars` as environment variables, or None when unset.

    Ray merges these `env_vars` into the job's (`init_ray`), key by key, before the rank's process starts, so
    variables read at import or CUDA/NCCL initialization take effect. `--deterministic-mode` adds the variables
    deterministic cuBLAS, NCCL and Transformer Engine need.
    """
    env = {str(k): str(v) for k, v in (cfg.train_env_vars or {}).items()}
    if cfg.deterministic_mode:
        # What the original's reproducibility recipe sets: cuBLAS workspaces, NCCL's ring algorithm, no
        # non-deterministic Transformer Engine kernels (a --train-env-vars value wins).
        for key, value in _DETERMINISTIC_ENV.items():
            env.setdefault(key, value)
    return {"env_vars": env} if env else None


_DETERMINISTIC_ENV = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_ALGO": "Ring",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
}


@dataclasses.dataclass(frozen=True, slots=True)
class TrainerStart:
    """What a trainer's `init` reports to the driver.

    Example:
        `TrainerStart(rollout_id=3, compile_layers_flag="--fsdp-compile-layers")`: resumed at rollout 3, and the
        first step compiles the decoder layers.

    Attributes:
        rollout_id: the rollout id to start from (`--load`'s next rollout; 0 without a checkpoint).
        compile_layers_flag: the flag under which the backend compiled the decoder layers in `init` (they compile at
            the first forward), None when they run eagerly: the value the backend used
            (`slime_core.protocols.TrainBackend.compile_layers_flag`); a critic group's: the critic's.
        critic_compile_layers_flag: PPO: the critic's `compile_layers_flag` (its first step compiles), as
            `slime_app.actor_critic.ActorCritic.init` reports it beside the actor's; None: eager, or no critic.
    """

    rollout_id: int
    compile_layers_flag: str | None
    critic_compile_layers_flag: str | None = None


class TrainActor:
    """One trainer rank. Methods are called on every rank at once by `TrainGroup`."""

    def __init__(self, world_size: int, rank: int, master_addr: str | None, master_port: int | None):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.world_size, self.rank = world_size, rank
        self.store = None  # rank 0: the rendezvous store, listening from construction on
        if master_addr is None:
            # Rank 0 binds its store's port now (the OS picks it) and keeps it: a port probed free and bound only at
            # `init` could be taken in between (EADDRINUSE seen in CI with two test workers).
            import torch.distributed as dist

            self.store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True, wait_for_workers=False)
            master_addr, master_port = ray.util.get_node_ip_address(), self.store.port
        self.master_addr, self.master_port = master_addr, master_port
        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",
        )
        logger.info("trainer rank %d: pid %d on %s", rank, os.getpid(), ray.util.get_node_ip_address())
        self.cfg: SlimeArgs | None = None  # set by `init`
        self.backend = None
        self.warm_up = None  # the backend's compile warm-up (`start_compile_warm_up`), awaited before the first step
        self.updater = None
        self.sync_checker = None

    def preload(self, cfg: SlimeArgs, role: str = "actor") -> None:
        """Imports the role's backend (torch and its modules) ahead of `init`; this process touches no device.

        Runs while the engines start. A failure is left to `init`, which raises it with the same cause.
        """
        try:
            (CRITIC_BACKENDS if role == "critic" else TRAIN_BACKENDS).get(cfg.train_backend).load()
        except Exception:  # noqa: BLE001 - `init` raises it (an unretrieved Ray error would only log it)
            logger.debug("preload of the %s backend %r failed; init will raise", role, cfg.train_backend)

    def start_compile_warm_up(self, cfg: SlimeArgs, role: str = "actor", gated: bool = False) -> None:
        """Starts the backend's compile warm-up (`train` waits for it before the first step).

        Every backend class has `start_compile_warm_up(cfg, gated)` (`slime_core.protocols.TrainBackend`); FSDP's
        starts one (`slime_train_fsdp.compile_warmup`), Megatron's returns None.
        The driver calls it before `init`, while the engines start; colocated, `gated`: the process prepares on the
        CPU and touches the GPU only after `release_compile_warm_up`, once the engines are up (and released their
        memory), since a warm-up on a GPU an engine is sizing its KV cache on would shrink it. The critic starts
        none. Never raises: a warm-up that cannot start only means the first step compiles by itself.
        """
        if role != "actor":
            return
        try:
            backend = TRAIN_BACKENDS.get(cfg.train_backend).load()
        except Exception:  # noqa: BLE001 - `init` raises it (an unretrieved Ray error would only log it)
            return
        try:
            self.warm_up = backend.start_compile_warm_up(cfg, gated=gated)
        except Exception as exc:  # noqa: BLE001 - an optimization: the first step then compiles by itself
            logger.warning("compile warm-up not started (%s: %s); the first step compiles", type(exc).__name__, exc)

    def release_compile_warm_up(self) -> None:
        """Lets a gated compile warm-up go on to the GPU (nothing without one)."""
        if self.warm_up is not None:
            self.warm_up.release()

    def rendezvous(self) -> tuple[str, int]:
        """Address of rank 0's rendezvous (given to the other ranks)."""
        return self.master_addr, self.master_port

    def init(self, cfg: SlimeArgs, role: str = "actor") -> TrainerStart:
        """Joins the process group, builds the role's backend and loads its checkpoint.

        The critic's backend gets the critic's config (`slime_core.critic.critic_config`).

        Returns:
            The start rollout id, and whether the backend (the actor's or the critic's) compiled its layers
            (`TrainerStart`).
        """
        import torch
        import torch.distributed as dist

        if role not in ROLES:
            raise ValueError(f"unknown trainer role {role!r}; known: {ROLES}")
        self.cfg = cfg
        use_cuda = torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(0)  # Ray exposes exactly this rank's GPU
        timeout = datetime.timedelta(minutes=cfg.distributed_timeout_minutes)
        if self.store is None:
            self.store = dist.TCPStore(self.master_addr, self.master_port, self.world_size, is_master=False,
                                       timeout=timeout)  # fmt: skip
        self.store.set_timeout(timeout)
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            store=self.store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )
        torch.manual_seed(cfg.seed)
        if cfg.deterministic_mode:
            # Deterministic kernels wherever torch has them; an op without one warns (once) instead of failing.
            torch.use_deterministic_algorithms(True, warn_only=True)
        if role == "critic":
            from slime_core.critic import critic_config

            self.backend = make_critic_backend(cfg)
            start = int(self.backend.init(critic_config(cfg)))
        else:
            self.backend = make_backend(cfg)
            start = int(self.backend.init(cfg, with_ref=cfg.with_ref))
        # Optional for a registered backend written before the attribute existed: it then reports no compilation.
        return TrainerStart(rollout_id=start, compile_layers_flag=getattr(self.backend, "compile_layers_flag", None))

    def data_parallel_rank(self) -> int:
        """This rank's data-parallel rank: which of the rollout's per-DP-rank batches it trains on."""
        return int(self.backend.dp_rank)

    def train(self, rollout_id: int, batch: Any, values: Any = None) -> dict[str, float]:
        """Trains on this rank's `RolloutBatch` (resolved from the object store by Ray).

        While a compile warm-up (`start_compile_warm_up`) still compiles, steps run the compiled layers eagerly
        (`perf/compile_warmup_pending` 1); the first step after it ended logs `perf/compile_warmup_finished` (1, or
        0: failed or stopped after `DEFER_S`) and `perf/compile_warmup_wait_time` (s, ~0: it never delays a step).
        On CUDA the metrics gain `perf/train_peak_mem_gib`: the peak of memory allocated by this rank's
        tensors during the step (GiB, `torch.cuda.max_memory_allocated`; the caching allocator's reserve
        and other processes, e.g. a colocated engine, are not included).

        Args:
            rollout_id: id of the rollout.
            batch: this rank's `RolloutBatch`.
            values: PPO: the critic's values of this data-parallel rank's samples (N `[L_i]` tensors), attached
                as `RolloutBatch.values`.
        """
        import dataclasses

        import torch

        if values is not None:
            batch = dataclasses.replace(batch, values=list(values))
        warm_up_metrics: dict[str, float] = {}
        eager = contextlib.nullcontext()
        if self.warm_up is not None:
            if self.warm_up.pending():
                # Its graphs are not in the cache yet: compiling them here too would stall the step (45 s at
                # step 0 measured on one H100), so the compiled layers run eagerly this step.
                eager = self.warm_up.eager()
                warm_up_metrics = {"perf/compile_warmup_pending": 1.0}
            else:
                begun = time.monotonic()
                finished = self.warm_up.wait() is not None  # stops one that passed DEFER_S; the step compiles
                self.warm_up = None
                warm_up_metrics = {"perf/compile_warmup_wait_time": time.monotonic() - begun,
                                   "perf/compile_warmup_finished": float(finished)}  # fmt: skip
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        with eager:
            metrics = self.backend.train(rollout_id, batch)
        metrics = {**metrics, **warm_up_metrics}
        if cuda:
            metrics = {**metrics, "perf/train_peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}
        return metrics

    def train_critic(self, rollout_id: int, batch: Any) -> tuple[dict[str, float], Any]:
        """The critic's step on this rank's batch: `(train/critic-* metrics, values before the update)`."""
        return self.backend.train_critic(rollout_id, batch)

    def save(self, rollout_id: int, commit: bool = True) -> None:
        """Writes a resumable checkpoint; `commit`: also name it in the tracker (else `commit_save` does).

        Only the actor's `TrainBackend.save` takes `commit`; a critic's checkpoint is always committed at once
        (`slime_app.actor_critic.ActorCritic.save`), so its backend is called as `CriticBackend.save(rollout_id)`.
        A registered backend without `commit_save` (written before it existed) commits in `save` as it always did:
        only the run state then lands after its tracker.
        """
        if commit or not hasattr(self.backend, "commit_save"):
            self.backend.save(rollout_id)
        else:
            self.backend.save(rollout_id, commit=False)

    def commit_save(self, rollout_id: int) -> None:
        """Names the checkpoint of `rollout_id` in the tracker: the resume point (`TrainBackend.commit_save`)."""
        if hasattr(self.backend, "commit_save"):
            self.backend.commit_save(rollout_id)

    def save_hf(self, path: str) -> None:
        """Exports Hugging Face safetensors (collective; rank 0 writes)."""
        self.backend.save_hf(path)

    def sleep(self) -> None:
        """Frees accelerator memory for the engines (colocated mode)."""
        self.backend.sleep()

    def wake_up(self) -> None:
        """Restores what `sleep` freed."""
        self.backend.wake_up()

    def connect_engines(self, engine_urls: list[str]) -> None:
        """Builds the weight updater towards the engines (rank 0 sends; all ranks gather)."""
        from slime_app.weights import make_sync_checker, make_weight_updater, release_weight_updater

        release_weight_updater(self.updater)
        self.updater = make_weight_updater(self.cfg, engine_urls, rank=self.rank)
        self.sync_checker = make_sync_checker(self.cfg, engine_urls, rank=self.rank)

    def update_weights(self, weight_version: int, engine_urls: list[str] | None = None) -> dict[str, float]:
        """Pushes the current weights to the engines, tagged with `weight_version`.

        Args:
            weight_version: the version the engines report afterwards.
            engine_urls: the engines to reach (None: those of `connect_engines`); a different set (an engine
                restarted, or left out while it restarts) rebuilds rank 0's updater for it first.
        """
        from slime_app.weights import push_weights

        if engine_urls is not None and self.rank == 0:
            current = sorted(self.updater.client.urls) if self.updater is not None else []
            if sorted(engine_urls) != current:
                self.connect_engines(engine_urls)  # a new engine set: its first push is content-checked again
        return push_weights(
            self.backend, self.updater, self.cfg, weight_version, rank=self.rank, checker=self.sync_checker
        )

    def shutdown(self) -> None:
        """Stops a compile warm-up still running and leaves the process group."""
        import torch.distributed as dist

        if self.warm_up is not None:
            self.warm_up.stop()
            self.warm_up = None
        if dist.is_initialized():
            dist.destroy_process_group()


def pin_load_step(cfg: SlimeArgs) -> SlimeArgs:
    """`cfg` with `--ckpt-step` set to the iteration `--load`'s tracker names now (unchanged without one).

    Each trainer rank read the tracker itself: a run saving into `--load` meanwhile (a fork of a live run) could
    have its ranks load two iterations. Read once on the driver, every actor rank (and a PPO critic paired with it:
    `slime_app.actor_critic.critic_resume_step`) loads the same one. A given `--ckpt-step` is kept.
    """
    if not cfg.load or cfg.ckpt_step is not None:
        return cfg
    step = tracker_step(cfg.load)
    return cfg if step is None else cfg.model_copy(update={"ckpt_step": step})


class TrainGroup:
    """Driver-side handle to all trainer ranks of one role.

    Args:
        cfg: the run config.
        placement: the run's bundles; the actor uses `actor_bundles`, the critic `critic_bundles`.
        role: `actor` or `critic`.
    """

    def __init__(self, cfg: SlimeArgs, placement: Placement, role: str = "actor"):
        if role not in ROLES:
            raise ValueError(f"unknown trainer role {role!r}; known: {ROLES}")
        self.role = role
        bundles = placement.actor_bundles if role == "actor" else placement.critic_bundles
        world_size = len(bundles)
        # A GPU shared with the engines (colocated) or between actor and critic (PPO) holds fractions of it.
        shared = cfg.colocate or cfg.use_critic
        gpu = 0.4 if (placement.use_gpu and shared) else (1 if placement.use_gpu else 0)
        remote_cls = ray.remote(num_gpus=gpu, num_cpus=0)(TrainActor)
        runtime_env = trainer_runtime_env(cfg)
        extra = {"runtime_env": runtime_env} if runtime_env else {}
        self.actors = []
        # Every wait on the ranks ends when one stays stopped (SIGSTOP) past --actor-stopped-timeout-secs.
        self.watch = ActorWatch.of(cfg)
        self.watched: list[Watched] = []
        name = "trainer rank" if role == "actor" else "critic rank"
        master: tuple[str, int] | tuple[None, None] = (None, None)
        for rank in range(world_size):
            actor = remote_cls.options(scheduling_strategy=placement.strategy(bundles[rank]), **extra).remote(
                world_size, rank, *master
            )
            self.actors.append(actor)
            self.watched.append(Watched(f"{name} {rank}", actor))
            if rank == 0:
                master = self.watch.get(actor.rendezvous.remote(), self.watched, "the rendezvous address of rank 0")

    def preload(self, cfg: SlimeArgs) -> None:
        """Starts every rank's `TrainActor.preload` without waiting.

        Ray runs one rank's calls in order, so `init` follows it.
        """
        for actor in self.actors:
            actor.preload.remote(cfg, self.role)

    def start_compile_warm_up(self, cfg: SlimeArgs, gated: bool = False) -> None:
        """Starts every rank's `TrainActor.start_compile_warm_up` without waiting (before `init`, in Ray's order)."""
        for actor in self.actors:
            actor.start_compile_warm_up.remote(cfg, self.role, gated)

    def release_compile_warm_up(self) -> None:
        """Opens every rank's gated warm-up (`TrainActor.release_compile_warm_up`) without waiting, before `init`."""
        for actor in self.actors:
            actor.release_compile_warm_up.remote()

    def _get(self, refs: list[ray.ObjectRef], call: str) -> list[Any]:
        """The ranks' results of one call: raises as soon as one rank fails, or stays stopped (`actor_watch`).

        A plain `ray.get` of a list waits on the first ref; when another rank died, the first is blocked in a
        collective with it until the distributed timeout (minutes), and a stopped rank kept Ray waiting for ever.
        """
        ranks = "trainer ranks" if self.role == "actor" else "critic ranks"
        return self.watch.get(refs, self.watched, f"the {ranks}' {call}")

    def _all(self, method: str, *args: Any) -> list[Any]:
        return self._get([getattr(a, method).remote(*args) for a in self.actors], f"{method} call")

    def init(self, cfg: SlimeArgs) -> TrainerStart:
        """Initializes every rank with the run config; returns rank 0's `TrainerStart` (start id after `--load`).

        The actor's ranks load the iteration `--load`'s tracker names now (`pin_load_step`); the critic's get `cfg`
        as given (`slime_app.actor_critic.ActorCritic.init` pins a paired critic).
        """
        if self.role == "actor":
            cfg = pin_load_step(cfg)
        start = self._all("init", cfg, self.role)[0]
        # Model-parallel ranks (TP/PP/CP) of one data-parallel group train on the same batch.
        self.dp_ranks: list[int] = self._all("data_parallel_rank")
        return start

    def _check_batches(self, batch_refs: list[ray.ObjectRef]) -> None:
        if len(batch_refs) != max(self.dp_ranks) + 1:
            raise ValueError(f"{len(batch_refs)} batches for {max(self.dp_ranks) + 1} data-parallel ranks")

    def train(
        self, rollout_id: int, batch_refs: list[ray.ObjectRef], values: list[Any] | None = None
    ) -> dict[str, float]:
        """Trains each rank on its data-parallel rank's batch; returns rank 0's (already DP-reduced) metrics.

        Args:
            rollout_id: id of the rollout.
            batch_refs: one `RolloutBatch` ref per data-parallel rank.
            values: PPO: the critic's values per data-parallel rank (`train_critic`'s second result).

        Raises:
            ValueError: the rollout has a different number of batches than the trainer has DP ranks.
        """
        self._check_batches(batch_refs)
        calls = [
            a.train.remote(rollout_id, batch_refs[r], None if values is None else values[r])
            for a, r in zip(self.actors, self.dp_ranks, strict=True)
        ]
        return self._get(calls, f"train call of rollout {rollout_id}")[0]

    def train_critic(self, rollout_id: int, batch_refs: list[ray.ObjectRef]) -> tuple[dict[str, float], list[Any]]:
        """The critic's step on every rank; returns rank 0's metrics and the values of each data-parallel rank.

        Raises:
            ValueError: the rollout has a different number of batches than the critic has DP ranks.
        """
        self._check_batches(batch_refs)
        results = self._get(
            [a.train_critic.remote(rollout_id, batch_refs[r]) for a, r in zip(self.actors, self.dp_ranks, strict=True)],
            f"train_critic call of rollout {rollout_id}",
        )
        values: dict[int, Any] = {}
        for (_, rank_values), r in zip(results, self.dp_ranks, strict=True):
            values.setdefault(r, rank_values)  # model-parallel ranks of one DP group hold the same values
        return results[0][0], [values[r] for r in range(len(values))]

    def save(self, rollout_id: int, commit: bool = True) -> None:
        """Checkpoint on every rank; `commit`: also name it in the tracker (else `commit_save` does)."""
        self._all("save", rollout_id, commit)

    def commit_save(self, rollout_id: int) -> None:
        """Names the checkpoint of `rollout_id` in the tracker (rank 0 writes): the point a resume starts from."""
        self._all("commit_save", rollout_id)

    def save_hf(self, path: str) -> None:
        """HF export (collective)."""
        self._all("save_hf", path)

    def sleep(self) -> None:
        """Offload all ranks."""
        self._all("sleep")

    def wake_up(self) -> None:
        """Onload all ranks."""
        self._all("wake_up")

    def connect_engines(self, engine_urls: list[str]) -> None:
        """Set up weight sync towards the engines."""
        self._all("connect_engines", engine_urls)

    def update_weights(self, weight_version: int, engine_urls: list[str] | None = None) -> dict[str, float]:
        """Weight sync (to `engine_urls`, or the connected engines); returns rank 0's timing (and weight-check) metrics.

        Raises:
            slime_app.guards.RunStopped: the weight-content check found other values on an engine.
        """
        from slime_rollout.weight_sync.check import WeightSyncMismatch

        try:
            return self._all("update_weights", weight_version, engine_urls)[0]
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, WeightSyncMismatch):
                raise RunStopped(str(cause)) from None
            raise

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Destroys the process groups (ranks that do not answer within `grace_s` are not waited for), kills the actors.

        After a rank died, the others may be blocked in a collective; they are killed rather than waited on. A
        stopped rank (SIGSTOP) is killed first: it would answer nothing and outlive Ray's teardown.
        """
        kill_stopped(self.watched)
        try:
            refs = [a.shutdown.remote() for a in self.actors]
            ray.wait(refs, num_returns=len(refs), timeout=grace_s)
        finally:
            for actor in self.actors:
                ray.kill(actor)
