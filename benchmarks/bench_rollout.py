"""Rollout-loop overhead: slime's generate_rollout vs the same requests sent straight to the engine.

`python3 benchmarks/bench_rollout.py --preset qwen3-0.6b --num-prompts 64 --n 8 --max-new-tokens 256
[--concurrency 256] [--repeats 3] [--engine sglang|reference] [--engine-url URL]`

(a) slime: `generate_rollout` over GSM8K prompts (tests/fixtures/gsm8k, Qwen3 chat template), math reward,
    metrics, `--sglang-server-concurrency` = `--concurrency` in-flight requests.
(b) direct: for every sample (a) produced, the same prompt ids and sampling params to `/generate` with
    asyncio + httpx (one AsyncClient, a semaphore of `--concurrency`), `return_logprob` as slime asks,
    `max_new_tokens` = that sample's response length and `ignore_eos`, so (b) generates exactly as many
    tokens as (a) did (random weights rarely emit eos anyway).
Runs alternate a, b, a, b, ... after one warm-up of each (cancels drift), the engine's prefix cache flushed
before each run (b would otherwise find all of a's prompts cached); output tokens/s each, median of
`--repeats`; overhead % = (b − a) / b with the tokens/s medians. Budget on an H200 (engine up, 64×8×256):
≈ 7 rounds × 2–4 s ≈ 30 s; + 60–100 s when it starts its own engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import _common  # sibling module: a script's own directory is first on sys.path
import _engine


def rollout_args(url: str, model_dir: Path, a: argparse.Namespace):
    """The plugin view generate_rollout, the data source, the generate function and the rm receive."""
    from slime_core.config import PluginArgs, SlimeArgs

    cfg = SlimeArgs.from_dict({
        "hf_checkpoint": str(model_dir), "prompt_data": str(a.prompt_data), "input_key": "question",
        "label_key": "answer", "apply_chat_template": True, "rollout_seed": 42, "rollout_batch_size": a.num_prompts,
        "n_samples_per_prompt": a.n, "num_rollout": 1, "rm_type": "math", "rollout_temperature": 1.0,
        "rollout_top_p": 1.0, "rollout_top_k": -1, "rollout_max_response_len": a.max_new_tokens,
        "sglang_server_concurrency": a.concurrency, "rollout_engine": a.engine,
    })  # fmt: skip
    return PluginArgs.from_config(cfg, engine_urls=[url])


def run_slime(args, data_source, rollout_id: int) -> tuple[float, list[tuple[list[int], int]]]:
    """(a): seconds and `(prompt ids, response length)` of every generated sample."""
    from slime_rollout.generation.rollout import generate_rollout

    t0 = time.perf_counter()
    out = generate_rollout(args, rollout_id, data_source)
    seconds = time.perf_counter() - t0
    reqs = [(list(s.tokens[: s.prompt_length]), int(s.response_length)) for g in out.samples for s in g]
    return seconds, reqs


async def run_direct(url: str, reqs: list[tuple[list[int], int]], params: dict, concurrency: int) -> tuple[float, int]:
    """(b): seconds and generated tokens for the same requests sent straight to `/generate`.

    aiohttp, as slime's own client: httpx's connection pool costs seconds at a few hundred concurrent
    requests, which would make the baseline, not slime, look slow.
    """
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=3)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as http:

        async def one(ids: list[int], length: int) -> int:
            payload = {"input_ids": ids, "return_logprob": True,
                       "sampling_params": {**params, "max_new_tokens": length, "ignore_eos": True}}  # fmt: skip
            async with sem, http.post(url + "/generate", json=payload) as r:
                r.raise_for_status()
                body = await r.json()
            return int(body["meta_info"]["completion_tokens"])

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(ids, n) for ids, n in reqs))
        return time.perf_counter() - t0, sum(counts)


def flush_cache(url: str) -> bool:
    """Empties the engine's prefix (radix) cache; False (logged) when the engine refused (requests pending)."""
    import httpx

    r = httpx.post(f"{url}/flush_cache", timeout=60)
    if r.status_code != 200:
        _common.logger.warning("flush_cache: HTTP %d %s", r.status_code, r.text[:200])
    return r.status_code == 200


def main(argv: list[str] | None = None) -> dict:
    """Parses flags, alternates (a) and (b), emits one JSON line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--prompt-data", default=str(_common.GSM8K))
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--engine", default="sglang", choices=["sglang", "reference"])
    p.add_argument("--engine-url", default=None, help="use a running engine serving the same --preset")
    p.add_argument("--mem-fraction", type=float, default=0.3)
    p.add_argument("--log-dir", default=os.environ.get("BENCH_LOG_DIR"))
    a = p.parse_args(argv)
    _common.setup_logging()
    from slime_rollout.data.source import RolloutDataSourceWithBuffer
    from slime_rollout.generation.generate import build_sampling_params

    model_dir, write_s = _common.ensure_model(a.preset, a.model_root)
    with _engine.engine(a.engine, model_dir, url=a.engine_url, log_dir=a.log_dir, mem_fraction=a.mem_fraction,
                        max_bs=a.concurrency) as (url, startup_s):  # fmt: skip
        args = rollout_args(url, model_dir, a)
        data_source = RolloutDataSourceWithBuffer(args)
        params = build_sampling_params(args)
        slime_tps, direct_tps, overheads, mismatches = [], [], [], []
        for r in range(a.repeats + 1):  # round 0 is the warm-up of both paths
            flush_cache(url)  # neither path may reuse the other's prompt KV cache
            t_a, reqs = run_slime(args, data_source, r)
            tokens = sum(n for _, n in reqs)
            flush_cache(url)
            t_b, tokens_b = asyncio.run(run_direct(url, reqs, params, a.concurrency))
            if tokens_b != tokens:  # recorded, not fatal (see tokens_mismatch in the result)
                _common.logger.error("round %d: direct path generated %d tokens, slime %d", r, tokens_b, tokens)
                mismatches.append([r, tokens, tokens_b])
            _common.logger.info("round %d: slime %.2f s, direct %.2f s, %d tokens", r, t_a, t_b, tokens)
            if r > 0:
                slime_tps.append(tokens / t_a)
                direct_tps.append(tokens_b / t_b)
                overheads.append(100.0 * (direct_tps[-1] - slime_tps[-1]) / direct_tps[-1])
        a_med, b_med = _common.median(slime_tps), _common.median(direct_tps)
        return _common.emit("rollout", {
            "engine": a.engine, "preset": a.preset, "num_prompts": a.num_prompts, "n": a.n,
            "max_new_tokens": a.max_new_tokens, "concurrency": a.concurrency, "repeats": a.repeats,
            "tokens_per_round": tokens, "slime_tok_s_median": a_med, "direct_tok_s_median": b_med,
            "slime_tok_s_all": slime_tps, "direct_tok_s_all": direct_tps,
            "overhead_pct": 100.0 * (b_med - a_med) / b_med, "overhead_pct_per_round": overheads,
            "engine_startup_s": startup_s, "tokens_mismatch": mismatches,
            "checkpoint_write_s": write_s,
        })  # fmt: skip


if __name__ == "__main__":
    main()
