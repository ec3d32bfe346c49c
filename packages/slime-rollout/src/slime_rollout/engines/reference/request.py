"""One generation request of the reference engine, as its model fills it, and SGLang's finish reason of an abort."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from slime_rollout.engines.reference.sampling import SamplingParams
from slime_rollout.engines.reference.vision import VisionInputs

__all__ = ["GenRequest", "abort_reason", "is_queued_abort", "queued_abort_reason"]


@dataclasses.dataclass(kw_only=True, slots=True, eq=False)
class GenRequest:
    """One generation request as the model sees it (filled in place).

    Attributes:
        rid: request id (SGLang's `rid`).
        input_ids: prompt token ids `[P]`.
        params: sampling parameters.
        generator: CPU generator used for this request's draws.
        output_ids: generated token ids `[R]`, stop token included.
        output_logprobs: `[R]` natural-log probabilities of `output_ids` (see `sample_next_token`).
        finish_reason: SGLang's dict (`{"type": "stop"|"length"|"abort", ...}`) once finished, else None.
        logprob_start_len: first prompt position whose log-prob is returned (-1: none, SGLang's default).
        input_logprobs: `[P - start]` log-probs of the prompt tokens from `logprob_start_len` on, the first entry
            None (as SGLang's), filled when `logprob_start_len >= 0`.
        aborted: set by /abort_request; the decode loop finishes the request with type "abort".
        created: `time.monotonic()` at arrival (for `e2e_latency`).
        vision: the prompt's vision tensors (requests with `image_data`), else None.
        lora: the LoRA adapter the request runs with (`lora_path` of `/generate`), None for the base model.
        top_logprobs_num: how many most likely tokens to report per scored position (SGLang's `top_logprobs_num`).
        input_top_logprobs: per entry of `input_logprobs`, the `top_logprobs_num` best `(log-prob, id)` (None at
            the first entry, as SGLang).
        output_top_logprobs: per output token, the `top_logprobs_num` best `(log-prob, id)` of its distribution.
    """

    rid: str
    input_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    output_ids: list[int] = dataclasses.field(default_factory=list)
    output_logprobs: list[float] = dataclasses.field(default_factory=list)
    output_kept_ids: list[list[int]] | None = None  # top-p replay: the ids kept at each step
    finish_reason: dict[str, Any] | None = None
    logprob_start_len: int = -1
    input_logprobs: list[float | None] | None = None
    aborted: bool = False
    created: float = dataclasses.field(default_factory=time.monotonic)
    vision: VisionInputs | None = None
    lora: str | None = None
    top_logprobs_num: int = 0
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    output_top_logprobs: list[list[tuple[float, int]]] = dataclasses.field(default_factory=list)

    @property
    def finished(self) -> bool:
        """Whether the request has a finish reason."""
        return self.finish_reason is not None


def abort_reason(message: str) -> dict[str, Any]:
    """SGLang's finish reason of an aborted request (`FINISH_ABORT.to_json()`)."""
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


# SGLang 0.5.16's message for a request aborted before it left the waiting queue (`TokenizerManager._handle_abort_req`).
_QUEUED_ABORT_MESSAGE = "Abort in waiting queue"


def queued_abort_reason() -> dict[str, Any]:
    """SGLang's finish reason of a request aborted in the waiting queue: `{"type": "abort", "message"}` only."""
    return {"type": "abort", "message": _QUEUED_ABORT_MESSAGE}


def is_queued_abort(finish_reason: dict[str, Any] | None) -> bool:
    """Whether `finish_reason` is `queued_abort_reason()` (the reply then carries SGLang's reduced meta_info)."""
    return finish_reason == queued_abort_reason()
