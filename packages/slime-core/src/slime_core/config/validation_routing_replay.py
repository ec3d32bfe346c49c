"""Rules of MoE routing replay (`--use-routing-replay`, `--use-rollout-routing-replay`), part of `derive_and_validate`.

As the original (`slime/utils/arguments.py`), `--use-rollout-routing-replay` turns `--use-routing-replay` on. The
backend and the engine say through their capability records whether they can replay / return routes; a dense
`--hf-checkpoint` has no router to replay.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError
from slime_core.extensions import engine_spec, train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["check_routing_replay"]


def check_routing_replay(args: SlimeArgs) -> None:
    """Derives `use_routing_replay` from `--use-rollout-routing-replay` and checks both flags (writable `args`).

    Raises:
        ConfigError: either flag with a backend that cannot replay routes (Megatron), an engine that cannot return
            them (rollout replay), context parallelism (a rank sees a slice of each packed row), `--use-routing-replay`
            alone with `--use-rollout-logprobs` (the old-log-prob forward that records the routes does not run), or
            a dense `--hf-checkpoint` (its config.json names no experts).
    """
    if args.use_rollout_routing_replay:
        args.use_routing_replay = True
    if not args.use_routing_replay:
        return
    flag = "--use-rollout-routing-replay" if args.use_rollout_routing_replay else "--use-routing-replay"
    if not train_backend_spec(args).supports_routing_replay:
        raise ConfigError(
            f"{flag}: --train-backend {args.train_backend} does not replay MoE routes (megatron-core's router has no "
            "replay hook without the original's Megatron patch, and it is not testable on CPU here); use "
            "--train-backend fsdp"
        )
    if args.use_rollout_routing_replay and args.rollout_engine and not engine_spec(args).returns_routed_experts:
        raise ConfigError(
            f"{flag}: --rollout-engine {args.rollout_engine} cannot return the experts it routed to "
            "(meta_info.routed_experts, SGLang's --enable-return-routed-experts)"
        )
    if args.context_parallel_size > 1:
        raise ConfigError(f"{flag} does not support --context-parallel-size {args.context_parallel_size} yet")
    if not args.use_rollout_routing_replay and args.use_rollout_logprobs:
        raise ConfigError(
            "--use-routing-replay records the routes in the trainer's old-log-prob forward, which "
            "--use-rollout-logprobs skips; use --use-rollout-routing-replay to replay the engine's routes"
        )
    config_json = os.path.join(args.hf_checkpoint or "", "config.json")
    if args.hf_checkpoint and os.path.isfile(config_json):
        with open(config_json, encoding="utf-8") as f:
            hf_config = json.load(f)
        from slime_core.routing_replay import moe_shape  # imports torch: not at config import

        if moe_shape(hf_config) is None:
            raise ConfigError(
                f"{flag}: --hf-checkpoint {args.hf_checkpoint} is a dense model (model_type "
                f"{hf_config.get('model_type')!r}, its config.json names no experts): there is no routing to replay"
            )
