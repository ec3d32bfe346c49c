"""Sampling parameters, next-token sampling and stop detection for the CPU reference engine.

Semantics follow SGLang 0.5.16 (`python/sglang/srt/sampling/sampling_params.py`, `layers/sampler.py`,
`managers/detokenizer_manager.py`):

* temperature 0 (below 1e-6) is greedy; the returned log-prob is then `log_softmax(logits)`.
* otherwise the returned log-prob of the sampled token is taken from `log_softmax(logits / temperature)`,
  i.e. the temperature-scaled distribution *before* top-k/top-p truncation (SGLang computes
  `log(probs)` on the softmax it later hands to the top-k/top-p sampling kernel).
* the logits are first adjusted as SGLang's penalizers and `logit_bias` do (`logits.py`).
* top-k/top-p/min-p only restrict which token can be drawn.
* until `min_new_tokens` tokens exist, stop tokens are masked (`logits.py`); when a request finishes and
  what its text keeps is `finish.py`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

__all__ = ["SamplingParams", "sample_next_token", "sample_with_kept_ids", "top_logprobs"]

_GREEDY_EPS = 1e-6

# SGLang 0.5.16's `SamplingParams` fields (sampling/sampling_params.py); `SamplingParams(**sampling_params)` takes
# nothing else.
_KNOWN_KEYS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed",
}  # fmt: skip
# Fields SGLang honours that this engine does not: refused (HTTP 400 naming the field), never silently ignored,
# since a CPU run would then train on samples SGLang would not have drawn.
_UNSUPPORTED = ("stop_regex", "json_schema", "regex", "ebnf", "structural_tag")


def _or(value: Any, default: Any) -> Any:
    """SGLang's `__post_init__`: a field sent as null takes its default."""
    return default if value is None else value


@dataclasses.dataclass(kw_only=True, slots=True)
class SamplingParams:
    """Per-request sampling parameters (SGLang field names and defaults).

    Attributes:
        temperature: softmax temperature; below 1e-6 means greedy.
        top_p: nucleus mass in (0, 1].
        top_k: keep the k most likely tokens; -1 keeps all.
        min_p: keep tokens whose probability is at least `min_p` times the most likely one's (0 keeps all).
        max_new_tokens: generation budget in tokens; None: up to the context length (SGLang's `1 << 30`).
        min_new_tokens: stop tokens are masked (logit -inf) until this many tokens exist (stop strings still stop).
        stop: stop strings.
        stop_token_ids: extra stop token ids (the model's eos ids stop too).
        ignore_eos: stop on no token, neither eos nor `stop_token_ids` (SGLang's; stop strings still stop).
        skip_special_tokens: drop special tokens when decoding the text.
        spaces_between_special_tokens: accepted for compatibility (the fast tokenizer ignores it).
        no_stop_trim: keep the matched stop token, or the text up to the end of the matched stop string.
        sampling_seed: per-request seed; None uses the engine's generator.
        frequency_penalty: subtracted from a token's logit once per earlier output occurrence, in [-2, 2].
        presence_penalty: subtracted from the logit of every token already in the output, in [-2, 2].
        repetition_penalty: divides positive / multiplies negative logits of tokens already in the output, (0, 2].
        logit_bias: token id -> value added to its logit before sampling.
        n: parallel samples per prompt (the /generate route expands them, as SGLang's tokenizer manager does).
        return_top_p_token_ids: `custom_params["return_top_p_token_ids"]` (top-p replay): report the token ids
            kept by top-k/top-p at each step and log-probs renormalized over them, as SGLang with the original
            slime's top-p replay patch does.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: set[int] = dataclasses.field(default_factory=set)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = dataclasses.field(default_factory=dict)
    n: int = 1
    return_top_p_token_ids: bool = False

    @classmethod
    def from_request(cls, raw: dict[str, Any] | None, vocab_size: int | None = None) -> SamplingParams:
        """Reads and checks the `sampling_params` dict of a /generate request as SGLang 0.5.16 does.

        Nulls take the defaults (`SamplingParams.__post_init__`); the range checks and their messages are
        `SamplingParams.verify` of `sglang/srt/sampling/sampling_params.py`.

        Args:
            raw: the request's `sampling_params` (None: all defaults).
            vocab_size: the model's vocabulary size, bounds the `logit_bias` keys (None: unchecked).

        Raises:
            ValueError: unknown key, a value out of SGLang's range (SGLang's message), or a field SGLang honours
                that this engine cannot (structured output, `stop_regex`): named, never silently ignored.
        """
        raw = dict(raw or {})
        unknown = set(raw) - _KNOWN_KEYS
        if unknown:
            # Deliberately not SGLang's answer: its `SamplingParams(**sampling_params)` raises TypeError, which
            # http_server.py does not catch (HTTP 500 "Internal Server Error", the field named only in its log).
            raise ValueError(f"sampling_params: unknown field(s) {sorted(unknown)}")
        stop = _or(raw.get("stop"), [])
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            # SGLang fails on it further in (HTTP 500); refused here by name.
            raise ValueError(f"sampling_params.stop must be a string or a list of strings, got {stop!r:.80}")
        params = cls(
            temperature=float(_or(raw.get("temperature"), 1.0)),
            top_p=float(_or(raw.get("top_p"), 1.0)),
            top_k=int(_or(raw.get("top_k"), -1)),
            min_p=float(_or(raw.get("min_p"), 0.0)),
            max_new_tokens=None if raw.get("max_new_tokens", 128) is None else int(raw.get("max_new_tokens", 128)),
            min_new_tokens=int(_or(raw.get("min_new_tokens"), 0)),
            stop=list(stop),  # "" included: SGLang stops at the first token on it
            stop_token_ids={int(t) for t in _or(raw.get("stop_token_ids"), []) if t is not None},
            ignore_eos=bool(_or(raw.get("ignore_eos"), False)),
            skip_special_tokens=bool(_or(raw.get("skip_special_tokens"), True)),
            spaces_between_special_tokens=bool(_or(raw.get("spaces_between_special_tokens"), True)),
            no_stop_trim=bool(_or(raw.get("no_stop_trim"), False)),
            sampling_seed=None if raw.get("sampling_seed") is None else int(raw["sampling_seed"]),
            frequency_penalty=float(_or(raw.get("frequency_penalty"), 0.0)),
            presence_penalty=float(_or(raw.get("presence_penalty"), 0.0)),
            repetition_penalty=float(_or(raw.get("repetition_penalty"), 1.0)),
            logit_bias={int(k): float(v) for k, v in _or(raw.get("logit_bias"), {}).items()},
            n=int(_or(raw.get("n"), 1)),
            return_top_p_token_ids=bool(_or(raw.get("custom_params"), {}).get("return_top_p_token_ids", False)),
        )
        params._verify(vocab_size)
        if sum(raw.get(k) is not None for k in ("json_schema", "regex", "ebnf")) > 1:
            raise ValueError("Only one of regex, json_schema, or ebnf can be set.")
        asked = [k for k in _UNSUPPORTED if raw.get(k) is not None]
        if asked:
            raise ValueError(f"sampling_params.{asked[0]}: the reference engine has no structured output or regex "
                             "stops (SGLang honours it); leave it out, or run SGLang")  # fmt: skip
        return params

    def _verify(self, vocab_size: int | None) -> None:
        """SGLang's `SamplingParams.verify` (same checks, same messages)."""
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise ValueError(f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        # SGLang turns -1 into "the whole vocabulary" before checking; temperature 0 sets top_k 1 (greedy).
        if self.top_k < 1 and self.top_k != -1 and not self.greedy:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {self.repetition_penalty}.")
        if not 0 <= self.min_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}.")
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if not self.min_new_tokens <= self.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], got {self.min_new_tokens}."
                )
        if vocab_size is not None:
            for token_id in self.logit_bias:
                if not 0 <= token_id < vocab_size:
                    raise ValueError(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}.")

    @property
    def greedy(self) -> bool:
        """Whether this request samples greedily (temperature below 1e-6)."""
        return self.temperature < _GREEDY_EPS


