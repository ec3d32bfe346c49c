"""The reference engine's model: batched KV-cache generation (weights: `weights.py`; requests: `request.py`).

One `ReferenceModel` wraps a transformers `AutoModelForCausalLM` on CPU (or CUDA if asked). New requests
are left-padded into one `[B, T]` tensor with an attention mask and explicit position ids and prefilled in
one forward, then decoded one token per step with the model's KV cache (continuous batching: between steps,
newly arrived requests are prefilled and merged in, their caches left-padded with masked zeros to a common
length, and finished rows leave). Rows are independent because the mask keeps pads out of attention.

All forwards and weight loads (`ReferenceModel.weights`) take `self.lock`, so a weight update lands between two
decode steps.

A vision-language checkpoint (a config with `vision_config`: Qwen2-VL, Qwen2.5-VL, Qwen3-VL) is served the same
way: requests carry their vision tensors (`vision.py`), prefill passes the rows' images in row order with explicit
3-D rotary positions (`[3, B, T]`), and each row decodes on from its largest prompt position plus one.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer
from transformers.cache_utils import DynamicLayer

from slime_core.fp8 import read_fp8_config
from slime_rollout.engines.reference.finish import check_finished, extra_stop_token_ids, reply_text
from slime_rollout.engines.reference.fp8 import ServedFp8, build_empty
from slime_rollout.engines.reference.logits import adjust_logits
from slime_rollout.engines.reference.lora import LoraAdapters
from slime_rollout.engines.reference.request import GenRequest, abort_reason, queued_abort_reason
from slime_rollout.engines.reference.sampling import sample_next_token, sample_with_kept_ids, top_logprobs
from slime_rollout.engines.reference.vision import VisionPreprocessor, mrope_positions
from slime_rollout.engines.reference.weights import ServedWeights

__all__ = ["ReferenceModel"]


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
        context_length: the context served in tokens, as SGLang's `--context-length` (a RoPE-scaled model, or a
            shorter serving limit); defaults to the model's `max_position_embeddings`.

    Raises:
        ValueError: unknown dtype.
        OSError: the model or tokenizer cannot be loaded (transformers' message names the path).
    """

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        tokenizer_path: str | None = None,
        context_length: int | None = None,
    ):
        if dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"--dtype must be float32|bfloat16|float16|auto, got {dtype!r}")
        model_path = str(model_path)
        self.tokenizer_path = str(tokenizer_path or model_path)
        self.device = torch.device(device)
        self.lock = threading.RLock()
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        config = AutoConfig.from_pretrained(model_path)
        self.is_vlm = getattr(config, "vision_config", None) is not None
        model_cls = AutoModelForImageTextToText if self.is_vlm else AutoModelForCausalLM
        self.fp8 = ServedFp8(read_fp8_config(model_path))  # an FP8 checkpoint: dequantized on load
        if self.fp8.cfg is None:
            self.model = model_cls.from_pretrained(model_path, dtype=torch_dtype).to(self.device).eval()
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
        # SGLang's stop ids (`finish.py`): every eos id ends a request; `min_new_tokens` masks only the tokenizer's.
        extra = extra_stop_token_ids(self.tokenizer)
        self.eos_token_ids = self._eos_ids() | extra
        eos = self.tokenizer.eos_token_id
        self.masked_stop_ids = extra | (set() if eos is None else {int(eos)})
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else next(iter(self.eos_token_ids), 0))
        self.vocab_size = int(self.model.config.get_text_config().vocab_size)  # the logits' width
        text_config = config.get_text_config()
        self.max_context_len = int(context_length or getattr(text_config, "max_position_embeddings", 1 << 30))
        self.adapters = LoraAdapters(self.model)
        self.weights = ServedWeights(self.model, self.lock, model_type=self.model_type, fp8=self.fp8,
                                     model_path=model_path)  # fmt: skip
        if self.fp8.cfg is not None:
            self.weights.load_fp8_checkpoint()

    @property
    def model_path(self) -> str:
        """The checkpoint directory of the weights served now (`/update_weights_from_disk` moves it)."""
        return self.weights.model_path

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
            r.finish_reason = queued_abort_reason()
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
                r.input_top_logprobs = [None, *top_logprobs(logp_PV[r.logprob_start_len :], r.top_logprobs_num)]
            # As SGLang: one entry per position from logprob_start_len on, and that first entry is always None
            # (SGLang drops the value computed for it, whatever the start).
            by_position = [None] + lps  # by_position[p]: log-prob of prompt token p
            r.input_logprobs = [None] + by_position[r.logprob_start_len + 1 :]

    def _step(self, r: GenRequest, logits_V: torch.Tensor) -> None:
        """Samples one token for `r` and decides whether it finished."""
        if r.aborted:
            r.finish_reason = abort_reason("Aborted")
            return
        logits_V = adjust_logits(logits_V, r.params, r.output_ids, r.params.stop_token_ids | self.masked_stop_ids)
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
            r.output_top_logprobs.append(top_logprobs(torch.log_softmax(scaled, -1)[None], r.top_logprobs_num)[0])
        r.finish_reason = check_finished(r, self.tokenizer, self.eos_token_ids)

    def output_text(self, r: GenRequest) -> str:
        """Decoded response text with SGLang's stop trimming (`finish.reply_text`; the ids are never trimmed)."""
        return reply_text(r, self.tokenizer)

    # ------------------------------------------------------------------------------------------ LoRA adapters

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Loads a PEFT adapter directory as `name` between two decode steps (`LoraAdapters.load`)."""
        with self.lock:
            self.adapters.load(name, path)

    def unload_lora_adapter(self, name: str) -> None:
        """Forgets adapter `name` (`LoraAdapters.unload`)."""
        with self.lock:
            self.adapters.unload(name)
