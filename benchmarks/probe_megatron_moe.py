"""Megatron MoE log-probs against Hugging Face's on one GPU: which Megatron setting parts them.

`python3 benchmarks/probe_megatron_moe.py --preset qwen3-moe-small [--variants default,allgather,router=fp32,fp32]`
(`--device cpu`: the same on CPU, tiny presets)

Packs `--num-samples` GSM8K questions (tokenized with the chat template, each followed by `--response-len` tokens
drawn from the HF fp32 model at temperature 1) into one THD row, as the trainer does, and scores every response token
with megatron-core's `GPTModel` on the local spec (the layer spec a run without Transformer Engine uses) in each
variant. Reported per variant: mean / max |Megatron − HF fp32| of the response log-probs, and the same for HF bf16
(the noise bf16 alone brings). One JSON line (`bench: megatron_moe_gap`).
"""

from __future__ import annotations

import argparse
import json
import os

import _common  # sibling module
import torch

VARIANTS = {
    "default": {},  # alltoall: on CPU megatron-core's dispatcher needs CUDA streams, so it runs as allgather (logged)
    "allgather": {"moe_token_dispatcher_type": "allgather"},
    "router=fp32": {"moe_router_dtype": "fp32"},
    "router=fp64": {"moe_router_dtype": "fp64"},
    "grouped-gemm": {"moe_grouped_gemm": True},  # TE's grouped experts; the local spec runs them one by one (logged)
    "capacity=1": {"moe_expert_capacity_factor": 1.0},  # token dropping: the engine drops none
    "fp32": {"fp32": True, "bf16": False},
}


def _samples(model_dir, hf32, num: int, response_len: int, device: str) -> list[torch.Tensor]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in _common.GSM8K.read_text().splitlines() if line.strip()][:num]
    out = []
    gen = torch.Generator(device=device).manual_seed(0)
    for r in rows:
        text = tok.apply_chat_template([{"role": "user", "content": r["question"]}], add_generation_prompt=True,
                                       tokenize=False)  # fmt: skip
        ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], device=device)
        with torch.no_grad():
            for _ in range(response_len):
                probs = torch.softmax(hf32(ids[None]).logits[0, -1].float(), -1)
                ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)])
        out.append(ids)
    return out


def _hf_log_probs(model, samples, response_len: int) -> torch.Tensor:
    lps = []
    with torch.no_grad():
        for ids in samples:
            lp = torch.log_softmax(model(ids[None]).logits[0].double(), -1)
            lps.append(lp[-response_len - 1 : -1].gather(1, ids[-response_len:, None])[:, 0])
    return torch.cat(lps)


def _megatron_log_probs(model_dir, overrides: dict, samples, response_len: int, device: str) -> torch.Tensor:
    from megatron.core.packed_seq_params import PackedSeqParams

    from slime_convert import ModelArgs
    from slime_train_megatron.logprobs import vocab_parallel_log_probs
    from slime_train_megatron.model import build_gpt_model, build_transformer_config, load_hf_weights
    from slime_train_megatron.packing import pack_thd
    from slime_train_megatron.settings import MegatronSettings

    model_args = ModelArgs.from_hf_dir(model_dir)
    settings = MegatronSettings(**{"bf16": True, "transformer_impl": "local", **overrides})
    config = build_transformer_config(model_args, settings, cpu=device == "cpu")
    model = build_gpt_model(model_args, settings, config).to(device).eval()
    load_hf_weights(model, str(model_dir), model_args, settings)
    packed = pack_thd([s.cpu() for s in samples], [response_len] * len(samples))
    cu, longest = packed.cu_seqlens.to(device).int(), packed.max_seqlen
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu,
                             cu_seqlens_kv_padded=cu, max_seqlen_q=longest, max_seqlen_kv=longest)  # fmt: skip
    with torch.no_grad():
        logits = model(packed.tokens.to(device), packed.position_ids.to(device), attention_mask=None,
                       packed_seq_params=params)[0]  # fmt: skip
        if logits.dim() == 3:
            logits = logits[0]
        lp, _ = vocab_parallel_log_probs(
            logits[packed.logit_index.to(device)].float(), packed.targets.to(device), temperature=1.0,
            vocab_size=model_args.vocab_size,
        )  # fmt: skip
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return lp.double()


def _world(device: str) -> None:
    """torch.distributed (world 1) and megatron-core's parallel state; on CPU the shims the CPU tests use."""
    import contextlib

    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    if device == "cuda":
        model_parallel_cuda_manual_seed(0)
    else:  # RoPE asks torch.cuda for its device; attention dropout forks the CUDA RNG
        torch.cuda.current_device = lambda: "cpu"
        get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3-moe-small")
    p.add_argument("--model-root", default=os.environ.get("SLIME_BENCH_MODELS", "/tmp/slime-bench-models"))
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"any of {sorted(VARIANTS)}")
    p.add_argument("--num-samples", type=int, default=4)
    p.add_argument("--response-len", type=int, default=64)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = p.parse_args()
    _common.setup_logging()
    from transformers import AutoModelForCausalLM

    _world(a.device)
    model_dir, _ = _common.ensure_model(a.preset, a.model_root)
    hf32 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(a.device).eval()
    samples = _samples(model_dir, hf32, a.num_samples, a.response_len, a.device)
    ref = _hf_log_probs(hf32, samples, a.response_len)
    del hf32
    hf16 = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(a.device).eval()
    gaps = {"hf_bf16": _hf_log_probs(hf16, samples, a.response_len)}
    del hf16
    for name in a.variants.split(","):
        try:
            gaps[f"megatron:{name}"] = _megatron_log_probs(model_dir, VARIANTS[name], samples, a.response_len, a.device)
        except Exception as e:  # one variant's failure is a result too
            _common.logger.exception("variant %s", name)
            gaps[f"megatron:{name}"] = repr(e)[:300]
    result = {"preset": a.preset, "device": a.device, "num_samples": a.num_samples, "response_len": a.response_len,
              "hf_fp32_mean_logp": round(float(ref.mean()), 4)}  # fmt: skip
    for name, lp in gaps.items():
        if isinstance(lp, str):
            result[name] = {"error": lp}
            continue
        d = (lp.cpu() - ref.cpu()).abs()
        result[name] = {"mean": round(float(d.mean()), 5), "max": round(float(d.max()), 4)}
    _common.emit("megatron_moe_gap", result)


if __name__ == "__main__":
    main()
