"""Rollout-manager scale: many requests in flight against instant fake engines; added latency and memory.

`python3 benchmarks/bench_rollout_scale.py [--num-prompts 10000] [--n 8] [--engines 2] [--concurrency 512]`

Fake engines (one process each, aiohttp) answer `/generate` at once with 8 tokens and their log-probs, so
what is measured is slime's own cost per request: `generate_rollout` over `--num-prompts` groups of `--n`
samples (prompt ids given, no tokenizer; a constant reward), `--sglang-server-concurrency` = `--concurrency`
requests in flight per engine. Prints one JSON line: wall seconds, requests/s, the added latency of one request
as the rollout sees it (from handing it to the client to the parsed reply: p50/p99 ms; the engine itself takes
~0), and the peak RSS of this process (MB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import socket
import statistics
import time

REPLY = {
    "text": "x" * 8,
    "output_ids": list(range(8)),
    "meta_info": {
        "finish_reason": {"type": "length", "length": 8},
        "weight_version": "0",
        "output_token_logprobs": [[-0.5, t, None] for t in range(8)],
    },
}


def _serve(port: int) -> None:
    from aiohttp import web

    body = json.dumps(REPLY).encode()

    async def generate(request):
        await request.read()
        return web.Response(body=body, content_type="application/json")

    async def loads(request):
        return web.json_response({"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})

    async def ok(request):
        return web.Response()

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/v1/loads", loads)
    app.router.add_route("*", "/{tail:.*}", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=4096)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Source:
    """Groups of `n` samples with 16 prompt ids each (no tokenizer involved)."""

    def __init__(self, n: int):
        self.n, self.next = n, 0

    def get_samples(self, num_groups: int):
        from slime_core.sample import Sample

        groups = []
        for _ in range(num_groups):
            p = self.next
            self.next += 1
            groups.append(
                [Sample(tokens=[p % 1000] * 16, group_index=p, index=p * self.n + j, label="A") for j in range(self.n)]
            )
        return groups

    def add_samples(self, groups) -> None:
        pass


async def constant_reward(args, sample) -> float:
    """The benchmark's reward: 1.0."""
    return 1.0


def main() -> None:
    """Runs the benchmark and prints its JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-prompts", type=int, default=10000)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=512)
    a = p.parse_args()

    ports = [_free_port() for _ in range(a.engines)]
    servers = [multiprocessing.Process(target=_serve, args=(port,), daemon=True) for port in ports]
    for s in servers:
        s.start()
    time.sleep(2.0)
    try:
        print(json.dumps(run(a, [f"http://127.0.0.1:{port}" for port in ports])), flush=True)
    finally:
        for s in servers:
            s.terminate()


def run(a: argparse.Namespace, urls: list[str]) -> dict:
    """One rollout of `a.num_prompts` × `a.n` requests over `urls`; the figures of the JSON line."""
    from slime_core.config import PluginArgs, SlimeArgs
    from slime_rollout.engines.client import get_client
    from slime_rollout.generation import generate as generate_module
    from slime_rollout.generation.rollout import generate_rollout

    cfg = SlimeArgs.from_dict({
        "rollout_batch_size": a.num_prompts, "n_samples_per_prompt": a.n, "num_rollout": 1,
        "rollout_max_response_len": 8, "sglang_server_concurrency": a.concurrency,
        "custom_rm_path": f"{__name__}.constant_reward",
    })  # fmt: skip
    args = PluginArgs.from_config(cfg, engine_urls=urls)
    client = get_client(args)
    latencies: list[float] = []

    class Timed:
        """The real client, each `/generate` timed from hand-over to reply."""

        async def generate(self, payload):
            t0 = time.perf_counter()
            reply = await client.generate(payload)
            latencies.append(time.perf_counter() - t0)
            return reply

        def __getattr__(self, name):
            return getattr(client, name)

    generate_module.get_client = lambda _args: Timed()
    t0 = time.perf_counter()
    out = generate_rollout(args, 0, _Source(a.n))
    wall = time.perf_counter() - t0
    from slime_rollout.runtime import async_utils

    async_utils.run(client.aclose())  # the connections live on the rollout loop
    num = sum(len(g) for g in out.samples)
    assert num == a.num_prompts * a.n, num
    latencies.sort()
    return {
        "bench": "rollout_scale",
        "requests": num,
        "engines": len(urls),
        "concurrency_per_engine": a.concurrency,
        "wall_s": round(wall, 2),
        "requests_per_s": round(num / wall, 1),
        "added_latency_p50_ms": round(1000 * statistics.median(latencies), 1),
        "added_latency_p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
