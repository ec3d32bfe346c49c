"""On-policy distillation with a teacher engine (`--use-opd --opd-type sglang`): the teacher scores the student.

A teacher is any server speaking SGLang's `/generate` (SGLang on GPUs; the CPU reference engine,
`python -m slime_rollout.engines.reference --model-path TEACHER`). It scores the student's own sampled tokens:
one request per sample with `max_new_tokens: 0`, `return_logprob: true` and the sample's token ids; the reply's
`meta_info.input_token_logprobs` are the teacher's log-probs of those tokens at `--rollout-temperature` (as the
original scores them, slime #2085). The trainer then subtracts `--opd-kl-coef·(student - teacher)` from the
advantages (`slime_core.algorithms.compute_advantages_and_returns`).

Two ways in, as in `slime_core.config.opd`:

* built in (`score_teacher`, no `--custom-reward-post-process-path`): after the rollout's rewards, every
  scored sample gets `teacher_log_probs` from `--rm-url`; the task reward (`--rm-type` / `--custom-rm-path`)
  stays, or is 0 when none is configured (pure distillation). Only the response span is requested
  (`logprob_start_len` = prompt length - 1), so the teacher computes almost no prompt log-probs.

SGLang's reply has one `input_token_logprobs` entry per position from `logprob_start_len` on, and the entry of
that first position is always `None` (SGLang drops the log-prob computed for it, whatever the start), so the
request starts one position before the response: every response token then has a number.

A sample with images is scored with them, as the original's `reward_func` sends them: the request carries the
images as `image_data` and the ids with each image's run collapsed to one `<|image_pad|>`, as the rollout's own
request (`slime_rollout.generation.generate`). Its log-probs are asked from position 0, as the original asks: the
request's ids are shorter than the expanded ones the teacher scores, and 0 is the one start that names the same
position in both (whichever SGLang counts in; tests/fixtures/sglang-wire records no image request with a start).
* the original's plugins, for unchanged launch scripts: `--custom-rm-path
  slime.rollout.on_policy_distillation.reward_func` (the teacher reply as the "reward") and
  `--custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards` (teacher
  log-probs from the reply, rewards 0), mapped onto `reward_func` / `post_process_rewards` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import numbers
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.config.opd import builtin_teacher_scoring
from slime_core.error_text import preview
from slime_core.sample import Sample, Status
from slime_rollout.data.multimodal import prepare_vision_prompt, sample_images, vision_token_ids
from slime_rollout.data.tokenizer import get_tokenizer
from slime_rollout.engines.transport import EngineError, HttpEndpoint
from slime_rollout.generation.engine_reply import checked_token_id

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "check_teacher_vocabulary",
    "post_process_rewards",
    "reward_func",
    "score_teacher",
    "teacher_log_probs_from_reply",
    "teacher_payload",
]

_CONCURRENCY = 256  # scoring requests in flight per rollout
_endpoints: dict[str, tuple[HttpEndpoint, str]] = {}
# Teachers (`--rm-url`) whose token texts were compared with the student's tokenizer (`check_teacher_vocabulary`).
_vocabulary_checked: set[str] = set()


def _endpoint(url: str) -> tuple[HttpEndpoint, str]:
    """One retrying HTTP endpoint per `--rm-url` (`http://host:port/generate` → base URL and route)."""
    if url not in _endpoints:
        parts = urllib.parse.urlsplit(url)  # an http(s) URL with a host: checked when the config is read
        base = f"{parts.scheme}://{parts.netloc}"
        _endpoints[url] = (HttpEndpoint(base), parts.path or "/generate")
    return _endpoints[url]


def teacher_payload(args: SlimeArgs, sample: Sample, *, logprob_start_len: int) -> dict[str, Any]:
    """The `/generate` request that scores `sample.tokens` (no new tokens, input log-probs from a position).

    A sample with images (`Sample.multimodal_inputs`) is sent as the rollout sends it: its ids with each image's run
    collapsed to one image token, its images as `image_data`, and `logprob_start_len` 0 whatever was asked (the
    teacher expands the images again: only position 0 is the same position in both id lists); read the start back
    from the payload.

    Args:
        args: reads `rollout_temperature`, `hf_checkpoint` (the processor of a sample with images).
        sample: the student's sample (prompt + response ids).
        logprob_start_len: first position whose log-prob is returned (0: all; prompt length: the response).

    Raises:
        ValueError: a sample with images whose tokens do not start with the processor's prompt, or whose response
            holds the image token (the teacher would take it for one more image and fail the request).
    """
    input_ids = list(sample.tokens)
    images = sample_images(sample)
    payload: dict[str, Any] = {}
    if images:
        input_ids, payload["image_data"] = _vision_request(args, sample, images)
        logprob_start_len = 0
    payload |= {
        "input_ids": input_ids,
        "sampling_params": {"temperature": args.rollout_temperature, "max_new_tokens": 0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": logprob_start_len,
    }
    return payload


def _vision_request(args: SlimeArgs, sample: Sample, images: list[str]) -> tuple[list[int], list[str]]:
    """The `/generate` ids (image runs collapsed) and `image_data` of a sample with images."""
    vision = prepare_vision_prompt(args.hf_checkpoint, sample.prompt, images)
    prompt = tuple(sample.tokens[: len(vision.input_ids)])
    if prompt != vision.input_ids:
        raise ValueError(
            f"sample {sample.index}: its tokens do not start with the processor's {len(vision.input_ids)} prompt ids "
            "(images expanded), so the teacher cannot be sent its images"
        )
    rest = list(sample.tokens[len(vision.input_ids) :])
    image_token_id, _ = vision_token_ids(args.hf_checkpoint)
    if image_token_id in rest:
        raise ValueError(
            f"sample {sample.index}: its response holds the image placeholder token {image_token_id}; the OPD teacher "
            "would take it for one more image and refuse the request"
        )
    return [*vision.engine_input_ids, *rest], list(vision.engine_images)


def teacher_log_probs_from_reply(reply: dict[str, Any], sample: Sample, *, logprob_start_len: int) -> list[float]:
    """The teacher's log-probs of the response tokens from a `/generate` reply.

    Args:
        reply: the engine's JSON reply (`meta_info.input_token_logprobs`: `[[logprob, token_id, ...], ...]` for
            positions `logprob_start_len..`; SGLang's entry of position `logprob_start_len` is always None).
        sample: the scored sample.
        logprob_start_len: what the request asked for.

    Returns:
        `[response_length]` floats.

    Raises:
        ValueError: the reply is no JSON object (a wrong `--rm-url`), the teacher aborted the request, the reply has
            no input log-probs, another count of them than the sample's tokens from `logprob_start_len` (a sample
            with images: not more than its response, since the teacher expands the images its own way), an entry
            that is no `[logprob, token_id, ...]`, scores other tokens than the response, has no number (None) for a
            response token (`logprob_start_len` not before the response) or a NaN/infinite one.
    """
    if not isinstance(reply, dict):
        # `HttpEndpoint` gives a non-JSON body as text: a --rm-url that names a web page or another service.
        raise ValueError(
            f"sample {sample.index}: the teacher's reply is {type(reply).__name__} {preview(str(reply), 60)}, not "
            "SGLang's /generate JSON object: is --rm-url the teacher engine's http://host:port/generate?"
        )
    meta = reply.get("meta_info") or {}
    if not isinstance(meta, Mapping):
        raise ValueError(f"sample {sample.index}: the teacher's meta_info is {preview(meta, 60)}, not an object")
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        # SGLang answers an aborted request normally (HTTP 200), with no log-probs at all when it was still queued
        # ("Abort in waiting queue", tokenizer_manager.py _handle_abort_req): say so, not "0 log-probs".
        raise ValueError(
            f"sample {sample.index}: the teacher aborted the scoring request ({finish.get('message')!r}): was the "
            "teacher engine paused, restarted or given abort_request?"
        )
    entries = meta.get("input_token_logprobs")
    if entries is None:
        raise ValueError(
            f"sample {sample.index}: the teacher's reply has no meta_info.input_token_logprobs (its keys: "
            f"{sorted(reply)}; meta_info: {sorted(meta)}): is --rm-url the teacher engine's /generate, and does it "
            "return log-probs (return_logprob)?"
        )
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, Sequence):
        raise ValueError(
            f"sample {sample.index}: the teacher's meta_info.input_token_logprobs is {preview(entries, 60)}, not a "
            "list of [logprob, token_id, text]"
        )
    n = sample.response_length
    tail = list(entries)[len(entries) - n :] if n else []
    if sample.multimodal_inputs and sample.multimodal_inputs.get("images"):
        # The teacher expands the images with its own image processor (another patch size or pixel budget gives
        # another count), so only the response, the reply's tail, lines up; as the original reads it. Entry 0 is
        # SGLang's None of the first prompt token.
        fits = len(entries) > n
    else:
        fits = logprob_start_len + len(entries) == len(sample.tokens)
    if len(entries) < n or not fits:
        raise ValueError(
            f"sample {sample.index}: the teacher returned {len(entries)} input log-probs from position "
            f"{logprob_start_len} for {len(sample.tokens)} tokens ({n} response tokens)"
        )
    malformed = [i for i, e in enumerate(tail) if not (isinstance(e, (list, tuple)) and len(e) >= 2)]
    if malformed:
        i = malformed[0]
        raise ValueError(
            f"sample {sample.index}: the teacher's input_token_logprobs entry of response token {i} is {tail[i]!r}, "
            "not SGLang's [logprob, token_id, text]"
        )
    at = f"sample {sample.index}: the teacher's input_token_logprobs entry of response token"
    ids = [checked_token_id(e[1], f"{at} {i}") for i, e in enumerate(tail)]
    # SGLang reports id 0 for an input id >= its vocab size - 1 (it clips what it could not detokenize:
    # scheduler_components/logprob_result_processor.py); a random or untrained policy samples such ids.
    wrong = [i for i, (got, sent) in enumerate(zip(ids, sample.response_tokens, strict=True)) if got not in (sent, 0)]
    if wrong:
        i = wrong[0]
        raise ValueError(
            f"sample {sample.index}: the teacher scored other tokens than the response ({len(wrong)} of {n}; first at "
            f"response position {i}: teacher {ids[i]}, response {sample.response_tokens[i]})"
        )
    missing = [i for i, e in enumerate(tail) if e[0] is None]
    if missing:
        raise ValueError(
            f"sample {sample.index}: the teacher's log-prob of response token {missing[0]} is None (SGLang returns "
            f"None for position logprob_start_len={logprob_start_len}; request from before the response)"
        )
    # Not `float(e[0])`: a text "-0.5" was read as a number, and "x" was a bare ValueError naming no sample.
    texts = [i for i, e in enumerate(tail) if isinstance(e[0], bool) or not isinstance(e[0], numbers.Real)]
    if texts:
        raise ValueError(f"{at} {texts[0]} has log-prob {preview(tail[texts[0]][0], 30)}, not a number")
    values = [float(e[0]) for e in tail]
    # A NaN or -inf log-prob would make every advantage of the batch NaN after whitening: refuse it here.
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise ValueError(
            f"sample {sample.index}: the teacher's log-prob of response token {bad[0]} is {values[bad[0]]} "
            f"({len(bad)} of {n} not finite; a teacher in fp16 overflowing, or a token the teacher masks out)"
        )
    return values


def check_teacher_vocabulary(reply: dict[str, Any], sample: Sample, *, rm_url: str, hf_checkpoint: str) -> bool | None:
    """Whether the teacher decodes the response's ids as the student's tokenizer does; raises where it does not.

    The teacher engine scores the student's token ids: one of another vocabulary (even of the same size) scores
    each id as some other token, and the run trains on nonsense. The teacher is only a URL here, so its tokenizer
    is compared through its reply: asked with SGLang's `return_text_in_logprobs`, each entry carries the token's
    text decoded alone, compared with `--hf-checkpoint`'s decoding of the same id (ids SGLang clipped to 0 are
    skipped). More than half of them differing is another vocabulary (one tokenizer gives none).

    Args:
        reply: the teacher's `/generate` reply (`meta_info.input_token_logprobs` entries `[logprob, id, text]`).
        sample: the scored sample.
        rm_url: the teacher's URL, named in the error.
        hf_checkpoint: the student's tokenizer path.

    Returns:
        True when compared; False when the reply has no token texts (a server that ignores the field); None when it
        has texts but no response token to compare (an empty response, or only ids SGLang clipped to 0).

    Raises:
        ValueError: naming both, the sample and the first token decoded differently.
    """
    entries = list((reply.get("meta_info") or {}).get("input_token_logprobs") or [])
    n = sample.response_length
    tail = entries[len(entries) - n :] if n else []
    pairs = [
        (int(e[1]), e[2])
        for e in tail
        if isinstance(e, (list, tuple)) and len(e) >= 3 and isinstance(e[2], str) and e[1] not in (0, None)
    ]
    if not pairs:
        texts = any(isinstance(e, (list, tuple)) and len(e) >= 3 and isinstance(e[2], str) for e in entries)
        return None if texts else False
    tokenizer = get_tokenizer(hf_checkpoint)
    decoded = [(i, text, tokenizer.decode([i])) for i, text in pairs]
    differ = [(i, text, ours) for i, text, ours in decoded if ours != text]
    if 2 * len(differ) > len(pairs):
        token, teacher, student = differ[0]
        raise ValueError(
            f"the OPD teacher at --rm-url {rm_url} does not share the student's tokenizer (--hf-checkpoint "
            f"{hf_checkpoint}): it decodes {len(differ)} of {len(pairs)} response tokens of sample {sample.index} "
            f"otherwise (id {token}: teacher {preview(teacher, 30)}, student {preview(student, 30)}); the teacher "
            "scores the student's token ids, so it must serve a model of the same vocabulary"
        )
    return True


async def _ask_teacher(args: SlimeArgs, sample: Sample, payload: dict[str, Any]) -> dict[str, Any]:
    """POSTs one scoring request to `--rm-url`; a failure names the teacher and the sample.

    Raises:
        EngineError: the teacher's HTTP error or unreachability (after `HttpEndpoint`'s bounded retries), saying it
            is the OPD teacher: the run's own engines and the `--use-fault-tolerance` advice are not about it.
    """
    endpoint, route = _endpoint(args.rm_url)
    try:
        # --rm-timeout-secs bounds the read, as it bounds any remote reward: a stalled teacher fails the rollout.
        return await endpoint.request("POST", route, payload, timeout=args.rm_timeout_secs)
    except EngineError as exc:
        raise EngineError(
            exc.url, exc.endpoint,
            f"the OPD teacher (--rm-url) did not score sample {sample.index}: {exc.message} (slime does not start "
            "this engine, so --use-fault-tolerance does not restart it)",
            exc.status_code, unreachable=exc.unreachable,
        ) from exc  # fmt: skip


async def _score_one(args: SlimeArgs, sample: Sample, semaphore: asyncio.Semaphore) -> None:
    # One position before the response: SGLang's entry at logprob_start_len itself is always None.
    payload = teacher_payload(args, sample, logprob_start_len=max(sample.prompt_length - 1, 0))
    payload = _with_texts_until_checked(args, payload)
    async with semaphore:
        reply = await _ask_teacher(args, sample, payload)
    start = payload["logprob_start_len"]  # 0 for a sample with images
    with _naming_teacher(args):
        sample.teacher_log_probs = teacher_log_probs_from_reply(reply, sample, logprob_start_len=start)
    _check_vocabulary_once(args, payload, reply, sample)


@contextlib.contextmanager
def _naming_teacher(args: SlimeArgs) -> Iterator[None]:
    """A malformed teacher reply's ValueError names the teacher's URL and route (it named only the sample)."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"OPD teacher --rm-url {args.rm_url}: {exc}") from exc