def _truncates(params: SamplingParams) -> bool:
    return params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0


def _sorted_keep(probs_V: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Probabilities sorted descending, their ids, and which of them top-k, top-p and min-p keep.

    As SGLang's sampler (`layers/sampler.py`, `top_k_top_p_min_p_sampling_from_probs_torch`): a token is kept while
    the mass strictly before it is within top_p (the first is always kept), and min-p compares with the most likely
    token's probability.
    """
    sorted_probs, sorted_idx = torch.sort(probs_V, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if params.top_k > 0:
        keep[params.top_k :] = False
    if params.top_p < 1.0:
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep &= mass_before <= params.top_p
    if params.min_p > 0.0:
        keep &= sorted_probs >= sorted_probs[0] * params.min_p
    return sorted_probs, sorted_idx, keep


def _kept_ids(probs_V: torch.Tensor, params: SamplingParams) -> torch.Tensor | None:
    """Ids kept by top-k/top-p/min-p, most likely first; None when nothing is truncated."""
    if not _truncates(params):
        return None
    _, sorted_idx, keep = _sorted_keep(probs_V, params)
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
        top-k/top-p/min-p truncation; under softmax(logits) when greedy).
    """
    logits_V = logits_V.float()
    if params.greedy:
        token = int(torch.argmax(logits_V))
        return token, float(torch.log_softmax(logits_V, dim=-1)[token])
    logprobs_V = torch.log_softmax(logits_V / params.temperature, dim=-1)
    probs_V = logprobs_V.exp()
    if _truncates(params):
        sorted_probs, sorted_idx, keep = _sorted_keep(probs_V, params)
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        pick = torch.multinomial(sorted_probs, 1, generator=generator)
        token = int(sorted_idx[pick])
    else:
        token = int(torch.multinomial(probs_V, 1, generator=generator))
    return token, float(logprobs_V[token])


def top_logprobs(logp_NV: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """The `k` best `(log-prob, token id)` of each row of `logp_NV` `[N, V]`, best first."""
    values, ids = logp_NV.topk(k, dim=-1)
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]
