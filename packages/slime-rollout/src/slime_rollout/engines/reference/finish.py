"""When a reference-engine request finishes, and the text its reply carries, as SGLang 0.5.16 decides both.

SGLang checks a request after every sampled token in `Req.update_finish_state` (`sglang/srt/managers/
schedule_batch.py`), in this order, first match wins:

1. the budget: `len(output_ids) >= max_new_tokens` is `{"type": "length", "length": max_new_tokens}`, even when the
   last allowed token is eos or a stop token (the sample is then TRUNCATED, not COMPLETED);
2. stop strings, in the request's order, over the decoded tail (special tokens kept): `{"type": "stop",
   "matched": <str>}`; an empty string matches at once;
3. stop tokens (`stop_token_ids`, the model's eos ids, the tokenizer's eos and its extra stop tokens): `{"type":
   "stop", "matched": <id>}`; `ignore_eos` turns this whole check off, `stop_token_ids` included.

`min_new_tokens` takes no part here: it only masks ids in the logits (`logits.py`, SGLang's
`BatchedMinNewTokensPenalizer`: `stop_token_ids`, the tokenizer's eos and extra stop tokens, not the model config's
other eos ids), so a stop string or an unmasked eos id ends a request before its minimum, as on SGLang.

The reply's text is the detokenizer's (`DetokenizerManager.trim_matched_stop`, managers/detokenizer_manager.py): a
matched stop token is left out of the decoded ids, a matched stop string cuts the text before it, or with
`no_stop_trim` right after it (text the last token carried past the stop string is dropped either way); a falsy
`matched` (`""`, id 0) trims nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from slime_rollout.engines.reference.request import GenRequest

__all__ = ["check_finished", "extra_stop_token_ids", "find_stop_string", "reply_text", "trim_stop"]

# Tokens decoded past the longest stop string when checking for stop strings (multi-byte characters may span
# several tokens); SGLang decodes the stop string's token count plus one, which this window covers.
_STOP_TAIL_SLACK = 8
# SGLang's turn-final markers some checkpoints ship without eos metadata (sglang/srt/utils/hf_transformers/common.py
# `attach_additional_stop_token_ids`): stop tokens when the tokenizer's added vocabulary has them.
_EXTRA_STOP_TEXTS = ("<|eom_id|>", "<|content_model_end_sampling|>")


def extra_stop_token_ids(tokenizer: Any) -> set[int]:
    """The ids of SGLang's extra stop tokens in `tokenizer`'s added vocabulary (often none)."""
    added = tokenizer.get_added_vocab()
    return {int(added[text]) for text in _EXTRA_STOP_TEXTS if text in added}


def find_stop_string(text: str, stops: Iterable[str]) -> str | None:
    """The first stop string (in `stops` order) that occurs in `text`, or None ("" occurs in any text)."""
    for s in stops:
        if s in text:
            return s
    return None


def check_finished(r: GenRequest, tokenizer: Any, stop_ids: set[int]) -> dict[str, Any] | None:
    """SGLang's finish reason of `r` right after its last token was appended, or None while it goes on.

    Args:
        r: the request; `r.params.max_new_tokens` is set (the route clips it to the context).
        tokenizer: decodes the output tail for stop strings.
        stop_ids: the model's stop ids besides the request's `stop_token_ids` (eos of the config, the generation
            config and the tokenizer, and `extra_stop_token_ids`).

    Returns:
        `{"type": "length", "length": n}`, `{"type": "stop", "matched": str | int}` or None (module docstring).
    """
    p = r.params
    assert p.max_new_tokens is not None, "routes/generate._fit_budget sets it within the context"
    if len(r.output_ids) >= p.max_new_tokens:
        return {"type": "length", "length": p.max_new_tokens}
    if p.stop:
        tail_tokens = max(len(s) for s in p.stop) + _STOP_TAIL_SLACK
        matched = find_stop_string(tokenizer.decode(r.output_ids[-tail_tokens:]), p.stop)
        if matched is not None:
            return {"type": "stop", "matched": matched}
    token = r.output_ids[-1]
    if not p.ignore_eos and (token in p.stop_token_ids or token in stop_ids):
        return {"type": "stop", "matched": token}
    return None


def trim_stop(text: str, matched: str | int | None, no_stop_trim: bool) -> str:
    """`text` cut at a matched stop string as SGLang's detokenizer cuts it (stop tokens: see `reply_text`).

    Returns:
        `text` before the first occurrence of `matched`, or up to its end with `no_stop_trim`; `text` itself when
        `matched` is not a non-empty string or does not occur.
    """
    if not matched or not isinstance(matched, str):
        return text
    pos = text.find(matched)
    if pos == -1:
        return text
    return text[: pos + len(matched)] if no_stop_trim else text[:pos]


def reply_text(r: GenRequest, tokenizer: Any) -> str:
    """The reply's `text`: the output ids decoded (`skip_special_tokens` as asked), stop trimmed as SGLang's."""
    ids = r.output_ids
    matched = (r.finish_reason or {}).get("matched")
    # A matched stop token (not id 0: SGLang tests `matched` for truth) is dropped unless no_stop_trim.
    if matched and isinstance(matched, int) and not isinstance(matched, bool) and not r.params.no_stop_trim and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=r.params.skip_special_tokens)
    return trim_stop(text, matched, r.params.no_stop_trim)