def _with_texts_until_checked(args: SlimeArgs, payload: dict[str, Any]) -> dict[str, Any]:
    """Asks for token texts (`return_text_in_logprobs`) until the teacher's vocabulary was compared once."""
    if args.hf_checkpoint and args.rm_url not in _vocabulary_checked:
        payload["return_text_in_logprobs"] = True
    return payload


def _check_vocabulary_once(args: SlimeArgs, payload: dict[str, Any], reply: dict[str, Any], sample: Sample) -> None:
    """`check_teacher_vocabulary` on the first reply that carries texts; warns once when the teacher sends none."""
    if not payload.get("return_text_in_logprobs") or args.rm_url in _vocabulary_checked:
        return
    compared = check_teacher_vocabulary(reply, sample, rm_url=args.rm_url, hf_checkpoint=args.hf_checkpoint)
    if compared is None:
        return  # nothing to compare in this reply (an empty response): the next one is asked for texts again
    if not compared:
        logger.warning(
            "the OPD teacher at --rm-url %s returned no token texts (return_text_in_logprobs): whether it shares the "
            "student's tokenizer (--hf-checkpoint %s) is not checked",
            args.rm_url,
            args.hf_checkpoint,
        )
    _vocabulary_checked.add(args.rm_url)


async def score_teacher(args: SlimeArgs, samples: Sequence[Sample]) -> int:
    """Built-in teacher scoring: sets `teacher_log_probs` on every finished sample that has none.

    A no-op unless `--use-opd --opd-type sglang` without a reward post-process function
    (`slime_core.config.opd.builtin_teacher_scoring`). Aborted samples are skipped (they do not train).

    Args:
        args: reads `use_opd`, `opd_type`, `custom_reward_post_process_path`, `rm_url`, `rollout_temperature`.
        samples: the rollout's samples.

    Returns:
        The number of samples scored.

    Raises:
        slime_rollout.engines.transport.EngineError: the teacher failed or is unreachable (naming it and the sample).
        ValueError: a reply that does not fit its sample.
    """
    if not builtin_teacher_scoring(args):
        return 0
    todo = [s for s in samples if s.teacher_log_probs is None and s.status is not Status.ABORTED]
    semaphore = asyncio.Semaphore(_CONCURRENCY)
    await asyncio.gather(*(_score_one(args, s, semaphore) for s in todo))
    return len(todo)


