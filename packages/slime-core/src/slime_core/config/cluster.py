"""Config groups for placement (GPUs, colocation, offload), the rollout engines and weight sync."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from slime_core.config.base import ArgsGroup, ConfigError, arg, check_registered, parse_json_dict
from slime_core.config.sglang_flags import sglang_field

__all__ = ["ClusterArgs", "EngineArgs", "WeightSyncArgs"]


class ClusterArgs(ArgsGroup):
    """Where the trainer and the engines run."""

    train_backend: str = arg(
        "megatron",
        "Training backend: megatron (megatron-core, GPU), fsdp (PyTorch FSDP2, CPU or GPU) or an installed one.",
        registry="slime.train_backends",
    )
    actor_num_nodes: int = arg(1, "Number of nodes for the actor (trainer).", ge=1)
    actor_num_gpus_per_node: int = arg(8, "Number of GPUs per node for the actor (trainer).", ge=1)
    critic_num_nodes: int | None = arg(
        None,
        "Nodes of the PPO critic's own GPUs (with --critic-num-gpus-per-node; the same count as the actor's). "
        "Unset: the critic shares the actor's GPUs, the two offloaded in turn.",
        ge=1,
    )
    critic_num_gpus_per_node: int | None = arg(
        None, "GPUs per node of the PPO critic's own GPUs (default: --actor-num-gpus-per-node).", ge=1
    )
    rollout_num_gpus: int | None = arg(
        None,
        "Number of GPUs for rollout engines; with --colocate defaults to the actor GPU count "
        "(a larger value adds rollout-only GPUs), without it a GPU engine (SGLang) gets one engine's GPUs of its own "
        "(--rollout-num-gpus-per-engine); 0 (no engine started) only with --rollout-engine-urls or "
        "--debug-train-only.",
        ge=0,
    )
    rollout_num_gpus_per_engine: int = arg(1, "GPUs per rollout engine (the engine's TP size).", ge=1)
    num_gpus_per_node: int = arg(
        8, "GPUs per node of the cluster; an engine (--rollout-num-gpus-per-engine) must fit on one node.", ge=1
    )
    colocate: bool = arg(
        False,
        "Trainer and engines share the same GPUs (implies --offload-train and --offload-rollout unless turned off: "
        "--no-offload-train keeps the trainer resident while the engines generate, which saves its host swap "
        "when both fit; size --sglang-mem-fraction-static for it).",
    )
    offload: bool = arg(False, "Shorthand for --offload-train and --offload-rollout.")
    offload_train: bool | None = arg(
        None, "Free trainer accelerator memory while rolling out (default: on with --colocate; needs --colocate)."
    )
    offload_train_pin_memory: bool = arg(
        False,
        "Swap the trainer's state through page-locked host buffers kept across steps (holds host memory the size "
        "of the trainer's offloaded state; the first sleep pins it). Off by default: FSDP then copies through "
        "pageable memory (on the H200 machine pinned measured no faster, benchmarks/RESULTS.md); Megatron pins "
        "its buffers at each sleep and frees them at each wake-up.",
    )
    offload_rollout: bool | None = arg(
        None, "Free engine accelerator memory while training (default: on with --colocate; needs --colocate)."
    )
    distributed_backend: str = arg("nccl", "torch.distributed backend of the trainer (nccl on GPU, gloo on CPU).")
    distributed_timeout_minutes: int = arg(10, "Timeout of torch.distributed collectives in minutes.", ge=1)
    actor_stopped_timeout_secs: float = arg(
        120.0,
        "Seconds a trainer rank or the rollout manager may stay stopped (SIGSTOP, a debugger, job control) while the "
        "driver waits on it; past them the run ends naming the process, its pid and host (a stopped process keeps "
        "its connections, so Ray never reports it). 0: wait for ever. A process continued before then goes on.",
        ge=0,
    )
    train_env_vars: dict[str, str] = arg(
        {}, "Extra environment variables for trainer processes, as a JSON object string."
    )
    async_train: bool = arg(
        False,
        "Overlap the next rollout with training (one-step off-policy; the original train_async.py).",
        aliases=("--async",),
    )
    ray_address: str | None = arg(None, "Address of an existing Ray cluster; a local one is started when unset.")
    ray_startup_retry_wait: float = arg(
        120.0,
        "When the local Ray node times out during start-up (a busy machine: Ray 2.60 gives its agents a fixed 15 s), "
        "the one retry waits at most this many seconds for the 1-minute load average to fall to the core count.",
        ge=0,
    )

    @field_validator("train_backend")
    @classmethod
    def _registered_backend(cls, value: str) -> str:
        return check_registered(value, group="slime.train_backends", flag="--train-backend")

    @field_validator("train_env_vars", mode="before")
    @classmethod
    def _parse_env_vars(cls, value: Any) -> Any:
        return parse_json_dict(value, flag="--train-env-vars")


class EngineArgs(ArgsGroup):
    """Rollout engines, router and engine health checks."""

    rollout_engine: str | None = arg(
        None,
        "Inference engine: sglang (GPU), reference (CPU transformers server speaking the same HTTP "
        "API) or an installed one. Default: sglang when CUDA is available, else reference.",
        registry="slime.rollout_engines",
    )

    @field_validator("rollout_engine")
    @classmethod
    def _registered_engine(cls, value: str | None) -> str | None:
        if value is None:  # resolved by validation from the hardware
            return None
        return check_registered(value, group="slime.rollout_engines", flag="--rollout-engine")

    engine_python: str | None = arg(
        None, "Python executable that runs the SGLang servers (default: $SLIME_SGLANG_PYTHON, else this interpreter)."
    )
    rollout_engine_urls: list[str] | None = arg(
        None, "URLs of already-running engines to use instead of starting new ones (http://host:port ...)."
    )
    rollout_external_engine_addrs: list[str] | None = arg(
        None, "Addresses host:port of external SGLang engines (original flag; sets --rollout-engine-urls)."
    )
    sglang_server_concurrency: int = arg(512, "Maximum concurrent requests per engine.", ge=1)
    sglang_router_ip: str | None = arg(None, "IP of an existing router; a router is started when unset.")
    sglang_router_port: int | None = arg(None, "Port of an existing router (or of the router to start).")
    sglang_router_request_timeout_secs: int = arg(
        14400,
        "Deadline in seconds of one engine (or router) request; past it the rollout fails naming the engine. A "
        "request still running after --slow-call-warning-secs is logged, and without --use-fault-tolerance its "
        "engine is probed (/health_generate, --rollout-health-check-timeout): a frozen engine fails the run at once.",
        ge=1,
    )
    sglang_config: str | None = arg(None, "YAML file describing models and server groups (advanced engines).")
    prefill_num_servers: int | None = arg(None, "Number of prefill servers for simple PD disaggregation.", ge=1)
    use_fault_tolerance: bool = arg(
        False,
        "Monitor engine health; a dead or hung engine is restarted and gets the current weights, and its "
        "in-flight requests go to the healthy engines.",
    )
    rollout_health_check_interval: float = arg(30.0, "Seconds between engine health checks.", gt=0)
    rollout_health_check_timeout: float = arg(
        30.0,
        "Timeout of one engine health check in seconds; also of each engine call SGLang answers at once (the "
        "rollout's closing abort, a weight push's flush, version fence and continue).",
        gt=0,
    )
    rollout_health_check_first_wait: float = arg(0.0, "Seconds to wait before the first health check.", ge=0)
    rollout_engine_startup_timeout: float = arg(
        1800.0,
        "Seconds a launched engine may take to answer /health_generate (loading the checkpoint, compiling kernels), "
        "at start and after a restart; then the run stops naming the engine and its log tail.",
        gt=0,
    )
    rollout_engine_recovery_timeout: float = arg(
        600.0,
        "With --use-fault-tolerance: seconds a request waits for a healthy engine when none serves (engines "
        "restarting); then the rollout fails.",
        gt=0,
    )
    http_proxy: str | None = arg(None, "HTTP proxy for engine requests.")
    use_distributed_post: bool = arg(False, "Spread engine POST requests over Ray actors.")
    sglang_args: dict[str, str | bool | list[str]] = arg(
        {},
        "Pass-through SGLang ServerArgs collected from --sglang-<field> [value] flags (key: field name with "
        "underscores; True for a flag given without value).",
        cli=False,
    )
    router_args: dict[str, str | bool | list[str]] = arg(
        {}, "Pass-through router args collected from --router-<field> [value] flags.", cli=False
    )

    @field_validator("router_args", mode="before")
    @classmethod
    def _router_cli_values(cls, value: Any) -> Any:
        return _as_cli_values(value, "router")

    @field_validator("sglang_args", mode="before")
    @classmethod
    def _sglang_field_keys(cls, value: Any) -> Any:
        # One spelling for every reader (validation, preflight sizing, engine placement): a config file's
        # `sglang_args: {sglang-dp-size: 2}` was otherwise missed by `sglang_args.get("dp_size")`.
        if not isinstance(value, dict):
            return value
        fields: dict[str, Any] = {}
        given: dict[str, str] = {}
        for key, item in _as_cli_values(value, "sglang").items():
            field = sglang_field(str(key))
            if field in fields and fields[field] != item:
                raise ConfigError(
                    f"--sglang-{field.replace('_', '-')}: given twice with different values, as {given[field]!r} "
                    f"({fields[field]!r}) and {key!r} ({item!r})"
                )
            fields[field] = item
            given[field] = str(key)
        return fields


def _cli_value(item: Any, where: str) -> str | bool | list[str]:
    """A pass-through flag's value as the command line gives it.

    Numbers become their text (`2` -> "2", `0.85` -> "0.85"), switches stay bools, several values become a list of
    texts.

    Raises:
        ConfigError: any other type (a mapping, None), in one line naming the flag.
    """
    if isinstance(item, bool | str):
        return item
    if isinstance(item, int | float):
        return str(item)
    values_ok = isinstance(item, list | tuple) and not any(isinstance(v, bool) for v in item)
    if values_ok and all(isinstance(v, str | int | float) for v in item):
        return [str(v) for v in item]
    raise ConfigError(
        f"{where}: {type(item).__name__} {item!r} is not a flag value; give a number, a string, true/false (a switch) "
        "or a list of numbers/strings (several values), as on the command line"
    )


def _as_cli_values(value: Any, prefix: str) -> Any:
    """A `--config` file's pass-through flags (`sglang_args` / `router_args`) with CLI-typed values (`_cli_value`).

    `dp-size: 2` in YAML is an int, where `--sglang-dp-size 2` is the text "2": a config file's was refused in a
    three-part pydantic error. The engine launcher renders both the same (`--dp-size 2`), and SGLang's own parser
    checks the type.
    """
    if not isinstance(value, dict):
        return value
    flag = lambda key: f"--{prefix}-" + str(key).replace("_", "-").removeprefix(f"{prefix}-")  # noqa: E731
    return {key: _cli_value(item, flag(key)) for key, item in value.items()}


class WeightSyncArgs(ArgsGroup):
    """How new weights reach the engines."""

    weight_sync: str = arg(
        "auto",
        "Weight sync method: tensor (shared tensors / CUDA IPC), distributed (NCCL broadcast), disk (HF "
        "checkpoint reload), lora (adapter files reloaded with /load_lora_adapter; the one method with --lora-rank), "
        "or an installed one. "
        "auto: lora with --lora-rank, tensor when colocated, else distributed on GPU with SGLang, disk otherwise.",
        registry="slime.weight_updaters",
    )

    @field_validator("weight_sync")
    @classmethod
    def _registered_transport(cls, value: str) -> str:
        if value == "auto":  # resolved by validation from the placement and the engine
            return value
        return check_registered(value, group="slime.weight_updaters", flag="--weight-sync")

    update_weight_mode: Literal["full", "delta"] = arg(
        "full",
        "full: every sync pushes every tensor. delta: only the tensors changed since the last push the engines "
        "acknowledged, encoded (--update-weight-delta-encoding) and checksummed (--update-weight-delta-checksum); "
        "the receiver verifies before applying. --weight-sync tensor (reference engine) or disk (any engine). The "
        "first push, and any after a failure, restart or resume, goes in full. Costs one copy of the model in the "
        "engine's dtype in trainer rank 0's CPU memory (and, over tensor with engines that release memory, a host "
        "copy in each engine: --enable-weights-cpu-backup).",
    )
    update_weight_delta_encoding: Literal["xor", "overwrite"] = arg(
        "xor",
        "Delta encoding (byte-level, zstd-compressed): xor (new ^ old; smallest, applies exactly once on the right "
        "base) or overwrite (changed byte positions + new values; larger, idempotent).",
    )
    update_weight_delta_checksum: Literal["xxh3-128", "blake3", "adler32"] = arg(
        "xxh3-128",
        "Per-tensor checksum of each delta-pushed tensor's new bytes, verified by the receiver before applying: "
        "xxh3-128, blake3 (needs the blake3 package) or adler32.",
    )
    update_weight_local_checkpoint_dir: str | None = arg(
        None,
        "Delta sync over disk: the full HF checkpoint the deltas are applied into (in place, verified) and the "
        "engines reload; must be reachable from trainer rank 0 and the engines (default: "
        "--update-weight-disk-dir/local).",
    )
    update_weight_transport: Literal["nccl", "disk"] | None = arg(
        None, "Original transport flag: nccl or disk (used to resolve --weight-sync auto when given)."
    )
    update_weight_disk_dir: str | None = arg(
        None, "Directory for disk weight sync (default: --output-dir/weight_sync)."
    )
    update_weight_disk_keep_files: bool = arg(False, "Keep the checkpoints written for disk weight sync.")
    update_weight_buffer_size: int = arg(512 * 1024**2, "Bucket size in bytes for weight sync.", ge=1)
    update_weight_timeout: float = arg(
        1800.0,
        "Seconds an engine has to answer each call of a weight push that waits on generation or on loading: "
        "pause_generation (returns once in-flight requests have left) and each weight update (update_weights_* "
        "bucket, load_lora_adapter: queued behind in-flight requests, then loaded); past it the engine fails the "
        "push, naming this flag (the original waits without limit).",
        gt=0,
    )
    update_weights_interval: int = arg(
        1,
        "Push weights to the engines every this many rollouts, with --async (the sync loop pushes after every step, as "
        "the original's train.py).",
        ge=1,
    )
    keep_old_actor: bool = arg(False, "Keep a copy of the previous actor weights as the old policy.")
    check_weight_update_equal: bool = arg(False, "After a sync, check that engine weights equal trainer weights.")
