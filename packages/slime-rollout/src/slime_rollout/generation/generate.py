"""The default generate function and sampling parameters (original `sglang_rollout.generate`).

One `/generate` call per sample: the prompt ids (or the tokens of a partially generated sample) go
to the engine with `return_logprob`, and the engine's own output ids and log-probs are appended to
the sample (never decoded and re-tokenized). The engine behind the client may be SGLang or the CPU
reference engine; this code does not know which.

A prompt with images (`Sample.multimodal_inputs`) goes through the model's processor first
(`slime_rollout.data.multimodal.prepare_vision_prompt`): the sample holds the prompt ids with every image expanded to
one token per merged patch and the vision tensors for the trainer; the request carries the images as SGLang's
`image_data` and the same ids with each image's run collapsed to one `<|image_pad|>`, which SGLang expands again
(it rejects ids that are already expanded; see `slime_rollout.data.multimodal`). The engine's
`meta_info.prompt_tokens` must equal the expanded prompt length (else the two sides disagree on the image tokens).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slime_core.sample import Sample, Status
from slime_rollout.data.multimodal import VisionPrompt, prepare_vision_prompt, sample_images, vision_token_ids
from slime_rollout.data.prompt_length import engine_context_len
from slime_rollout.data.source import encode_prompt, get_tokenizer
from slime_rollout.engines.pool import answering_engine, note_answering_engine
from slime_rollout.engines.transport import EngineError
from slime_rollout.generation.engine_reply import finish_status, parse_generate_reply
from slime_rollout.generation.routed_experts import ROUTED_EXPERTS_REQUEST, attach_routed_experts, wants_routed_experts
from slime_rollout.generation.top_p_replay import TOP_P_REQUEST, parse_top_p_sets, wants_top_p_sets
from slime_rollout.runtime.goodput import OFFPOLICY_MASKED_KEY

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "abort_all",
    "ask_engine",
    "build_sampling_params",
    "call_client",
    "context_limit",
    "generate",
    "get_client",
    "weight_versions",
]


def context_limit(args: Any, *, evaluation: bool) -> int | None:
    """Tokens a sample's prompt and response may fill together; None without a limit.

    `--eval-max-context-len` for eval samples when set, else `--rollout-max-context-len`, else the engines' context
    (`--sglang-context-length`, else `max_position_embeddings` of `--hf-checkpoint`): SGLang refuses a request whose
    prompt plus `max_new_tokens` exceeds its context with HTTP 400 (sglang 0.5.16 tokenizer_manager.py
    `_validate_one_request`), so a prompt that leaves less room than `--rollout-max-response-len` must ask for less,
    not fail the rollout.
    """
    limit = args.eval_max_context_len if evaluation else None
    limit = args.rollout_max_context_len if limit is None else limit
    return engine_context_len(args.hf_checkpoint, args.sglang_args) if limit is None else limit


def build_sampling_params(
    cfg: SlimeArgs, *, evaluation: bool = False, max_new_tokens: int | None = None
) -> dict[str, Any]:
    """SGLang `sampling_params` from the run config.

    Args:
        cfg: run config; reads `rollout_temperature`, `rollout_top_p`, `rollout_top_k`, `rollout_max_response_len`,
            `rollout_stop`, `rollout_stop_token_ids`, `rollout_skip_special_tokens`; with `evaluation`
            the `eval_*` counterparts override them when set (`eval_min_new_tokens` too).
        evaluation: build eval sampling parameters.
        max_new_tokens: the response budget in tokens when the caller has its own (an `--eval-config` dataset's
            `max_response_len`); None: the flags'.

    Returns:
        `{temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids, skip_special_tokens,
        no_stop_trim=True, spaces_between_special_tokens=False}` (+ `min_new_tokens` for eval; + `custom_params`
        asking for the kept token ids with `--rollout-top-p < 1`, `slime_rollout.generation.top_p_replay`).

    Raises:
        ValueError: no response length budget is configured.
    """

    def pick(eval_value: Any, rollout_value: Any) -> Any:
        return eval_value if evaluation and eval_value is not None else rollout_value

    if max_new_tokens is None:
        max_new_tokens = pick(cfg.eval_max_response_len, cfg.rollout_max_response_len)
    if max_new_tokens is None:
        raise ValueError(
            "--rollout-max-response-len is required" + (" (or --eval-max-response-len)" if evaluation else "")
        )
    params = {
        "temperature": pick(cfg.eval_temperature, cfg.rollout_temperature),
        "top_p": pick(cfg.eval_top_p, cfg.rollout_top_p),
        "top_k": pick(cfg.eval_top_k, cfg.rollout_top_k),
        "max_new_tokens": int(max_new_tokens),
        "stop": cfg.rollout_stop,
        "stop_token_ids": cfg.rollout_stop_token_ids,
        "skip_special_tokens": cfg.rollout_skip_special_tokens,
        # Keep the matched stop token or string in the text, as the returned ids have it (SGLang still drops what the
        # last token carried past a stop string: the text ends with the stop string).
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if evaluation and cfg.eval_min_new_tokens is not None:
        params["min_new_tokens"] = int(cfg.eval_min_new_tokens)
    if wants_top_p_sets(cfg, evaluation=evaluation):
        params["custom_params"] = dict(TOP_P_REQUEST)  # top-p replay: the engine returns the ids it kept
    return params


def get_client(args: SlimeArgs) -> Any:
    """The engine client of this process (`slime_rollout.engines.client.get_client` of the plugin view `args`).

    The rollout reaches the engines only through this function, so tests can stand in a scripted client.
    """
    from slime_rollout.engines.client import get_client as _get_client

    return _get_client(args)


async def call_client(method: Any, *call_args: Any) -> Any:
    """Calls a client method that may be async or blocking (blocking ones run in a worker thread)."""
    if inspect.iscoroutinefunction(method):
        return await method(*call_args)
    result = await asyncio.to_thread(method, *call_args)
    if inspect.isawaitable(result):
        result = await result
    return result


async def abort_all(args: SlimeArgs) -> None:
    """Aborts every in-flight request on every engine and waits until they report idle."""
    client = get_client(args)
    await call_client(client.abort_all)


async def weight_versions(args: SlimeArgs) -> list[str | None]:
    """Every engine's `weight_version` (`RolloutClient.get_weight_versions`: SGLang's GET /model_info)."""
    client = get_client(args)
    return await call_client(client.get_weight_versions)


def _prompt_ids(args: SlimeArgs, sample: Sample) -> list[int]:
    if sample.tokens:
        # A continuation (partial rollout) or prompt ids set by the data source / a custom function.
        return list(sample.tokens)
    # The cache key: prompt (text or messages) and tools, JSON-encoded (messages are unhashable lists of dicts). Keys
    # keep their order: the template writes a tool schema with `tojson` as given (sorted, it rendered another prompt).
    key = json.dumps([sample.prompt, sample.metadata.get("tools")])
    return list(_encode_prompt(args.hf_checkpoint, key))


@functools.lru_cache(maxsize=256)
def _encode_prompt(tokenizer_path: str, key: str) -> tuple[int, ...]:
    # The n samples of a group share one prompt: template + tokenize it once, not n times (this work runs
    # on the rollout's event loop, between engine replies). 256 entries cover the groups in flight.
    prompt, tools = json.loads(key)
    return tuple(encode_prompt(get_tokenizer(tokenizer_path), prompt, tools))


def _vision_prompt(args: SlimeArgs, sample: Sample) -> VisionPrompt | None:
    """Processes the sample's images with its prompt (None for text-only samples) and fills its vision inputs.

    Raises:
        ValueError: the sample's tokens do not start with the processor's prompt ids (a continuation whose
            prompt was built differently).
    """
    images = sample_images(sample)
    if not images:
        return None
    vision = prepare_vision_prompt(args.hf_checkpoint, sample.prompt, images)
    if sample.tokens and tuple(sample.tokens[: len(vision.input_ids)]) != vision.input_ids:
        raise ValueError(
            f"sample {sample.index}: its tokens do not start with the processor's {len(vision.input_ids)} prompt ids "
            "(images expanded); set tokens only through the processor for prompts with images"
        )
    if sample.multimodal_train_inputs is None:
        sample.multimodal_train_inputs = dict(vision.train_inputs)
    return vision


def _engine_ids(args: SlimeArgs, sample: Sample, vision: VisionPrompt) -> list[int] | None:
    """The `/generate` `input_ids` of a sample with images: its tokens with the prompt's image runs collapsed.

    Returns None when the sample cannot be sent: its earlier response holds the image token, which SGLang would
    take for one more image placeholder (and fail the request).
    """
    rest = sample.tokens[len(vision.input_ids) :]
    image_token_id, _ = vision_token_ids(args.hf_checkpoint)
    if image_token_id in rest:
        return None
    return [*vision.engine_input_ids, *rest]


def _check_prompt_tokens(sample: Sample, meta: dict[str, Any], expanded: int) -> None:
    """The engine expanded the images into as many tokens as the trainer will see (SGLang expands them itself)."""
    engine = meta.get("prompt_tokens")
    if engine is not None and int(engine) != expanded:
        raise ValueError(
            f"sample {sample.index}: the engine saw {engine} prompt tokens, the processor made {expanded}: the "
            "engine's image processing differs from --hf-checkpoint's processor (check its preprocessor_config.json)"
        )


def mask_offpolicy_prefix(sample: Sample) -> None:
    """`--mask-offpolicy-in-partial-rollout`: the response a partial sample holds came from an older policy.

    It stays as context, untrained: loss mask 0 and rollout log-probs 0.0 over `sample.response_length` tokens.
    Idempotent; `group_rollout.generate_and_rm` applies it once, before any generate function, as the original does
    (not `generate`, which a custom generate function may call again to continue its own response).
    `metadata["offpolicy_masked_tokens"]` records how many tokens it masked: those tokens were generated (in earlier
    rollouts) but no longer count as trainable, so the goodput accounting (`runtime.goodput`) reads the count there.
    """
    sample.metadata[OFFPOLICY_MASKED_KEY] = sample.response_length
    sample.loss_mask = [0] * sample.response_length
    if sample.rollout_log_probs is not None:
        sample.rollout_log_probs = [0.0] * sample.response_length


async def generate(
    args: SlimeArgs, sample: Sample, sampling_params: dict[str, Any], *, evaluation: bool = False
) -> Sample:
    """Generates (or continues) the response of one sample with one engine call.

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`); reads `hf_checkpoint` (tokenizer),
            `rollout_max_context_len` (`eval_max_context_len` when
            `evaluation`, falling back to the rollout one).
        sample: a fresh sample (prompt only) or a partially generated one (tokens hold prompt + partial
            response); updated in place.
        sampling_params: SGLang sampling params; `max_new_tokens` is reduced by the response length
            already generated and capped so prompt + response fit `context_limit` (`--rollout-max-context-len`,
            `--eval-max-context-len` in eval rollouts, else the model's context).
        evaluation: this sample belongs to an eval rollout.

    Returns:
        The same sample with the engine's token ids and log-probs appended and `status` from the
        engine's finish reason (TRUNCATED without a call when no budget is left); a prompt with images also
        gets `multimodal_train_inputs`.

    Raises:
        ValueError: a malformed engine reply (one without a known finish reason included; it names the engine URL,
            `/generate` and the sample), or an engine that expanded the images differently.
        EngineError: the engine failed or did not answer in time (naming the sample).
    """
    sampling_params = dict(sampling_params)
    vision = _vision_prompt(args, sample)
    if not sample.tokens:
        sample.tokens = list(vision.input_ids) if vision is not None else _prompt_ids(args, sample)
        sample.response_length = 0
    # No --mask-offpolicy-in-partial-rollout here: `group_rollout.generate_and_rm` masks a partial sample once, before
    # any generate function, as the original. Here it also masked the on-policy turns of a custom generate function
    # that continues its sample with this one (a second call in the same rollout).
    sampling_params["max_new_tokens"] = int(sampling_params["max_new_tokens"]) - sample.response_length
    max_context_len = context_limit(args, evaluation=evaluation)
    if max_context_len is not None:
        # Prompt + response must fit the context window (`--rollout-max-context-len` / `--eval-max-context-len`).
        sampling_params["max_new_tokens"] = min(sampling_params["max_new_tokens"], max_context_len - len(sample.tokens))
    if sampling_params["max_new_tokens"] <= 0:
        sample.status = Status.TRUNCATED
        return sample

    payload = {"input_ids": list(sample.tokens), "sampling_params": sampling_params, "return_logprob": True}
    if wants_routed_experts(args):
        payload.update(ROUTED_EXPERTS_REQUEST)
    if vision is not None:
        engine_ids = _engine_ids(args, sample, vision)
        if engine_ids is None:
            logger.warning(
                "sample %s: its response holds the image placeholder token; an engine would take it for an image, "
                "so the sample stops here (TRUNCATED)",
                sample.index,
            )
            sample.status = Status.TRUNCATED
            return sample
        payload["input_ids"] = engine_ids
        payload["image_data"] = list(vision.engine_images)
    reply, tokens, log_probs, meta = await ask_engine(get_client(args), payload, what=f"sample {sample.index}")
    if vision is not None:
        _check_prompt_tokens(sample, meta, len(sample.tokens))
    top_p = parse_top_p_sets(meta, len(tokens))
    sample.append_response_tokens(tokens, log_probs=log_probs, text=reply.get("text"), meta_info=meta, top_p=top_p)
    attach_routed_experts(args, sample, meta)
    return sample


async def ask_engine(
    client: Any, payload: dict[str, Any], *, what: str
) -> tuple[Mapping[str, Any], list[int], list[float], Mapping[str, Any]]:
    """POSTs one `/generate` through the rollout's client and reads the reply, each failure naming engine and sample.

    The pool knows which engine answered but not the sample; the reply is a plain dict that knows neither. An engine
    failure is re-raised naming `what`, a malformed reply names the engine (`answering_engine`) and the endpoint.

    Args:
        client: the rollout's client (`get_client`), or a stand-in with a `generate(payload)` method.
        payload: the `/generate` body.
        what: the call's subject in errors, e.g. "sample 7".

    Returns:
        `(reply, token_ids, log_probs, meta_info)`: the reply as it came, and `parse_generate_reply`'s reading.

    Raises:
        EngineError: the engine failed (HTTP error, unreachable, deadline), naming `what`.
        ValueError: a malformed reply, or one without a known `finish_reason` (`finish_status`).
    """
    note_answering_engine(None)  # a stand-in client sets nothing: no earlier request's engine is named
    try:
        reply = await call_client(client.generate, payload)
    except EngineError as exc:
        raise exc.for_context(what) from exc
    engine = answering_engine()
    tokens, log_probs, meta = parse_generate_reply(reply, what=what, engine=engine)
    finish_status(meta, what=what, engine=engine)
    return reply, tokens, log_probs, meta