async def reward_func(
    args: SlimeArgs, sample: Sample | list[Sample], **kwargs: Any
) -> dict[str, Any] | list[dict[str, Any]]:
    """The original's `slime.rollout.on_policy_distillation.reward_func`: the teacher's reply as the "reward".

    POSTs the sample's full token ids (and its images, as `teacher_payload` sends them) to `--rm-url` with
    `logprob_start_len: 0`. The sample's `teacher_log_probs` are set from the reply here already, and its logged raw
    reward is 0 (`metadata["raw_reward"]`: the reply is no score); `post_process_rewards` (or the user's own) reads
    the reply as the original's does. A list of samples (`--group-rm`, or a fan-out generate function's samples,
    which a custom reward gets in one call) gets one reply per sample, scored concurrently (the original's function
    takes one sample only).
    """
    if isinstance(sample, list):
        return list(await asyncio.gather(*(reward_func(args, s, **kwargs) for s in sample)))
    payload = _with_texts_until_checked(args, teacher_payload(args, sample, logprob_start_len=0))
    reply = await _ask_teacher(args, sample, payload)
    with _naming_teacher(args):
        sample.teacher_log_probs = teacher_log_probs_from_reply(reply, sample, logprob_start_len=0)
    _check_vocabulary_once(args, payload, reply, sample)
    sample.metadata["raw_reward"] = 0.0
    return reply


def post_process_rewards(args: SlimeArgs, samples: list[Sample], **kwargs: Any) -> tuple[list[float], list[float]]:
    """The original's `slime.rollout.on_policy_distillation.post_process_rewards` (pure distillation).

    Sets each sample's `teacher_log_probs` from its reward (the teacher's reply) and returns zero rewards: the
    learning signal is the OPD term alone.

    Returns:
        `(raw_rewards, rewards)`, both N zeros.

    Raises:
        ValueError: a sample whose reward is not a teacher reply.
    """
    for sample in samples:
        if not isinstance(sample.reward, dict):
            raise ValueError(
                f"sample {sample.index}: reward {sample.reward!r} is not a teacher reply; use --custom-rm-path "
                "slime.rollout.on_policy_distillation.reward_func with this post-process function"
            )
        sample.teacher_log_probs = teacher_log_probs_from_reply(sample.reward, sample, logprob_start_len=0)
    zeros = [0.0] * len(samples)
    return zeros, list(zeros)
