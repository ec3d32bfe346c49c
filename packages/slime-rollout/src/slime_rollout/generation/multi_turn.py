r"""Generic multi-turn tool-calling generate function driving any `slime_core.protocols.Env`.

Use it as `--custom-generate-function-path slime_rollout.generation.multi_turn.generate` with `--env-path NAME`
(a `slime-envs` name such as `search`, `python`, `calculator`, an entry point of the `slime.envs`
group, or `module:Factory`), or per sample with `metadata["env"]`. Env options come from the
`env_kwargs` key of the `--custom-config-path` YAML, updated by `metadata["env_kwargs"]`.

One episode, up to `--max-turns` model turns::

    tokens = prompt ids | model turn 1 | observation 1 | model turn 2 | ... | model turn n
    loss_mask          =  1 ... 1      |  0 ... 0      |  1 ... 1     | ... |  1 ... 1
    rollout_log_probs  =  engine lps   |  0.0 ...      |  engine lps  | ... |  engine lps

* Model turns are the engine's own token ids and log-probs (never decoded and re-tokenized); the
  decoded text is only shown to the environment.
* Observations are tokenized once. Chat-template tools (`EnvStep.tool_responses`) are rendered as
  `tool` messages by the tokenizer's own chat template, e.g. for Qwen3
  `\n<|im_start|>user\n<tool_response>\n...\n</tool_response><|im_end|>\n<|im_start|>assistant\n`
  after a turn that ended with `<|im_end|>` (the end-of-turn marker is prepended when the turn was
  cut by a stop string); tag-style environments (Search-R1) give the observation text verbatim.
* The response-length budget (`max_new_tokens`, capped by `--rollout-max-context-len` less the prompt) is shared
  by all turns and observations; when it runs out the sample is TRUNCATED (an observation longer than what is
  left is cut, and only a prefix of it tokenized). An aborted engine request makes the sample ABORTED (partial
  output kept).
* What the env's `step` returns is checked (`checked_env_step`): another type fails the rollout naming the env,
  the sample and the field; an exception it raises fails the sample only.
* `check_chat_template_consistency` compares the incremental token stream with the chat template's
  rendering of the final conversation, the most common multi-turn tokenization bug. Each sample records
  its conversation (`template_check.CONVERSATION_KEY`) so that the run checks its first samples.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.error_text import preview
from slime_core.protocols import Env, EnvStep
from slime_core.sample import Sample, Status
from slime_rollout.data.source import get_tokenizer
from slime_rollout.generation import generate as single_turn
from slime_rollout.generation.episode_env import build_env, checked_env_step, encodable, env_factory, env_name
from slime_rollout.generation.routed_experts import ROUTED_EXPERTS_REQUEST, attach_routed_experts, wants_routed_experts
from slime_rollout.generation.seeds import continuation_seed
from slime_rollout.generation.template_check import (
    CONVERSATION_KEY,
    ConsistencyReport,
    check_chat_template_consistency,
    end_of_turn,
    record_segment,
    render_continuation,
    render_messages,
)
from slime_rollout.generation.top_p_replay import parse_top_p_sets
from slime_rollout.runtime.deadlines import DeadlineExceeded, call_plugin_with_deadline, plugin_bounds

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "ConsistencyReport",
    "build_env",
    "check_chat_template_consistency",
    "checked_env_step",
    "end_of_turn",
    "env_factory",
    "env_reward",
    "generate",
    "render_tool_observation",
]

logger = logging.getLogger(__name__)


# ---- chat template helpers ------------------------------------------------------------------------


def render_tool_observation(
    tokenizer: Any,
    tool_responses: Sequence[str],
    *,
    model_turn: str,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text between an assistant turn and the next assistant turn, as the chat template renders it.

    `slime_rollout.generation.template_check.render_continuation` of one tool message per response: the wrapper (end of
    turn, tool role header, grouping of consecutive tool messages, next assistant header) is exactly the template's.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tool_responses: contents of the tool messages, in call order.
        model_turn: decoded text of the model turn just generated; if it already ends with the
            end-of-turn marker (the model emitted `<|im_end|>`), the marker is not repeated.
        template_kwargs: `--apply-chat-template-kwargs` when `--apply-chat-template` rendered the prompt.

    Returns:
        The observation text (to be tokenized and appended as non-trainable tokens).

    Raises:
        ValueError: the chat template does not echo assistant content verbatim (cannot locate the sentinel).
    """
    tool_messages = [{"role": "tool", "content": r} for r in tool_responses]
    return render_continuation(tokenizer, tool_messages, model_turn=model_turn, template_kwargs=template_kwargs)


# ---- generation ------------------------------------------------------------------------------------


