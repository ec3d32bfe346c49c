"""Placement rules of `SlimeArgs`: offloading, colocation and how many GPUs the engines get (`derive_and_validate`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError, warn_once
from slime_core.extensions import engine_spec, train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["check_placement", "colocated_gpu_split", "gpu_engine"]


def check_placement(args: SlimeArgs) -> None:
    """Derives offload and `--rollout-num-gpus` defaults and checks where trainer and engines go.

    Raises:
        ConfigError: offload without `--colocate`, engines wider than a node, a backend that cannot colocate,
            `--async` with offloading, too few colocated rollout GPUs, or GPUs that do not split into whole engines.
    """
    implied = args.colocate or args.offload
    if args.offload_train is None:
        args.offload_train = implied
    if args.offload_rollout is None:
        args.offload_rollout = implied
    if args.offload_train and not args.colocate:
        raise ConfigError(
            "--offload-train (or --offload) without --colocate is not implemented: the trainer frees accelerator "
            "memory only when it shares GPUs with the engines; drop it or add --colocate"
        )
    if args.offload_rollout and not args.colocate:  # the loop releases engine memory only on shared GPUs
        raise ConfigError(
            "--offload-rollout without --colocate is not implemented: the engines release accelerator memory only "
            "when they share GPUs with the trainer; drop it or add --colocate"
        )
    if args.rollout_num_gpus_per_engine > args.num_gpus_per_node:
        raise ConfigError(
            f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine} exceeds --num-gpus-per-node "
            f"{args.num_gpus_per_node}: engines spanning several nodes are not implemented; use at most "
            f"{args.num_gpus_per_node} GPUs per engine (more engines serve more GPUs)"
        )
    if args.colocate and not train_backend_spec(args).supports_colocate:
        raise ConfigError(f"--colocate: --train-backend {args.train_backend} cannot offload its state; drop it")
    actor_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node
    if args.async_train and args.colocate and (args.offload_train or args.offload_rollout):
        raise ConfigError(
            "--async overlaps rollout and training, which cannot swap one GPU's memory between them: drop --colocate, "
            "or keep both resident on the shared GPUs with --no-offload-train --no-offload-rollout"
        )
    resident = args.colocate and not args.offload_rollout and not args.rollout_external_engine_addrs
    if resident and args.rollout_engine == "sglang" and "mem_fraction_static" not in args.sglang_args:
        # SGLang sizes its pool from the GPU's total memory; with nothing released, the trainer gets the rest.
        warn_once(
            "colocate_resident_mem_fraction",
            "--colocate --no-offload-rollout: the engines keep their memory while the trainer trains on the same "
            "GPUs, and SGLang's default --mem-fraction-static takes most of each GPU; give "
            "--sglang-mem-fraction-static so that the trainer fits next to them",
        )
    if args.colocate and args.rollout_num_gpus is None:
        args.rollout_num_gpus = actor_gpus
    if args.rollout_num_gpus is None and _engines_need_own_gpus(args):
        # Else the placement reserved no GPU for the engine, which then started on GPU 0 next to trainer rank 0
        # (--dry-run reported one engine on GPUs of its own); the original stopped on None in its placement.
        args.rollout_num_gpus = args.rollout_num_gpus_per_engine
    if args.colocate and args.rollout_num_gpus is not None and 0 < args.rollout_num_gpus < actor_gpus:
        raise ConfigError(
            f"--rollout-num-gpus {args.rollout_num_gpus} is smaller than the {actor_gpus} actor GPUs; "
            "with --colocate it must be 0 or at least --actor-num-nodes * --actor-num-gpus-per-node"
        )
    _engine_gpus(args)


def _engines_need_own_gpus(args: SlimeArgs) -> bool:
    """Whether the run starts GPU engines (`RolloutEngineSpec.needs_gpu`) that share no GPU with the trainer.

    A CPU engine (the reference one) needs no bundle; an engine whose package is not installed here starts nowhere.
    """
    if args.colocate or args.rollout_engine_urls or args.debug_train_only:
        return False
    return gpu_engine(args)


def gpu_engine(args: SlimeArgs) -> bool:
    """Whether `--rollout-engine`'s record needs a GPU; False when its package is not installed here."""
    try:
        return engine_spec(args).needs_gpu
    except (ImportError, KeyError):  # a trainer-only environment: nothing here starts engines
        return False


def colocated_gpu_split(args: SlimeArgs) -> tuple[int, int]:
    """With `--colocate`: (rollout GPUs shared with the trainer, rollout-only GPUs); (0, rollout GPUs) without.

    The placement (`slime_app.cluster.create_placement`) makes `max(actor GPUs, rollout GPUs)` bundles; engines take
    bundles `0..rollout-1` and the trainer `0..actor-1`, so `min(actor, rollout)` GPUs are shared and the rest of the
    rollout GPUs serve engines alone.
    """
    rollout = args.rollout_num_gpus or 0
    if not args.colocate:
        return 0, rollout
    shared = min(args.actor_num_nodes * args.actor_num_gpus_per_node, rollout)
    return shared, rollout - shared


def _engine_gpus(args: SlimeArgs) -> None:
    """The rollout GPUs split into whole engines (the CPU reference engine ignores the split; a GPU run cannot)."""
    rollout, per_engine = args.rollout_num_gpus, args.rollout_num_gpus_per_engine
    if rollout == 0 and not (args.rollout_engine_urls or args.debug_train_only):
        # The launcher starts at least one engine: 0 was accepted and one engine started anyway (on no GPU of its
        # own). The original's router-only mode, where engines register themselves with the router, is not here.
        raise ConfigError(
            "--rollout-num-gpus 0 starts no engine, and registering outside engines with the router is not "
            "implemented: give their addresses with --rollout-engine-urls (--rollout-external-engine-addrs), or "
            "give the engines GPUs"
        )
    if not rollout or args.rollout_engine_urls or args.debug_train_only or rollout % per_engine == 0:
        return
    source = ""
    if args.colocate:
        shared, own = colocated_gpu_split(args)
        source = f" (with --colocate: {shared} shared with the trainer" + (f", {own} rollout-only)" if own else ")")
    if rollout < per_engine:
        what = f"one engine needs {per_engine} GPUs and only {rollout} are given"
    else:
        what = f"{rollout // per_engine} engine(s) of {per_engine} GPUs would leave {rollout % per_engine} GPU(s) idle"
    raise ConfigError(
        f"--rollout-num-gpus {rollout}{source} is not a multiple of --rollout-num-gpus-per-engine {per_engine}: {what}"
    )
