"""Where the trainer's log-probs part from the engine's: one rollout, many ways to score it.

`python3 benchmarks/probe_logprob_gap.py --preset qwen3-0.6b [--engine-configs default,fp32_lm_head]
[--variants default,head=fp32,head=fp32out,compile=off,attn=sdpa+compile=off+head=fp32]`

For each engine configuration (`default`; `fp32_lm_head` adds SGLang's `--enable-fp32-lm-head`) the script
starts one engine, samples `--num-prompts × --n` GSM8K responses at temperature 1 with the engine's own
log-probs, and stops it. Then each trainer variant (`FSDPTrainBackend` with the given `--attn-implementation`,
`--log-probs-head`, `--fsdp-compile-layers`; `default` = the backend's GPU defaults) scores every sample, and so
does an fp32 HF model (`hf_fp32`, sdpa, one sequence at a time: the reference both sides approximate).
Reported per (engine config, scorer): mean / p99 / max of |scorer − engine| over response tokens, the mean of
|scorer − hf_fp32|, and the mean |scorer − engine| by response position (0–31, 32–127, 128+). One JSON line
(`bench: logprob_gap`). CPU smoke: `--engine reference --preset qwen3-tiny --device cpu`.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common  # sibling module
import _engine

REPO = Path(__file__).resolve().parents[1]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"
ENGINE_CONFIGS = {"default": {}, "fp32_lm_head": {"enable_fp32_lm_head": True}}
BUCKETS = ((0, 32), (32, 128), (128, 1 << 30))


def _prompts(model_dir: Path, num: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines() if line.strip()][:num]
    texts = [tok.apply_chat_template([{"role": "user", "content": r["question"]}], add_generation_prompt=True,
                                     tokenize=False) for r in rows]  # fmt: skip
    return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _generate(url: str, prompt: list[int], max_new: int, seed: int) -> tuple[list[int], list[float]]:
    body = {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": max_new, "sampling_seed": seed}}  # fmt: skip
    req = urllib.request.Request(f"{url}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=300) as resp:
        out = json.loads(resp.read())
    pairs = out["meta_info"]["output_token_logprobs"]
    return [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]


def sample(a: argparse.Namespace, model_dir: Path, config: str) -> list[dict]:
    """One engine with `config`'s extra flags: `[{"prompt", "response", "engine_lp"}]` for every sample."""
    prompts = _prompts(model_dir, a.num_prompts)
    jobs = [(p, i * a.n + j) for i, p in enumerate(prompts) for j in range(a.n)]
    with _engine.engine(a.engine, model_dir, url=None, log_dir=a.log_dir, mem_fraction=0.3, max_bs=256,
                        extra=ENGINE_CONFIGS[config]) as (url, startup_s):  # fmt: skip
        _common.logger.info("engine %s (%s) up in %.1f s", url, config, startup_s)
        with ThreadPoolExecutor(64) as pool:
            outs = list(pool.map(lambda job: _generate(url, job[0], a.max_new_tokens, job[1]), jobs))
    return [{"prompt": p, "response": r, "engine_lp": lp} for (p, _), (r, lp) in zip(jobs, outs, strict=True) if r]


def _batch(samples: list[dict], tokens_per_mb: int):
    import torch

    from slime_core.batch import RolloutBatch

    tokens = [torch.tensor(s["prompt"] + s["response"]) for s in samples]
    resp = [len(s["response"]) for s in samples]
    micro, cur, used = [], [], 0
    for i, t in enumerate(tokens):
        if cur and used + len(t) > tokens_per_mb:
            micro.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += len(t)
    micro.append(cur)
    n = len(samples)
    return RolloutBatch(tokens=tokens, response_lengths=resp, loss_masks=[torch.ones(r) for r in resp],
                        rewards=[0.0] * n, raw_rewards=[0.0] * n, loss_denominators=[float(r) for r in resp],
                        micro_batches=[micro], sample_indices=list(range(n)), step_sample_counts=[n],
                        step_token_counts=[float(sum(resp))])  # fmt: skip


def _variant_namespace(spec: str) -> argparse.Namespace:
    fields = dict(kv.split("=", 1) for kv in spec.split("+")) if spec != "default" else {}
    unknown = set(fields) - {"head", "attn", "compile"}
    if unknown:
        raise ValueError(f"--variants {spec!r}: unknown keys {sorted(unknown)} (known: head, attn, compile)")
    return argparse.Namespace(attn_implementation=fields.get("attn"), log_probs_head=fields.get("head"),
                              compile_layers=fields.get("compile", "auto"), gradient_checkpointing=False)  # fmt: skip


