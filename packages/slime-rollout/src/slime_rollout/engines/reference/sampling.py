"""Sampling parameters, next-token sampling and stop detection for the CPU reference engine.

Semantics follow SGLang 0.5.16 (`python/sglang/srt/sampling/sampling_params.py`, `layers/sampler.py`,
`managers/detokenizer_manager.py`):

* temperature 0 (below 1e-6) is greedy; the returned log-prob is then `log_softmax(logits)`.
* otherwise the returned log-prob of the sampled token is taken from `log_softmax(logits / temperature)`,
  i.e. the temperature-scaled distribution *before* top-k/top-p truncation (SGLang computes
  `log(probs)` on the softmax it later hands to the top-k/top-p sampling kernel).
* top-k/top-p only restrict which token can be drawn.
* a stop token (`stop_token_ids`, or the model's eos unless `ignore_eos`) is kept in the output ids and
  log-probs; it is trimmed from the text unless `no_stop_trim`. A stop string is trimmed from the text
  (from its first occurrence on) unless `no_stop_trim`.
* stops are ignored until `min_new_tokens` tokens have been generated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["SamplingParams", "sample_next_token", "sample_with_kept_ids", "top_logprobs", "trim_stop"]

_GREEDY_EPS = 1e-6

_KNOWN_KEYS = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "sampling_seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "n",
    "custom_params",
    "stop_regex",
    "json_schema",
    "regex",
    "ebnf",
}


@dataclasses.dataclass(kw_only=True, slots=True)
class SamplingParams:
    """Per-request sampling parameters (SGLang field names and defaults).

    Attributes:
        temperature: softmax temperature; below 1e-6 means greedy.
        top_p: nucleus mass in (0, 1].
        top_k: keep the k most likely tokens; -1 keeps all.
        max_new_tokens: generation budget in tokens.
        min_new_tokens: stops are ignored until this many tokens exist.
        stop: stop strings.
        stop_token_ids: extra stop token ids (the model's eos is added unless `ignore_eos`).
        ignore_eos: do not stop on eos.
        skip_special_tokens: drop special tokens when decoding the text.
        spaces_between_special_tokens: accepted for compatibility (the fast tokenizer ignores it).
        no_stop_trim: keep the matched stop string / stop token in the text.
        sampling_seed: per-request seed; None uses the engine's generator.
        return_top_p_token_ids: `custom_params["return_top_p_token_ids"]` (top-p replay): report the token ids
            kept by top-k/top-p at each step and log-probs renormalized over them, as SGLang with the original
            slime's top-p replay patch does.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: set[int] = dataclasses.field(default_factory=set)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    return_top_p_token_ids: bool = False

    @classmethod
    def from_request(cls, raw: dict[str, Any] | None) -> SamplingParams:
        """Validates the `sampling_params` dict of a /generate request.

        Raises:
            ValueError: unknown key or a value out of range (the message names the field).
        """
        raw = dict(raw or {})
        unknown = set(raw) - _KNOWN_KEYS
        if unknown:
            raise ValueError(f"sampling_params: unknown field(s) {sorted(unknown)}")
        stop = raw.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        params = cls(
            temperature=float(raw.get("temperature", 1.0) if raw.get("temperature") is not None else 1.0),
            top_p=float(raw.get("top_p") if raw.get("top_p") is not None else 1.0),
            top_k=int(raw.get("top_k") if raw.get("top_k") is not None else -1),
            max_new_tokens=int(raw.get("max_new_tokens") if raw.get("max_new_tokens") is not None else 128),
            min_new_tokens=int(raw.get("min_new_tokens") or 0),
            stop=[s for s in stop if s],
            stop_token_ids={int(t) for t in (raw.get("stop_token_ids") or [])},
            ignore_eos=bool(raw.get("ignore_eos", False)),
            skip_special_tokens=bool(raw.get("skip_special_tokens", True)),
            spaces_between_special_tokens=bool(raw.get("spaces_between_special_tokens", True)),
            no_stop_trim=bool(raw.get("no_stop_trim", False)),
            sampling_seed=None if raw.get("sampling_seed") is None else int(raw["sampling_seed"]),
            return_top_p_token_ids=bool((raw.get("custom_params") or {}).get("return_top_p_token_ids", False)),
        )
        if params.temperature < 0:
            raise ValueError(f"sampling_params.temperature must be >= 0, got {params.temperature}")
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {params.top_p}")
        if params.top_k == 0 or params.top_k < -1:
            raise ValueError(f"sampling_params.top_k must be -1 or >= 1, got {params.top_k}")
        if params.max_new_tokens < 0:
            raise ValueError(f"sampling_params.max_new_tokens must be >= 0, got {params.max_new_tokens}")
        return params

    @property
    def greedy(self) -> bool:
        """Whether this request samples greedily (temperature below 1e-6)."""
        return self.temperature < _GREEDY_EPS


def _kept_ids(probs_V: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """Ids kept by top-k/top-p, most likely first; None when nothing is truncated."""
    if params.top_k <= 0 and params.top_p >= 1.0:
        return None
    sorted_probs, sorted_idx = torch.sort(probs_V, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if params.top_k > 0:
        keep[params.top_k :] = False
    if params.top_p < 1.0:
        # A token is kept while the mass strictly before it is within top_p (the first is always kept).
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep &= mass_before <= params.top_p
    return sorted_idx[keep]


def sample_with_kept_ids(
    logits_V: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[int, float, list[int] | None]:
    """Draws one token and reports what top-p replay needs (`params.return_top_p_token_ids`).

    Returns:
        (token id, its natural-log probability under the distribution actually sampled from: softmax(logits /
        temperature) renormalized over the kept ids; the kept ids, or None when nothing is truncated, in which
        case the token and log-prob are `sample_next_token`'s). Greedy keeps only the argmax (log-prob 0).
    """
    logits_V = logits_V.float()
    if params.greedy:
        token = int(torch.argmax(logits_V))
        return token, 0.0, [token]
    logprobs_V = torch.log_softmax(logits_V / params.temperature, dim=-1)
    kept = _kept_ids(logprobs_V.exp(), params)
    if kept is None:
        token, logprob = sample_next_token(logits_V, params, generator)
        return token, logprob, None
    kept_logprobs = torch.log_softmax(logprobs_V[kept], dim=-1)
    pick = int(torch.multinomial(kept_logprobs.exp(), 1, generator=generator))
    return int(kept[pick]), float(kept_logprobs[pick]), kept.tolist()


def sample_next_token(
    logits_V: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[int, float]:
    """Draws one token and returns its log-prob as SGLang reports it.

    Args:
        logits_V: `[V]` next-token logits of one sequence (any float dtype; computed in float32).
        params: the request's sampling parameters.
        generator: CPU generator for the draw (None: torch's default generator).

    Returns:
        (token id, natural-log probability of that token under softmax(logits / temperature), before
        top-k/top-p truncation; under softmax(logits) when greedy).
    """
    logits_V = logits_V.float()
    if params.greedy:
        token = int(torch.argmax(logits_V))
        return token, float(torch.log_softmax(logits_V, dim=-1)[token])
    logprobs_V = torch.log_softmax(logits_V / params.temperature, dim=-1)
    probs_V = logprobs_V.exp()
    if params.top_k > 0 or params.top_p < 1.0:
        sorted_probs, sorted_idx = torch.sort(probs_V, descending=True)
        keep = torch.ones_like(sorted_probs, dtype=torch.bool)
        if params.top_k > 0:
            keep[params.top_k :] = False
        if params.top_p < 1.0:
            # A token is kept while the mass strictly before it is within top_p (the first is always kept).
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            keep &= mass_before <= params.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        pick = torch.multinomial(sorted_probs, 1, generator=generator)
        token = int(sorted_idx[pick])
    else:
        token = int(torch.multinomial(probs_V, 1, generator=generator))
    return token, float(logprobs_V[token])


def trim_stop(text: str, matched: str | int | None, no_stop_trim: bool) -> str:
    """Removes a matched stop string from decoded text (SGLang's detokenizer behaviour).

    A matched stop *token* is removed before decoding (see `ReferenceModel`), so only strings are handled here.
    """
    if no_stop_trim or not isinstance(matched, str):
        return text
    pos = text.find(matched)
    return text[:pos] if pos != -1 else text


def find_stop_string(text: str, stops: Iterable[str]) -> str | None:
    """The first stop string (in `stops` order) that occurs in `text`, or None."""
    for s in stops:
        if s in text:
            return s
    return None


def top_logprobs(logp_NV: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """The `k` best `(log-prob, token id)` of each row of `logp_NV` `[N, V]`, best first."""
    values, ids = logp_NV.topk(k, dim=-1)
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]
