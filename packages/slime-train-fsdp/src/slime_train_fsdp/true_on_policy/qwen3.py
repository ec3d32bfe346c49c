"""The mirrored Qwen3 forward: the HF model's weights run in SGLang's on-policy op order (`--true-on-policy-mode`).

SGLang 0.5.16's `Qwen3ForCausalLM` under `--rl-on-policy-target fsdp` (`srt/models/qwen3.py`, `qwen2.py`):

    h = embed(ids) in fp32                                   # VocabParallelEmbedding(params_dtype=fp32)
    per layer:  x, res = rms_norm(h, res)  (fp32 weight, fp32 residual, fp32 out)
                q, k, v = split(x.bf16 @ [Wq; Wk; Wv]^T)     # one fused qkv matmul
                q, k = rms_norm per head (fp32 weight, bf16 cast first -> fp32), rope (fp32 cos/sin cache)
                o = attention(q.bf16, k.bf16, v)  @ Wo^T     # triton extend / decode kernels
                x, res = rms_norm(o, res);  h = silu_and_mul(x.bf16 @ [Wg; Wu]^T) @ Wd^T
    out = rms_norm(h, res);  logits = out.bf16 @ W_lm.bf16^T;  log_softmax((logits / T) -> bf16)

`install_mirrored_qwen3` adds that forward to each decoder layer as an FSDP-registered method (so FSDP still
all-gathers the layer's parameters around it) and `mirrored_response_forward` runs the row. On CUDA the compute
dtype is bf16 (the FSDP mixed-precision parameters) and the attention and batch-invariant matmuls are SGLang's;
on CPU the model's dtype (fp32 in tests) with torch ops, the same order.

Legend: `S` packed tokens, `R` response tokens, `H` hidden, `N` heads, `D` head dim, `V` vocabulary.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.distributed.fsdp import register_fsdp_forward_method

from slime_core.config.true_on_policy import SUPPORTED_ARCHITECTURES
from slime_train_fsdp.true_on_policy.attention import MirroredAttention, plan_attention
from slime_train_fsdp.true_on_policy.kernels import enable_batch_invariant_ops, load_kernels
from slime_train_fsdp.true_on_policy.ops import (
    Linear,
    Rotary,
    apply_rotary,
    rms_norm,
    rope_cos_sin_cache,
    sampler_log_probs,
    silu_and_mul,
)

__all__ = ["check_single_turn", "install_mirrored_qwen3", "mirrored_response_forward", "prompt_lengths"]

_LAYER_METHOD = "slime_mirrored_forward"
_STATE_ATTR = "slime_true_on_policy"


class _Mirror:
    """Per-model state of the mode: compute dtype, rope cache, SGLang kernels (None on CPU)."""

    def __init__(self, config, device: torch.device, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.eps = config.rms_norm_eps
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.vocab_size = config.vocab_size
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 1000000))
        self.cos_sin = rope_cos_sin_cache(self.head_dim, float(theta), config.max_position_embeddings, device)
        self.kernels = load_kernels(device)
        self.split_tile_size = self.kernels.split_tile_size if self.kernels is not None else 256
        self.rotary = self.kernels.rotary if self.kernels is not None else apply_rotary


def install_mirrored_qwen3(model: nn.Module, device: torch.device) -> None:
    """Prepares `model` (an HF `Qwen3ForCausalLM`, FSDP-sharded or not) for `mirrored_response_forward`.

    Also installs SGLang's batch-invariant ops in this process on CUDA (`kernels.enable_batch_invariant_ops`).

    Args:
        model: the causal LM.
        device: the trainer's device (CUDA: bf16 compute with SGLang's kernels; else the model's dtype, torch ops).

    Raises:
        ValueError: the model is not a dense Qwen3 (`config.architectures`), or uses rope scaling or sliding
            windows the mirrored forward does not implement.
        RuntimeError: on CUDA without SGLang.
    """
    config = model.config
    # FSDP2 renames the class `FSDP<name>`; a config built in code may lack `architectures`.
    arch = (getattr(config, "architectures", None) or [type(model).__name__.removeprefix("FSDP")])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"--true-on-policy-mode: {arch} is not a dense Qwen3 ({', '.join(SUPPORTED_ARCHITECTURES)})")
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type != "default" or getattr(config, "use_sliding_window", False):
        raise ValueError(f"--true-on-policy-mode: rope_type {rope_type!r} / sliding windows are not mirrored")
    enable_batch_invariant_ops(device)
    dtype = torch.bfloat16 if device.type == "cuda" else next(model.parameters()).dtype
    setattr(model, _STATE_ATTR, _Mirror(config, device, dtype))
    for layer in model.model.layers:
        setattr(layer, _LAYER_METHOD, types.MethodType(_layer_forward, layer))
        register_fsdp_forward_method(layer, _LAYER_METHOD)  # no-op on a module FSDP does not manage


def _layer_forward(self: nn.Module, hidden, residual, cos, sin, plan, mirror: _Mirror):
    """One decoder layer (see the module docstring): returns (`[S, H]` MLP output, `[S, H]` fp32 residual)."""
    attn, mlp, dt = self.self_attn, self.mlp, mirror.dtype
    x, residual = rms_norm(hidden, self.input_layernorm.weight, mirror.eps, residual, out_dtype=torch.float32)
    x = x.to(dt)
    w_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).to(dt)
    b_qkv = None if attn.q_proj.bias is None else torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
    qkv = Linear.apply(x, w_qkv, b_qkv)
    q_size, kv_size = mirror.heads * mirror.head_dim, mirror.kv_heads * mirror.head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    s = q.shape[0]
    # SGLang normalizes the heads as [S*N, D] rows (`_reshape_for_qk_norm`); the fp32 weight makes the result fp32.
    q, _ = rms_norm(q.reshape(-1, mirror.head_dim), attn.q_norm.weight, mirror.eps)
    k, _ = rms_norm(k.reshape(-1, mirror.head_dim), attn.k_norm.weight, mirror.eps)
    q = Rotary.apply(q.view(s, mirror.heads, mirror.head_dim), cos, sin, mirror.rotary).to(dt)
    k = Rotary.apply(k.view(s, mirror.kv_heads, mirror.head_dim), cos, sin, mirror.rotary).to(dt)
    v = v.reshape(s, mirror.kv_heads, mirror.head_dim)
    o = MirroredAttention.apply(q, k, v, plan, mirror.scale, mirror.kernels)
    o = Linear.apply(o.reshape(s, q_size), attn.o_proj.weight.to(dt), None)
    x, residual = rms_norm(o, self.post_attention_layernorm.weight, mirror.eps, residual, out_dtype=torch.float32)
    x = x.to(dt)
    w_gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).to(dt)
    h = Linear.apply(silu_and_mul(Linear.apply(x, w_gate_up, None)), mlp.down_proj.weight.to(dt), None)
    return h, residual


def check_single_turn(loss_masks: list[torch.Tensor], ids: list[int]) -> None:
    """Refuses samples the mirror cannot reproduce: a masked run followed by trained tokens in a response.

    That is a multi-turn sample: SGLang prefilled its tool output (and the turn's last model token) as a new extend
    request, while the mirror treats every response position as decoded.

    Args:
        loss_masks: `[L_i]` masks of the batch's samples.
        ids: the samples of the micro-batch being packed.

    Raises:
        ValueError: naming the first such sample.
    """
    for i in ids:
        mask = loss_masks[i]
        if mask.numel() < 2:
            continue
        trained_after_masked = (mask[1:] > 0) & (mask[:-1] == 0)
        if bool(trained_after_masked.any()):
            raise ValueError(
                f"--true-on-policy-mode: sample {i} has trained tokens after masked ones (a multi-turn sample whose "
                "tool output SGLang prefilled); the mode reproduces single-turn samples only"
            )


def prompt_lengths(seq_lengths: list[int], predict_index: torch.Tensor) -> list[int]:
    """`P_i = T_i - L_i` per sequence, `L_i` = predict positions inside sequence `i` (positions `P_i-1 .. T_i-2`).

    Args:
        seq_lengths: `T_i` in row order.
        predict_index: `[R]` row positions whose logits predict a response token.
    """
    bounds = torch.tensor([0, *seq_lengths], device=predict_index.device).cumsum(0)
    counts = torch.bucketize(predict_index, bounds[1:], right=True).bincount(minlength=len(seq_lengths))
    return [t - int(c) for t, c in zip(seq_lengths, counts.tolist(), strict=True)]


def mirrored_response_forward(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    predict_index: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    seq_lengths: list[int],
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed row through the mirrored forward: SGLang's log-probs of the response tokens.

    Must run inside the model's FSDP-registered root forward (`packing._response_forward`), which gathers the
    embeddings, final norm and `lm_head`; each layer gathers its own through its registered method.

    Args:
        model: prepared by `install_mirrored_qwen3`.
        input_ids: `[1, S]` int64 packed tokens.
        position_ids: `[1, S]` int64 positions restarting at 0 per sequence.
        predict_index: `[R]` int64 positions predicting response tokens.
        targets: `[R]` int64 response tokens.
        temperature: `--rollout-temperature`.
        with_entropy: also return the entropy.
        seq_lengths: `T_i` per packed sequence.
        chunk_size: response rows per `lm_head` + log-softmax chunk (`[chunk, V]` logits at a time; row-wise ops,
            so chunking does not change a value); each chunk is recomputed in backward instead of stored.

    Returns:
        (`[R]` fp32 log-probs, `[R]` fp32 entropy or `[0]`, scalar zero anchor connected to the parameters).
    """
    mirror: _Mirror = getattr(model, _STATE_ATTR)
    ids, pos = input_ids[0], position_ids[0]
    plan = plan_attention(seq_lengths, prompt_lengths(seq_lengths, predict_index), ids.device, mirror.split_tile_size)
    cos, sin = mirror.cos_sin.index_select(0, pos).chunk(2, dim=-1)
    hidden = F.embedding(ids, model.model.embed_tokens.weight).float()  # the engine's fp32 embedding
    residual = None
    checkpointing = getattr(model, "is_gradient_checkpointing", False) and torch.is_grad_enabled()
    for layer in model.model.layers:
        fn = getattr(layer, _LAYER_METHOD)
        if checkpointing:
            hidden, residual = torch.utils.checkpoint.checkpoint(
                fn, hidden, residual, cos, sin, plan, mirror, use_reentrant=False
            )
        else:
            hidden, residual = fn(hidden, residual, cos, sin, plan, mirror)
    out, _ = rms_norm(hidden, model.model.norm.weight, mirror.eps, residual, out_dtype=torch.float32)
    weight = model.get_output_embeddings().weight
    anchor = (out[:1, :1].sum() + weight[:1, :1].float().sum()) * 0.0
    h_resp = out.index_select(0, predict_index)  # [R, H] fp32

    def head(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # SGLang: torch.matmul(hidden.bfloat16(), lm_head.weight.T.bfloat16()), i.e. aten::mm(h, W.t()) as F.linear
        # issues it; cut to the vocabulary.
        logits = Linear.apply(h.to(mirror.dtype), w.to(mirror.dtype), None)[:, : mirror.vocab_size]
        return sampler_log_probs(logits, t, temperature, with_entropy=with_entropy, dtype=mirror.dtype)

    parts = []
    for start in range(0, h_resp.shape[0], max(1, chunk_size)):
        args = (h_resp[start : start + chunk_size], weight, targets[start : start + chunk_size])
        if torch.is_grad_enabled():
            parts.append(torch.utils.checkpoint.checkpoint(head, *args, use_reentrant=False))
        else:
            parts.append(head(*args))
    if not parts:
        return h_resp.new_zeros(0), h_resp.new_zeros(0), anchor
    logp = torch.cat([lp for lp, _ in parts])
    entropy = torch.cat([e for _, e in parts]) if with_entropy else logp.new_zeros(0)
    return logp, entropy, anchor
