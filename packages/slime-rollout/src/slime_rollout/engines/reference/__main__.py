"""CPU reference engine: an SGLang-compatible HTTP server backed by transformers.

Run:
    python -m slime_rollout.engines.reference --model-path DIR --port 30000 [--host 127.0.0.1]
        [--dtype float32] [--max-running-requests 64] [--random-seed 42] [--weight-version default]
        [--enable-deterministic-inference]

Flags are named like SGLang's `launch_server`; unknown SGLang flags are rejected with a clear error.
"""

from __future__ import annotations

import argparse
import logging

import torch
import uvicorn

from slime_rollout.engines.reference.model import ReferenceModel
from slime_rollout.engines.reference.server import build_app

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses the engine's command line (SGLang flag names), then resolves the values it serves with.

    As SGLang's `ServerArgs` post-processing, which `/server_info` then reports: `tokenizer_path` defaults to
    `model_path`, and `--enable-deterministic-inference` sets `max_running_requests` to 1 (here a request's
    output is batch-invariant only when it runs alone; see `main`).
    """
    p = argparse.ArgumentParser(prog="python -m slime_rollout.engines.reference", description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True, help="HF model directory")
    p.add_argument("--tokenizer-path", default=None, help="tokenizer directory (default: --model-path)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "auto"])
    p.add_argument("--device", default="cpu", help="torch device (cpu by default)")
    p.add_argument("--max-running-requests", type=int, default=64, help="largest generation batch")
    p.add_argument("--random-seed", type=int, default=42)
    p.add_argument("--weight-version", default="default", help="initial weight_version")
    p.add_argument("--batch-wait-ms", type=float, default=5.0, help="time to collect requests into one batch")
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="as SGLang: the context served, in tokens (default: the model's max_position_embeddings)",
    )
    p.add_argument("--num-threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument(
        "--enable-memory-saver",
        action="store_true",
        help="as SGLang: /release_memory_occupation gives the weights up (see --enable-weights-cpu-backup)",
    )
    p.add_argument(
        "--enable-weights-cpu-backup",
        action="store_true",
        help="as SGLang: the weights survive a release (without it a resume brings them back zeroed)",
    )
    p.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help="as SGLang: requests with return_routed_experts get meta_info.routed_experts (MoE models)",
    )
    p.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="as SGLang: a request's tokens and log-probs do not depend on the requests batched with it (here: "
        "requests run one at a time, much slower)",
    )
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    args.tokenizer_path = args.tokenizer_path or args.model_path
    if args.enable_deterministic_inference and args.max_running_requests != 1:
        logger.info("--enable-deterministic-inference: requests run one at a time (max_running_requests 1, not %d)",
                    args.max_running_requests)  # fmt: skip
        args.max_running_requests = 1
    return args


def main(argv: list[str] | None = None) -> None:
    """Loads the model and serves it until SIGTERM/SIGINT."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.random_seed)
    model = ReferenceModel(
        args.model_path,
        dtype=args.dtype,
        device=args.device,
        tokenizer_path=args.tokenizer_path,
        context_length=args.context_length,
    )
    # Batched rows are left-padded to a common length and share matmuls whose blocking follows the batch's shape, so
    # a row's log-probs change in the last bits with its batch-mates (and, rarely, a sampled token flips). One request
    # at a time gives every request the same shapes whatever else arrived: bit-identical runs, at a batch of one
    # (`parse_args` set max_running_requests to 1 under --enable-deterministic-inference).
    app = build_app(model, max_running_requests=args.max_running_requests, random_seed=args.random_seed,
                    server_args=vars(args))  # fmt: skip
    logger.info("reference engine serving %s on http://%s:%d", args.model_path, args.host, args.port)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=60,  # clients pool connections between rollouts
        backlog=4096,  # a rollout opens hundreds of connections at once
    )


if __name__ == "__main__":
    main()