def score_trainer(model_dir: Path, spec: str, sets: dict[str, list[dict]], tokens_per_mb: int) -> dict:
    """`{config: [per-sample log-prob lists]}` from an FSDPTrainBackend built with `spec`."""
    import bench_train_fsdp
    import torch

    from slime_train_fsdp import FSDPTrainBackend

    torch._dynamo.reset()
    backend = FSDPTrainBackend()
    backend.init(bench_train_fsdp.make_args(model_dir, _variant_namespace(spec)), with_ref=False)
    try:
        return {c: [t.tolist() for t in backend.compute_log_probs(_batch(s, tokens_per_mb))] for c, s in sets.items()}
    finally:
        del backend
        torch.cuda.empty_cache() if torch.cuda.is_available() else None


def score_hf_fp32(model_dir: Path, sets: dict[str, list[dict]], device: str) -> dict:
    """The same log-probs from an fp32 HF model (sdpa), one sequence at a time, temperature 1."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.to(device).eval()
    out = {}
    with torch.no_grad():
        for config, samples in sets.items():
            rows = []
            for s in samples:
                ids = torch.tensor([s["prompt"] + s["response"]], device=device)
                logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                start = len(s["prompt"])
                pos = torch.arange(start - 1, ids.shape[1] - 1, device=device)
                rows.append(logp[pos, ids[0, start:]].tolist())
            out[config] = rows
    del model
    return out


def _stats(got: list[list[float]], ref: list[list[float]]) -> dict:
    import torch

    diffs = [torch.tensor(g) - torch.tensor(r) for g, r in zip(got, ref, strict=True)]
    flat = torch.cat(diffs).abs()
    by_pos = {}
    for lo, hi in BUCKETS:
        part = [d[lo:hi].abs() for d in diffs if d.numel() > lo]
        by_pos[f"{lo}-{hi if hi < 1 << 30 else 'end'}"] = float(torch.cat(part).mean()) if part else None
    return {"mean": float(flat.mean()), "p99": float(flat.quantile(0.99)) if flat.numel() < 1 << 24 else None,
            "max": float(flat.max()), "by_position": by_pos}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--engine", default="sglang", choices=["sglang", "reference"])
    p.add_argument("--engine-configs", default="default,fp32_lm_head", help=f"any of {sorted(ENGINE_CONFIGS)}")
    p.add_argument("--variants", default="default,head=fp32,head=fp32out,compile=off,attn=sdpa+compile=off+head=fp32",
                   help="trainer variants: default or '+'-joined head=/attn=/compile= settings")  # fmt: skip
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--tokens-per-mb", type=int, default=8192)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--log-dir", default=os.environ.get("BENCH_LOG_DIR"))
    a = p.parse_args(argv)
    _common.setup_logging()
    import torch.distributed as dist

    if a.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    model_dir, _ = _common.ensure_model(a.preset, a.model_root)
    configs = a.engine_configs.split(",")
    sets = {c: sample(a, model_dir, c) for c in configs}
    scores = {"hf_fp32": score_hf_fp32(model_dir, sets, a.device)}
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    try:
        for spec in a.variants.split(","):
            scores[spec] = score_trainer(model_dir, spec, sets, a.tokens_per_mb)
    finally:
        dist.destroy_process_group()
    result: dict = {
        "preset": a.preset,
        "engine": a.engine,
        "num_samples": {c: len(s) for c, s in sets.items()},
        "response_tokens": {c: sum(len(x["response"]) for x in s) for c, s in sets.items()},
        "gap": {},
    }
    for c in configs:
        engine_lp = [s["engine_lp"] for s in sets[c]]
        rows = {"engine_vs_hf_fp32": _stats(engine_lp, scores["hf_fp32"][c])["mean"]}
        for name, by_config in scores.items():
            st = _stats(by_config[c], engine_lp)
            st["vs_hf_fp32"] = _stats(by_config[c], scores["hf_fp32"][c])["mean"]
            rows[name] = st
        result["gap"][c] = rows
    return _common.emit("logprob_gap", result)


if __name__ == "__main__":
    main()
