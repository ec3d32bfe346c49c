"""What SGLang does to a request's next-token logits before sampling: penalties, the min-new-tokens mask, logit bias.

SGLang 0.5.16 adjusts the logits in `SamplingBatchInfo.apply_logits_bias` (`sglang/srt/sampling/
sampling_batch_info.py`): the additive penalizers of `sampling/penaltylib/` (frequency, presence, min-new-tokens),
then the scaling one (repetition), then `logit_bias`. Sampling and every reported log-prob (the sampled token's and
the top ones) come from the adjusted logits. All three penalties count the *output* tokens only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from slime_rollout.engines.reference.sampling import SamplingParams

__all__ = ["adjust_logits"]


def adjust_logits(
    logits_V: torch.Tensor, params: SamplingParams, output_ids: Sequence[int], stop_ids: Iterable[int]
) -> torch.Tensor:
    """The logits SGLang samples from, for one request at one step.

    Args:
        logits_V: `[V]` float32 raw next-token logits (not modified).
        params: the request's sampling parameters.
        output_ids: the tokens generated so far.
        stop_ids: the ids masked while fewer than `min_new_tokens` exist: `stop_token_ids`, the tokenizer's eos and
            SGLang's extra stop tokens (`BatchedMinNewTokensPenalizer`, also with `ignore_eos`; another eos id of
            the model config is not masked).

    Returns:
        `[V]` float32: `logits - frequency_penalty * count - presence_penalty * [count > 0]`, -inf on `stop_ids`
        while `len(output_ids) < min_new_tokens`, then for tokens with `count > 0` a positive logit divided by
        `repetition_penalty` and a negative one multiplied by it (`penaltylib/repetition_penalty.py`), plus
        `logit_bias`. The input itself when nothing applies.
    """
    penalized = params.frequency_penalty != 0.0 or params.presence_penalty != 0.0 or params.repetition_penalty != 1.0
    masked = len(output_ids) < params.min_new_tokens
    if not (penalized and output_ids) and not masked and not params.logit_bias:
        return logits_V
    vocab = logits_V.shape[-1]
    out_V = logits_V.float().clone()
    if penalized and output_ids:
        count_V = torch.bincount(torch.tensor(list(output_ids), dtype=torch.long), minlength=vocab)[:vocab].float()
        seen_V = count_V > 0
        out_V -= params.frequency_penalty * count_V + params.presence_penalty * seen_V.float()
        if params.repetition_penalty != 1.0:
            scaled_V = torch.where(out_V < 0, out_V * params.repetition_penalty, out_V / params.repetition_penalty)
            out_V = torch.where(seen_V, scaled_V, out_V)
    if masked:
        ids = [t for t in stop_ids if 0 <= t < vocab]
        if ids:
            out_V[torch.tensor(ids, dtype=torch.long)] = float("-inf")
    for token_id, bias in params.logit_bias.items():
        out_V[token_id] += bias
    return out_V
