"""Run by test_true_on_policy_kernels.py in a subprocess with TRITON_INTERPRET=1 and the stub SGLang tree first on
sys.path: SGLang's triton attention kernels executed on CPU by Triton's interpreter. Prints one JSON line."""

import json

import torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified

from slime_train_fsdp.true_on_policy.attention import MirroredAttention, plan_attention, sdpa_packed
from slime_train_fsdp.true_on_policy.kernels import SGLangKernels

CPU = torch.device("cpu")
torch.manual_seed(0)
kernels = SGLangKernels(
    extend_unified=extend_attention_fwd_unified, decode=decode_attention_fwd, split_tile_size=8, rotary=None
)
lengths, prompts = [13, 5, 20], [6, 5, 3]
t = sum(lengths)
q, k, v = torch.randn(t, 4, 16), torch.randn(t, 2, 16), torch.randn(t, 2, 16)
plan = plan_attention(lengths, prompts, CPU, split_tile_size=8)
out = MirroredAttention.apply(q, k, v, plan, 0.25, kernels)
alone = MirroredAttention.apply(q[-20:], k[-20:], v[-20:], plan_attention([20], [3], CPU, 8), 0.25, kernels)

# SGLang's radix cache: the same prompt extended with 7 tokens already cached gives the same rows.
n, cached = 20, 7
qs, ks, vs = q[-n:].contiguous(), k[-n:].contiguous(), v[-n:].contiguous()
i32 = torch.int32
full, tail = torch.empty_like(qs), torch.empty_like(qs[cached:])
extend_attention_fwd_unified(qs, full, ks, vs, 1.0, 1.0, torch.tensor([0, n], dtype=i32),
                             torch.tensor([0, n], dtype=i32), torch.arange(n), torch.zeros(1, dtype=i32), n,
                             sm_scale=0.25, is_causal=True)  # fmt: skip
extend_attention_fwd_unified(qs[cached:].contiguous(), tail, ks, vs, 1.0, 1.0, torch.tensor([0, n - cached], dtype=i32),
                             torch.tensor([0, n], dtype=i32), torch.arange(n), torch.tensor([cached], dtype=i32),
                             n - cached, sm_scale=0.25, is_causal=True)  # fmt: skip
print(json.dumps({
    "max_diff_vs_sdpa": (out - sdpa_packed(q, k, v, lengths, 0.25)).abs().max().item(),
    "max_splits": plan.max_kv_splits,
    "batch_invariant": torch.equal(alone, out[-20:]),
    "prefix_split_invariant": torch.equal(tail, full[cached:]),
}))  # fmt: skip
