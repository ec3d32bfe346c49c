"""The reference engine's model: batched KV-cache generation and in-place weight loading.

One `ReferenceModel` wraps a transformers `AutoModelForCausalLM` on CPU (or CUDA if asked). New requests
are left-padded into one `[B, T]` tensor with an attention mask and explicit position ids and prefilled in
one forward, then decoded one token per step with the model's KV cache (continuous batching: between steps,
newly arrived requests are prefilled and merged in, their caches left-padded with masked zeros to a common
length, and finished rows leave). Rows are independent because the mask keeps pads out of attention.

All forwards and weight loads take `self.lock`, so a weight update lands between two decode steps.

A vision-language checkpoint (a config with `vision_config`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL) is served the same
way: requests carry their vision tensors (`vision.py`), prefill passes the rows' images in row order with explicit
3-D rotary positions (`[3, B, T]`), and each row decodes on from its largest prompt position plus one.
Weights arrive under checkpoint names and are mapped to module names (`slime_core.hf_names`).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer
from transformers.cache_utils import DynamicLayer

from slime_core.fp8 import read_fp8_config
from slime_core.hf_names import to_module_name
from slime_core.moe_experts import expert_slice
from slime_rollout.engines.reference.fp8 import ServedFp8, build_empty
from slime_rollout.engines.reference.lora import LoraAdapters
from slime_rollout.engines.reference.sampling import (
    SamplingParams,
    find_stop_string,
    sample_next_token,
    sample_with_kept_ids,
    trim_stop,
)
from slime_rollout.engines.reference.vision import VisionInputs, VisionPreprocessor, mrope_positions
from slime_rollout.engines.weight_checksum import sglang_checksums

__all__ = ["GenRequest", "ReferenceModel", "abort_reason"]

# HF model types whose SGLang 0.5.16 class has `get_weights_by_name` (models/llama.py and its subclasses, opt,
# granite, exaone4); every other one answers /get_weights_by_name with HTTP 400.
_SGLANG_READBACK_TYPES = frozenset({"llama", "mistral", "ministral3", "opt", "granite", "exaone4"})

logger = logging.getLogger(__name__)

# Tokens decoded past the longest stop string when checking for stop strings (multi-byte characters may
# span several tokens).
_STOP_TAIL_SLACK = 8


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


@dataclasses.dataclass(kw_only=True, slots=True)
class _Batch:
    """Rows in flight: requests, their KV cache, attention mask `[B, T]`, next positions `[B]`, logits `[B, V]`."""

    live: list[GenRequest]
    cache: Any
    mask_BT: torch.Tensor
    next_pos_B: torch.Tensor
    logits_BV: torch.Tensor


class ReferenceModel:
    """A Hugging Face causal LM served by the reference engine.

    Args:
        model_path: HF model directory (config + safetensors + tokenizer files).
        dtype: "float32" (default), "bfloat16", "float16" or "auto".
        device: torch device string; "cpu" by default.
        tokenizer_path: tokenizer directory; defaults to `model_path`.

    Raises:
        ValueError: unknown dtype.
        OSError: the model or tokenizer cannot be loaded (transformers' message names the path).
    """

    def __init__(
        self, model_path: str, *, dtype: str = "float32", device: str = "cpu", tokenizer_path: str | None = None
    ):
        if dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"--dtype must be float32|bfloat16|float16|auto, got {dtype!r}")
        self.model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.device = torch.device(device)
        self.lock = threading.RLock()
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        config = AutoConfig.from_pretrained(self.model_path)
        self.is_vlm = getattr(config, "vision_config", None) is not None
        model_cls = AutoModelForImageTextToText if self.is_vlm else AutoModelForCausalLM
        self.fp8 = ServedFp8(read_fp8_config(self.model_path))  # an FP8 checkpoint: dequantized on load
        if self.fp8.cfg is None:
            self.model = model_cls.from_pretrained(self.model_path, dtype=torch_dtype).to(self.device).eval()
        else:
            self.model = build_empty(model_cls, config, torch_dtype).to(self.device).eval()
        self.model_type = config.model_type
        self.vision: VisionPreprocessor | None = None
        if self.is_vlm:
            processor = AutoProcessor.from_pretrained(self.tokenizer_path)
            self.vision = VisionPreprocessor(processor, config)
            self.tokenizer = processor.tokenizer
        else:
            self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        self.eos_token_ids = self._eos_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else next(iter(self.eos_token_ids), 0))
        self.vocab_size = int(self.model.config.get_text_config().vocab_size)  # the logits' width
        text_config = config.get_text_config()
        self.max_context_len = int(getattr(text_config, "max_position_embeddings", 1 << 30))
        self.adapters = LoraAdapters(self.model)
        if self.fp8.cfg is not None:
            self._load_fp8_checkpoint()

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        sources = (self.model.config.get_text_config(), getattr(self.model, "generation_config", None), self.tokenizer)
        for source in sources:
            eos = getattr(source, "eos_token_id", None)
            if eos is None:
                continue
            ids.update([eos] if isinstance(eos, int) else eos)
        return {int(i) for i in ids}

    # ----------------------------------------------------------------------------------------- generation

    @torch.inference_mode()
    def generate(
        self,
        reqs: list[GenRequest],
        wait_if_paused: Callable[[], None] = lambda: None,
        *,
        notify: Callable[[GenRequest], None] = lambda r: None,
        take_new: Callable[[int], list[GenRequest]] = lambda n: [],
        max_batch: int = 1 << 30,
        lora: str | None = None,
    ) -> None:
        """Generates requests to completion with continuous batching, filling them in place.

        Between two decode steps, requests from `take_new` are prefilled and merged into the running batch
        (their KV caches left-padded to a common length), and finished rows leave it.

        Args:
            reqs: the first requests; ones already finished (aborted before start) are only notified.
            wait_if_paused: called between decode steps; blocks while generation is paused in place.
            notify: called (from this thread) once per request when it finishes.
            take_new: returns up to n more requests to admit (none: the batch only drains).
            max_batch: largest number of rows in flight.
            lora: the LoRA adapter of every request of the batch (None: the base model).
        """
        with self.lock:
            self.adapters.active = lora
        try:
            self._generate(reqs, wait_if_paused, notify, take_new, max_batch)
        finally:
            self.adapters.active = None

    def _generate(self, reqs, wait_if_paused, notify, take_new, max_batch) -> None:  # noqa: ANN001
        batch: _Batch | None = None
        new = reqs
        mergeable = True
        while True:
            if batch is not None:
                self._decode(batch)
            new = [r for r in new if not self._finished_before_prefill(r, notify)]
            if new:
                fresh = self._prefill(new)
                batch = fresh if batch is None else self._merge(batch, fresh)
            if batch is None:
                return
            for i, r in enumerate(batch.live):
                if not r.finished:
                    self._step(r, batch.logits_BV[i])
                if r.finished:
                    notify(r)
            batch = self._drop_finished(batch)
            wait_if_paused()
            # Merging needs plain full-attention cache layers; other caches (sliding window) only drain.
            mergeable = mergeable and (batch is None or all(type(la) is DynamicLayer for la in batch.cache.layers))
            in_flight = 0 if batch is None else len(batch.live)
            new = take_new(max_batch - in_flight) if (mergeable or batch is None) and in_flight < max_batch else []
            if batch is None and not new:
                return

    @staticmethod
    def _finished_before_prefill(r: GenRequest, notify: Callable[[GenRequest], None]) -> bool:
        if r.aborted and not r.finished:
            r.finish_reason = abort_reason("Abort before prefill")
        if r.finished:
            notify(r)
        return r.finished

    def _prefill(self, reqs: list[GenRequest]) -> _Batch:
        """One left-padded forward over the prompts; returns the batch with its next-token logits."""
        batch_size, max_len = len(reqs), max(len(r.input_ids) for r in reqs)
        input_ids_BT = torch.full((batch_size, max_len), self.pad_token_id, dtype=torch.long)
        mask_BT = torch.zeros((batch_size, max_len), dtype=torch.long)
        for i, r in enumerate(reqs):
            input_ids_BT[i, max_len - len(r.input_ids) :] = torch.tensor(r.input_ids, dtype=torch.long)
            mask_BT[i, max_len - len(r.input_ids) :] = 1
        # Left padding: real tokens get positions 0..P-1; pads get 0 (they are masked out anyway).
        pos_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        vision_kwargs: dict[str, Any] = {}
        position_ids = pos_BT
        if self.is_vlm:
            position_ids, vision_kwargs = self._vision_prefill(reqs, max_len)
        want_input_logprobs = any(r.logprob_start_len >= 0 for r in reqs)
        with self.lock:
            out = self.model(
                input_ids=input_ids_BT.to(self.device),
                attention_mask=mask_BT.to(self.device),
                position_ids=position_ids.to(self.device),
                use_cache=True,
                # Full [B, T, V] logits only when prompt log-probs are asked for: they are large.
                logits_to_keep=0 if want_input_logprobs else 1,
                **vision_kwargs,
            )
        if want_input_logprobs:
            self._fill_input_logprobs(reqs, out.logits, max_len)
        for r in reqs:
            if r.params.max_new_tokens == 0:
                r.finish_reason = {"type": "length", "length": 0}
        return _Batch(
            live=list(reqs),
            cache=out.past_key_values,
            mask_BT=mask_BT,
            # 3-D positions: a row continues after its largest position (text after an image jumps ahead).
            next_pos_B=(position_ids.amax(dim=0) if self.is_vlm else position_ids)[:, -1] + 1,
            logits_BV=out.logits[:, -1, :].float().cpu(),
        )

    def _vision_prefill(self, reqs: list[GenRequest], max_len: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """`[3, B, T]` left-padded rotary positions and the rows' vision tensors (concatenated in row order)."""
        pos_3BT = torch.zeros((3, len(reqs), max_len), dtype=torch.long)
        pixels, grids = [], []
        for i, r in enumerate(reqs):
            grid = None if r.vision is None else r.vision.image_grid_thw
            pos_3BT[:, i, max_len - len(r.input_ids) :] = mrope_positions(self.model.model, r.input_ids, grid)
            if r.vision is not None:
                pixels.append(r.vision.pixel_values)
                grids.append(r.vision.image_grid_thw)
        if not pixels:
            return pos_3BT, {}
        pixel_values = torch.cat(pixels).to(self.device, self.model.dtype)
        return pos_3BT, {"pixel_values": pixel_values, "image_grid_thw": torch.cat(grids).to(self.device)}

    def _decode(self, batch: _Batch) -> None:
        """One decode step: feeds every row's last token, updates cache, mask, positions and logits."""
        last_tokens = [r.output_ids[-1] for r in batch.live]
        batch.mask_BT = torch.cat([batch.mask_BT, torch.ones((len(batch.live), 1), dtype=torch.long)], dim=1)
        position_ids = batch.next_pos_B[:, None]
        if self.is_vlm:
            position_ids = position_ids[None].expand(3, -1, -1)  # generated text: the same position on all 3 axes
        with self.lock:
            out = self.model(
                input_ids=torch.tensor(last_tokens, dtype=torch.long)[:, None].to(self.device),
                attention_mask=batch.mask_BT.to(self.device),
                position_ids=position_ids.to(self.device),
                past_key_values=batch.cache,
                use_cache=True,
            )
        batch.cache, batch.logits_BV = out.past_key_values, out.logits[:, -1, :].float().cpu()
        batch.next_pos_B = batch.next_pos_B + 1

    def _drop_finished(self, batch: _Batch) -> _Batch | None:
        """Removes finished rows from the batch and its KV cache (None when nothing is left)."""
        keep = [i for i, r in enumerate(batch.live) if not r.finished]
        if not keep:
            return None
        if len(keep) < len(batch.live):
            keep_B = torch.tensor(keep, dtype=torch.long)
            batch.cache.batch_select_indices(keep_B.to(self.device))
            batch.mask_BT, batch.next_pos_B = batch.mask_BT[keep_B], batch.next_pos_B[keep_B]
            batch.logits_BV = batch.logits_BV[keep_B]
            batch.live = [batch.live[i] for i in keep]
        return batch

    @staticmethod
    def _merge(a: _Batch, b: _Batch) -> _Batch:
        """Concatenates two batches; the shorter cache is left-padded with masked zeros to a common length."""
        len_a, len_b = a.mask_BT.shape[1], b.mask_BT.shape[1]
        total = max(len_a, len_b)

        def pad_seq(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
            if n == 0:
                return t
            shape = list(t.shape)
            shape[dim] = n
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
            # DynamicLayer keys/values: [B, kv_heads, T, head_dim]
            la.keys = torch.cat([pad_seq(la.keys, total - len_a, 2), pad_seq(lb.keys, total - len_b, 2)], dim=0)
            la.values = torch.cat([pad_seq(la.values, total - len_a, 2), pad_seq(lb.values, total - len_b, 2)], dim=0)
        a.mask_BT = torch.cat([pad_seq(a.mask_BT, total - len_a, 1), pad_seq(b.mask_BT, total - len_b, 1)], dim=0)
        a.next_pos_B = torch.cat([a.next_pos_B, b.next_pos_B])
        a.logits_BV = torch.cat([a.logits_BV, b.logits_BV])
        a.live = a.live + b.live
        return a

    @staticmethod
    def _fill_input_logprobs(live: list[GenRequest], logits_BTV: torch.Tensor, max_len: int) -> None:
        """Prompt-token log-probs from the prefill logits (temperature-scaled like the output log-probs)."""
        for i, r in enumerate(live):
            if r.logprob_start_len < 0:
                continue
            num_prompt = len(r.input_ids)
            if r.logprob_start_len >= num_prompt:  # SGLang: nothing to score, an empty list
                r.input_logprobs, r.input_top_logprobs = [], []
                continue
            pad = max_len - num_prompt
            # logits at padded position pad + j predict prompt token j + 1
            logits_PV = logits_BTV[i, pad : max_len - 1].float()
            if not r.params.greedy:
                logits_PV = logits_PV / r.params.temperature
            targets = torch.tensor(r.input_ids[1:], dtype=torch.long, device=logits_PV.device)
            logp_PV = torch.log_softmax(logits_PV, dim=-1)
            lps = logp_PV.gather(-1, targets[:, None])[:, 0].tolist()
            if r.top_logprobs_num > 0:  # rows predicting prompt tokens start + 1 .. P - 1
                r.input_top_logprobs = [None, *_top(logp_PV[r.logprob_start_len :], r.top_logprobs_num)]
            # As SGLang: one entry per position from logprob_start_len on, and that first entry is always None
            # (SGLang drops the value computed for it, whatever the start).
            by_position = [None] + lps  # by_position[p]: log-prob of prompt token p
            r.input_logprobs = [None] + by_position[r.logprob_start_len + 1 :]

    def _step(self, r: GenRequest, logits_V: torch.Tensor) -> None:
        """Samples one token for `r` and decides whether it finished."""
        if r.aborted:
            r.finish_reason = abort_reason("Aborted")
            return
        if r.params.return_top_p_token_ids:
            token, logprob, kept = sample_with_kept_ids(logits_V, r.params, r.generator)
            if kept is not None:
                r.output_kept_ids = (r.output_kept_ids or []) + [kept]
        else:
            token, logprob = sample_next_token(logits_V, r.params, r.generator)
        r.output_ids.append(token)
        r.output_logprobs.append(logprob)
        if r.top_logprobs_num > 0:
            scaled = logits_V.float() if r.params.greedy else logits_V.float() / r.params.temperature
            r.output_top_logprobs.append(_top(torch.log_softmax(scaled, -1)[None], r.top_logprobs_num)[0])
        p = r.params
        may_stop = len(r.output_ids) >= p.min_new_tokens
        if may_stop and (token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)):
            r.finish_reason = {"type": "stop", "matched": token}
            return
        if may_stop and p.stop:
            tail_tokens = max(len(s) for s in p.stop) + _STOP_TAIL_SLACK
            matched = find_stop_string(self.tokenizer.decode(r.output_ids[-tail_tokens:]), p.stop)
            if matched is not None:
                r.finish_reason = {"type": "stop", "matched": matched}
                return
        if len(r.output_ids) >= p.max_new_tokens or len(r.input_ids) + len(r.output_ids) >= self.max_context_len:
            r.finish_reason = {"type": "length", "length": len(r.output_ids)}

    def output_text(self, r: GenRequest) -> str:
        """Decoded response text with SGLang's stop trimming (tokens themselves are never trimmed)."""
        ids = r.output_ids
        matched = (r.finish_reason or {}).get("matched")
        if isinstance(matched, int) and not r.params.no_stop_trim and ids:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=r.params.skip_special_tokens)
        return trim_stop(text, matched, r.params.no_stop_trim)

    # ------------------------------------------------------------------------------------------ weights

    def load_named_tensors(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copies tensors into the model's parameters/buffers by Hugging Face checkpoint name.

        Checkpoint names (what SGLang loads, e.g. `visual.*` for Qwen2.5-VL) are mapped to this model's module
        names first (`slime_core.hf_names.to_module_name`); module names pass unchanged. A per-expert MoE matrix
        lands in its slice of transformers' fused expert parameter (`slime_core.moe_experts.expert_slice`).

        The whole bucket is checked before any tensor is copied, so a bucket refused for one bad name or shape
        leaves every weight as it was (copying as it went left the tensors before the bad one applied under the
        old weight version: a mix of two versions behind a failed request).

        Returns:
            Number of tensors loaded.

        Raises:
            KeyError: a name the model does not have.
            ValueError: a shape mismatch (the message names the tensor).
        """
        state = self.model.state_dict()
        with self.lock, torch.no_grad():
            pairs = []
            for name, tensor in self.fp8.dequantized(named_tensors):
                name = to_module_name(name, self.model_type)
                target = state.get(name)
                if target is None and (where := expert_slice(name, state)) is not None:
                    fused, expert, half = where  # transformers' fused MoE experts (slime_core.moe_experts)
                    target = state[fused][expert]
                    if half is not None:
                        target = target.chunk(2, dim=0)[half]
                if target is None:
                    raise KeyError(f"update_weights: unknown parameter {name!r}")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"update_weights: shape mismatch for {name!r}: engine {tuple(target.shape)}, "
                        f"got {tuple(tensor.shape)}"
                    )
                pairs.append((target, tensor))
            for target, tensor in pairs:
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        return len(pairs)

    def zero_weights(self) -> None:
        """Zeroes every parameter: SGLang's weights after a release and resume without a CPU backup."""
        with self.lock, torch.no_grad():
            for param in self.model.parameters():
                param.zero_()

    def weight_checksums(self) -> dict[str, str]:
        """SGLang's `/weights_checker` checksums of the weights held (`slime_rollout.engines.weight_checksum`).

        Names as SGLang's (fused `qkv_proj` / `gate_up_proj`); a tied `lm_head.weight` is the embedding and, as in
        SGLang's Qwen3, not listed; non-persistent buffers (rotary tables) are not weights.
        """
        state = self.model.state_dict()
        if getattr(self.model.config.get_text_config(), "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        with self.lock:
            items = self.fp8.checksum_items({k: v.detach() for k, v in state.items()})  # FP8: e4m3 + scales held
            return sglang_checksums(items, dtype=self.model.dtype)

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        """A parameter's first `truncate_size` entries along dim 0 as float32 lists (SGLang's `/get_weights_by_name`).

        Only for the model types whose SGLang class implements it (`_SGLANG_READBACK_TYPES`; Qwen3 answers 400
        there, so here too). Checkpoint names (e.g. `visual.*` for Qwen2.5-VL) are mapped as in `load_named_tensors`;
        module names pass unchanged. As SGLang, a tied `lm_head.weight` reads the embedding. For a 2-D weight the
        result is a list of rows.

        Raises:
            KeyError: the model has no such parameter or buffer.
        """
        if self.model_type not in _SGLANG_READBACK_TYPES:
            raise KeyError(f"get_weights_by_name: SGLang's {self.model_type} model class does not implement it")
        state = self.model.state_dict()
        module_name = to_module_name(name, self.model_type)
        tied = getattr(self.model.config.get_text_config(), "tie_word_embeddings", False)
        if module_name not in state and name == "lm_head.weight" and tied:
            module_name = next((k for k in state if k.endswith("embed_tokens.weight")), module_name)
        if module_name not in state:
            raise KeyError(f"get_weights_by_name: unknown parameter {name!r}")
        with self.lock:
            return state[module_name][:truncate_size].detach().to("cpu", torch.float32).tolist()

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Loads a PEFT adapter directory as `name` between two decode steps (`LoraAdapters.load`)."""
        with self.lock:
            self.adapters.load(name, path)

    def unload_lora_adapter(self, name: str) -> None:
        """Forgets adapter `name` (`LoraAdapters.unload`)."""
        with self.lock:
            self.adapters.unload(name)

    def _load_fp8_checkpoint(self) -> None:
        """Loads the FP8 serving checkpoint the engine was started on; every weight of the model must be in it.

        Raises:
            ValueError: the checkpoint lacks some of the model's weights (names a few).
        """
        state = self.model.state_dict()
        if getattr(self.model.config.get_text_config(), "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # the embedding, loaded under its own name
        held = set()
        for f in pathlib.Path(self.model_path).glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as handle:
                held.update(to_module_name(k, self.model_type) for k in handle.keys())  # noqa: SIM118
        missing = sorted(set(state) - held)
        if missing:
            raise ValueError(f"{self.model_path}: the FP8 checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        self.load_from_disk(self.model_path)

    def load_from_disk(self, model_path: str) -> int:
        """Loads every `*.safetensors` file of an HF checkpoint directory into the model.

        All files are checked as one bucket before any weight is copied (file by file, a bad later shard left the
        earlier ones applied under the old version).

        Raises:
            FileNotFoundError: no safetensors file. KeyError: an unknown name. ValueError: a shape mismatch or a
                truncated file (named).
        """
        files = sorted(pathlib.Path(model_path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"update_weights_from_disk: no *.safetensors in {model_path}")
        named: list[tuple[str, torch.Tensor]] = []
        for f in files:
            try:
                named.extend(load_file(str(f)).items())
            except SafetensorError as e:
                raise ValueError(f"update_weights_from_disk: {f} is not a complete safetensors file ({e})") from e
        n = self.load_named_tensors(named)
        self.model_path = str(model_path)
        logger.info("loaded %d tensors from %s", n, model_path)
        return n


def abort_reason(message: str) -> dict[str, Any]:
    """SGLang's finish reason of an aborted request (`FINISH_ABORT.to_json()`)."""
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def _top(logp_NV: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """The `k` best `(log-prob, token id)` of each row of `logp_NV` `[N, V]`, best first."""
    values, ids = logp_NV.topk(k, dim=-1)
    return [list(zip(v, i, strict=True)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)]
