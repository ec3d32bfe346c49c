"""The compile warm-up's log-prob head part: the compiled `fused` head's graphs at the trained model's vocabulary.

Run by the warm-up process (`compile_warmup.run_warm_up`) after the stand-in's layers, whose 256-token vocabulary
would give the head graphs no step uses.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from slime_core.config import SlimeArgs

if TYPE_CHECKING:
    from slime_train_fsdp.packing import ForwardOptions

__all__ = ["warm_up_head"]


def warm_up_head(options: ForwardOptions, *, vocab_size: int, device: torch.device, cfg: SlimeArgs,
                 no_grad: bool = True) -> None:  # fmt: skip
    """Compiles the log-prob head's graphs as the trained model's steps call it (nothing without a compiled head).

    The compiled `fused` head's graphs depend on the vocabulary `V`: inductor guards its `[c, V]` reductions on
    `V`'s range (CPU, 256-token stand-in: `V <= 4096`, which the 151936 of Qwen3 fails, so its step compiled them
    again). They do not depend on the hidden width, which only the eager matmul sees, nor on a chunk's position
    (`fused_head._own`). So this runs the head alone on `[rows, 16]` hidden states and a `[V, 16]` weight in the
    layers' compute dtype, with the rows of one full chunk of `--log-probs-chunk-size` and a shorter last one, as a
    micro-batch has them: the no-grad pass of `compute_log_probs` (no entropy; when `no_grad`), and the training
    pass (entropy) with the backward the step's loss takes: the entropy term only when the run's loss
    back-propagates through it (`slime_core.train_step.entropy_has_grad`), a different graph. GPU memory: one
    chunk's fp32 logits at a time (`chunk * V * 4` bytes; 0.6 GiB for Qwen3 at 1024 rows), twice in the backward.

    Args:
        options: the trained model's `packing.ForwardOptions` (`head`, `compile_head`).
        vocab_size: the trained model's vocabulary (rows of its output weight).
        device: the compute device.
        cfg: reads `rollout_temperature`, `log_probs_chunk_size` and what `entropy_has_grad` reads.
        no_grad: also compile the no-grad pass (`slime_core.train_step.runs_no_grad_forward`).
    """
    from slime_core.algorithms.fused_head import resolve_chunk_size
    from slime_core.train_step import entropy_has_grad
    from slime_train_fsdp.logprob_head import head_log_probs
    from slime_train_fsdp.model_loading import compute_dtype

    if not options.compile_head:
        return
    chunk = resolve_chunk_size(cfg.log_probs_chunk_size)
    # A full chunk (the forward's first call, as in a step) and a last, shorter one (the backward's first call) of
    # at least 2 rows (dynamo specializes sizes 0 and 1: a graph of its own).
    rows, width, dtype = chunk + max(chunk // 3, 2), 16, compute_dtype(device)
    g = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(rows, width, generator=g).to(device, dtype).requires_grad_(True)  # [rows, 16]
    weight = torch.randn(vocab_size, width, generator=g).to(device, dtype).requires_grad_(True)  # [V, 16]
    targets = torch.randint(0, vocab_size, (rows,), generator=g).to(device)  # [rows] int64
    run = functools.partial(head_log_probs, temperature=cfg.rollout_temperature, chunk_size=chunk,
                            head=options.head, compiled=True)  # fmt: skip
    if no_grad:
        with torch.no_grad():
            run(hidden, weight, targets, with_entropy=False)
    logp, entropy = run(hidden, weight, targets, with_entropy=True)
    # Cotangents as the step's loss gives them: dense `[rows]` tensors (a plain `.sum()` gives stride-0 ones, which
    # dynamo guards on: another graph).
    loss = (logp * torch.rand_like(logp)).sum()
    if entropy_has_grad(cfg):
        loss = loss + (entropy * torch.rand_like(entropy)).sum()
    loss.backward()