def _prompt_ids(tokenizer: Any, sample: Sample, env: Env) -> list[int]:
    if (sample.multimodal_inputs or {}).get("images"):
        # Tokenizing the text alone would leave the image placeholders unexpanded and send no image_data.
        raise ValueError(
            f"sample {sample.index}: multi-turn generate does not send images yet; prompts with --multimodal-keys "
            "images use the default generate"
        )
    prompt = sample.prompt
    if not isinstance(prompt, str):
        tools = sample.metadata.get("tools") or getattr(env, "tool_specs", None) or None
        prompt = render_messages(tokenizer, list(prompt), add_generation_prompt=True, tools=tools)
    return tokenizer.encode(prompt, add_special_tokens=False)


def _reset_response(sample: Sample) -> None:
    del sample.tokens[sample.prompt_length :]
    sample.response_length = 0
    sample.response = ""
    sample.loss_mask = None
    sample.rollout_log_probs = None
    sample.rollout_top_p_token_ids = sample.rollout_top_p_token_offsets = None
    sample.status = Status.PENDING
    sample.weight_versions.clear()
    sample.metadata.pop(CONVERSATION_KEY, None)
    # The aborted attempt's env outcome: kept, its reward became the restarted episode's when that one gave none.
    if sample.metadata.pop("env_reward", None) is not None:
        sample.reward = None
    for key in ("num_turns", "env_info", "env_error", "max_turns_reached"):
        sample.metadata.pop(key, None)


def _observation_text(tokenizer: Any, step: EnvStep, model_turn: str, template_kwargs: Mapping[str, Any] | None) -> str:
    if step.tool_responses is not None:
        return render_tool_observation(
            tokenizer, step.tool_responses, model_turn=model_turn, template_kwargs=template_kwargs
        )
    return step.observation


async def _model_turn(
    client: Any, tokenizer: Any, sample: Sample, params: dict[str, Any], budget: int, args: Any = None
) -> tuple[str, str]:
    """Generates one model turn into `sample`; returns (engine text, text decoded from the engine ids).

    `args` (the run config) decides whether the engine's MoE routes are asked for and kept (`routed_experts.py`).
    """
    params = dict(params, max_new_tokens=budget - sample.response_length)
    if params.get("sampling_seed") is not None:
        # Each turn of the sample draws from its own seed (same turns, same seeds: reproducible).
        params["sampling_seed"] = continuation_seed(int(params["sampling_seed"]), sample.response_length)
    payload = {"input_ids": list(sample.tokens), "sampling_params": params, "return_logprob": True}
    if wants_routed_experts(args):
        payload.update(ROUTED_EXPERTS_REQUEST)
    reply, tokens, log_probs, meta = await single_turn.ask_engine(client, payload, what=f"sample {sample.index}")
    # Decoded from the ids, special tokens kept, whatever `skip_special_tokens` the engine used: this is
    # what tells whether the turn ended with the template's end-of-turn token.
    token_text = tokenizer.decode(tokens)
    text = reply.get("text")
    if text is None:
        text = token_text
    top_p = parse_top_p_sets(meta, len(tokens))  # top-p replay sets, when the engine returned them
    # The status comes from the reply's finish reason (`ask_engine` refused a reply without a known one).
    sample.append_response_tokens(tokens, log_probs=log_probs, text=text, meta_info=meta, top_p=top_p)
    attach_routed_experts(args, sample, meta)
    return text, token_text


async def _env_step(args: SlimeArgs, env: Env, sample: Sample, text: str) -> EnvStep | None:
    """Steps the env under `--plugin-timeout-secs`; an exception fails the sample (FAILED, removed), returns None.

    Raises:
        DeadlineExceeded: the step ran past `--plugin-timeout-secs` (names the env and the sample). A step that
            hangs is a broken tool service, not a bad answer: it fails the rollout rather than every sample quietly.
    """
    start = time.monotonic()
    what = f"env {env_name(args, sample)!r} step for sample {sample.index}"
    try:
        step = await call_plugin_with_deadline(env.step, text, what=what, **plugin_bounds(args))
    except DeadlineExceeded:
        raise
    except Exception as e:  # a broken env fails this sample, not the whole rollout
        logger.warning("sample %s: env step failed: %r", sample.index, e)
        sample.status = Status.FAILED
        sample.remove_sample = True  # keep the group's shape, train on none of it
        sample.metadata["env_error"] = f"{type(e).__name__}: {e}"
        return None
    finally:
        sample.non_generation_time += time.monotonic() - start
    return encodable(checked_env_step(step, what), what)


def _stop_strings(value: Any, what: str) -> list[str]:
    """Stop strings as a list: None, one str (SGLang takes one so) or a list of str.

    A str was spread into its characters (an eval dataset's `stop: "</answer>"`, an env's `stop = "</search>"`): every
    turn ended at its first "<" or "a".

    Raises:
        TypeError: anything else, naming `what`.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(s, str) for s in value):
        return list(value)
    raise TypeError(f"{what} is {type(value).__name__} {preview(value)}, not a stop string or a list of them")


_num_cut_at_max_turns = 0  # episodes of this process that ended at --max-turns with the env waiting (for the log)


def _note_cut_at_max_turns(sample: Sample, max_turns: int) -> None:
    """Marks an episode whose env still waited for a turn at `--max-turns`, and counts it in the log.

    `metadata["max_turns_reached"]` is set; the log line comes at the first and at each power of two. The last tool
    result is never shown to the model: with the flag's default of 1, every episode of an env ran one turn and no tool
    result reached the model, without a word.
    """
    global _num_cut_at_max_turns
    _num_cut_at_max_turns += 1
    sample.metadata["max_turns_reached"] = True
    if _num_cut_at_max_turns & (_num_cut_at_max_turns - 1) == 0:
        logger.warning(
            "%d multi-turn episode(s) so far reached --max-turns %d while the env still waited for the model (its last "
            "tool result was not shown; the sample's metadata['max_turns_reached'] is set); raise --max-turns if "
            "episodes need more turns",
            _num_cut_at_max_turns,
            max_turns,
        )


_num_text_prompts_without_env_tools = 0  # episodes whose text prompt could not carry the env's tool_specs (for the log)


def _note_env_tools_not_in_prompt(args: SlimeArgs, sample: Sample, env: Env) -> None:
    """Logs (at the first and at each power of two) an episode whose env has `tool_specs` the prompt cannot show.

    A text prompt is tokenized as it is: the env's specs reach the chat template only with a chat-message prompt or
    the row's `--tool-key` column (`--apply-chat-template` renders that one). `--apply-chat-template --env-path python`
    without a tools column gave the model a prompt that named no tool, and said nothing.
    """
    global _num_text_prompts_without_env_tools
    _num_text_prompts_without_env_tools += 1
    if _num_text_prompts_without_env_tools & (_num_text_prompts_without_env_tools - 1) == 0:
        names = [spec.get("function", {}).get("name") for spec in env.tool_specs if isinstance(spec, Mapping)]
        logger.warning(
            "%d multi-turn episode(s) so far (sample %s) had a text prompt without the tools of env %r, %s (the "
            "row has no --tool-key %r tools; --apply-chat-template renders only those): unless the prompt text "
            "describes the tools itself, give the rows a tools column or chat-message prompts",
            _num_text_prompts_without_env_tools,
            sample.index,
            env_name(args, sample),
            names,
            args.tool_key,
        )


def _encode_within(tokenizer: Any, text: str, room: int) -> list[int]:
    """The ids of `text`, or, when they surely number `room` or more, the ids of a prefix of it that does.

    Tokenizing runs on the rollout loop at about 1 s per MB: a tool that printed 10 MB held every episode 16 s,
    only to keep the first `room` ids. A prefix of `8 * room` characters (doubled until its ids reach `room`) is
    tokenized instead; text that fits is tokenized whole, as before.
    """
    chars = 8 * max(room, 1)
    while chars < len(text):
        ids = tokenizer.encode(text[:chars], add_special_tokens=False)
        if len(ids) > room:  # more than fits: the tokens past the cut are never used
            return ids
        chars *= 2
    return tokenizer.encode(text, add_special_tokens=False)


def _append_observation(tokenizer: Any, sample: Sample, text: str, budget: int) -> bool:
    """Appends the observation as masked tokens; False (sample TRUNCATED) when it uses up the budget."""
    room = budget - sample.response_length
    obs_ids = _encode_within(tokenizer, text, room)
    if len(obs_ids) >= room:
        # No room left for another model token after it: keep what fits and stop.
        obs_ids = obs_ids[:room]
        sample.append_response_tokens(obs_ids, trainable=False, text=tokenizer.decode(obs_ids))
        sample.status = Status.TRUNCATED
        sample.metadata[CONVERSATION_KEY]["cut"] = True  # the conversation no longer renders as recorded
        return False
    sample.append_response_tokens(obs_ids, trainable=False, text=text)
    return True


async def generate(
    args: SlimeArgs, sample: Sample, sampling_params: dict[str, Any], *, evaluation: bool = False
) -> Sample:
    """Runs one multi-turn episode against the sample's environment.

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`); reads `hf_checkpoint` (tokenizer), `max_turns`,
            `env_path`, `custom_config["env_kwargs"]`, `custom_rm_path`, `rm_type`, and the engine addresses
            (`slime_rollout.generation.generate.get_client`).
        sample: a fresh sample (prompt text or chat messages; `metadata` from `--metadata-key`, tools
            under `metadata["tools"]` from `--tool-key`); filled in place.
        sampling_params: SGLang sampling params; `max_new_tokens` is the budget of the whole response
            (all turns and observations), capped so that prompt + response fit `--rollout-max-context-len`
            (`--eval-max-context-len` in eval rollouts), as the single-turn generate does; the env's `stop`
            strings are added and `no_stop_trim` is set.
        evaluation: this sample belongs to an eval rollout.

    Returns:
        The sample with model turns (trainable, engine log-probs) and observations (masked, 0.0)
        appended; `metadata["env_reward"]`, `["num_turns"]`, `["env_info"]`, and `["max_turns_reached"]` (True)
        when the last turn's env step was not done (its observation is not appended; counted in the log). An
        exception raised by the env's `step` marks the sample FAILED with `remove_sample` (`metadata["env_error"]`).
        If the env gave a reward and no `--custom-rm-path`/`--rm-type` is set, `sample.reward` is that reward.

    Raises:
        ValueError: no environment configured, a malformed engine reply, or a non-finite env reward.
        TypeError: the env's `step` returned something other than an `EnvStep` of the documented field types
            (`checked_env_step`).
        DeadlineExceeded: the env's construction, `reset` or `step` ran past `--plugin-timeout-secs`.

    A sample that already holds a partial response (an aborted episode from the partial-rollout
    buffer) is restarted from its prompt: the environment's state cannot be resumed.
    """
    if sample.response_length > 0:
        # A partial episode (aborted, back from the partial-rollout buffer): the env state is gone, so the
        # episode restarts from the prompt.
        logger.debug("sample %s: restarting a partial multi-turn episode from its prompt", sample.index)
        _reset_response(sample)
    tokenizer = get_tokenizer(args.hf_checkpoint)
    env = await build_env(args, sample)
    if not sample.tokens:
        sample.tokens = _prompt_ids(tokenizer, sample, env)
    if isinstance(sample.prompt, str) and getattr(env, "tool_specs", None) and not sample.metadata.get("tools"):
        _note_env_tools_not_in_prompt(args, sample, env)
    # The conversation as appended, for the chat-template conformance check (slime_rollout.generation.template_check).
    tools = sample.metadata.get("tools") or getattr(env, "tool_specs", None) or None
    sample.metadata[CONVERSATION_KEY] = {"tools": tools, "segments": []}
    budget = int(sampling_params["max_new_tokens"])
    max_context_len = single_turn.context_limit(args, evaluation=evaluation)
    if max_context_len is not None:
        # Prompt + every turn and observation must fit the context window; none left: TRUNCATED, no engine call.
        budget = min(budget, max_context_len - sample.prompt_length)
    params = dict(sampling_params)
    stop = _stop_strings(params.get("stop"), "sampling_params['stop']")
    stop += [
        s for s in _stop_strings(getattr(env, "stop", None), f"env {env_name(args, sample)!r}.stop") if s not in stop
    ]
    params["stop"] = stop or None
    params["no_stop_trim"] = True  # the stop tag must stay in the output so ids and text agree
    client = single_turn.get_client(args)
    # The prompt's template variables (the data source rendered it with them): each turn's header follows them too.
    template_kwargs = dict(args.apply_chat_template_kwargs or {}) if args.apply_chat_template else None

    env_reward: float | None = None
    infos: list[dict[str, Any]] = []
    num_turns = 0
    max_turns = args.max_turns
    for turn in range(max_turns):
        if budget - sample.response_length <= 0:
            sample.status = Status.TRUNCATED
            break
        text, token_text = await _model_turn(client, tokenizer, sample, params, budget, args)
        record_segment(sample, "assistant", token_text)
        num_turns += 1
        if sample.status in (Status.ABORTED, Status.TRUNCATED):
            break  # aborted, or the turn used up the rest of the shared budget
        step = await _env_step(args, env, sample, text)
        if step is None:
            break
        infos.append(dict(step.info))
        if step.reward is not None:
            env_reward = step.reward
        if step.done:
            break
        if turn == max_turns - 1:
            # No turn left to read an observation: the response ends on the model's tokens.
            _note_cut_at_max_turns(sample, max_turns)
            break
        observation = _observation_text(tokenizer, step, token_text, template_kwargs)
        record_segment(sample, "observation", observation, tool_responses=step.tool_responses)
        if not _append_observation(tokenizer, sample, observation, budget):
            break

    sample.metadata["num_turns"] = num_turns
    sample.metadata["env_info"] = infos
    if env_reward is not None:
        sample.metadata["env_reward"] = env_reward
        if not args.custom_rm_path and not args.rm_type:
            sample.reward = env_reward
    return sample


async def env_reward(args: SlimeArgs, sample: Sample) -> float:
    """`--custom-rm-path slime_rollout.multi_turn.env_reward`: the reward the environment gave (0.0 if none)."""
    return float(sample.metadata.get("env_reward", 0.0))
