r"""One agent session's token streams: every chat-completion call recorded token-in/token-out.

An agent re-sends the whole conversation on every call. Re-rendering it with the chat template would
re-tokenize the model's earlier turns, and decode -> encode does not give back the ids the engine sampled
(e.g. eight sampled `"\n"` tokens re-encode as one `"\n\n\n\n\n\n\n\n"` token). So a session keeps, per
branch, the exact stream it sent and got back::

    tokens    = prompt ids | model turn 1 | messages after it | model turn 2 | ...
    loss_mask =            |  1 ... 1     |  0 ... 0          |  1 ... 1     | ...

A call whose messages start with a branch's messages up to one of its assistant turns continues from that
turn's tokens: only the new messages (tool results, user turns) are rendered, by the chat template's own
wrapper (`slime_rollout.generation.template_check.render_continuation`), and tokenized. Continuing from the last turn
extends the branch; from an earlier one (the agent retried or edited its history) forks a new branch that
carries the shared turns as masked context, so each generated turn is trained once. A call that matches no
branch starts a new one from the chat template. Each branch becomes one `Sample`.

Echoed assistant turns are matched by `slime_rollout.agent.openai_wire.match_key` (role, content, tool calls),
not by tokens, so an agent that drops `reasoning_content` or reorders argument keys still continues its branch.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any

from slime_core.sample import Sample, Status
from slime_rollout.agent.openai_wire import ChatRequest, match_key
from slime_rollout.generation.template_check import CONVERSATION_KEY, record_segment, render_continuation

__all__ = ["AgentSession", "Plan", "TurnRecord"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True, slots=True)
class TurnRecord:
    """One engine call of a session.

    Attributes:
        prompt_ids: `[P]` int, the ids sent to the engine (`input_ids`).
        output_ids: `[R]` int, the ids the engine generated.
        output_log_probs: `[R]` float, their log-probs (natural log, at the sampling temperature).
        meta_info: the engine's `meta_info` (finish reason, weight version).
        text: `output_ids` decoded with special tokens kept.
        reply: the reply as a chat-template assistant message (`openai_wire.assistant_messages`).
        template_mismatch: first index where `prompt_ids` differs from the chat template's tokenization of the
            request's messages (the conformance check), None when they agree or the check is off.
        num_ill_formed: `<tool_call>` blocks of the reply that were not a call (bad JSON, a tool not offered),
            left in its content.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    output_log_probs: list[float]
    meta_info: Mapping[str, Any]
    text: str
    reply: dict[str, Any]
    template_mismatch: int | None = None
    num_ill_formed: int = 0


@dataclasses.dataclass(kw_only=True, slots=True)
class _Boundary:
    """Where a branch stood right after one of its model turns."""

    num_messages: int  # chat messages covered, the turn's reply included
    num_tokens: int  # len(sample.tokens)
    num_segments: int  # recorded conversation segments
    num_chars: int  # len(sample.response)
    model_text: str  # the turn decoded (special tokens kept): tells whether it closed with the end-of-turn marker


class _Branch:
    """One linear token stream of a session; becomes one Sample."""

    def __init__(self, *, prompt_ids: list[int], messages: list[dict[str, Any]], tools: Any, tools_key: str):
        self.sample = Sample(prompt=copy.deepcopy(messages), tokens=list(prompt_ids))
        self.sample.metadata[CONVERSATION_KEY] = {"tools": tools, "prompt": copy.deepcopy(messages), "segments": []}
        self.tools_key = tools_key
        self.keys: list[str] = []  # match keys of the messages up to the last turn's reply
        self.boundaries: list[_Boundary] = []
        self.turns: list[dict[str, Any]] = []
        self.forked_from: int | None = None

    def fork(self, boundary: int) -> _Branch:
        """A new branch holding this one's stream up to `boundaries[boundary]`, all of it masked."""
        b = self.boundaries[boundary]
        record = self.sample.metadata[CONVERSATION_KEY]
        prompt_len = self.sample.prompt_length
        new = _Branch(
            prompt_ids=self.sample.tokens[:prompt_len],
            messages=record["prompt"],
            tools=record["tools"],
            tools_key=self.tools_key,
        )
        # Trained on in this branch already: context only in the fork.
        new.sample.append_response_tokens(
            self.sample.tokens[prompt_len : b.num_tokens], trainable=False, text=self.sample.response[: b.num_chars]
        )
        new.sample.metadata[CONVERSATION_KEY]["segments"] = copy.deepcopy(record["segments"][: b.num_segments])
        new.keys = self.keys[: b.num_messages]
        new.boundaries = [dataclasses.replace(x) for x in self.boundaries[: boundary + 1]]
        new.turns = [dict(t, trained=False) for t in self.turns[: boundary + 1]]
        return new

    def append_turn(self, turn: TurnRecord, keys: list[str]) -> None:
        """Appends one model turn (trainable, with the engine's log-probs)."""
        self.sample.append_response_tokens(
            turn.output_ids, log_probs=turn.output_log_probs, text=turn.text, meta_info=turn.meta_info
        )
        record_segment(self.sample, "assistant", turn.text)
        self.keys = [*keys, match_key(turn.reply)]
        self.boundaries.append(
            _Boundary(
                num_messages=len(self.keys),
                num_tokens=len(self.sample.tokens),
                num_segments=len(self.sample.metadata[CONVERSATION_KEY]["segments"]),
                num_chars=len(self.sample.response),
                model_text=turn.text,
            )
        )
        finish = (turn.meta_info.get("finish_reason") or {}).get("type")
        self.turns.append(
            {
                "prompt_tokens": len(turn.prompt_ids),
                "completion_tokens": len(turn.output_ids),
                "finish_reason": finish,
                "template_mismatch": turn.template_mismatch,
                "ill_formed_tool_calls": turn.num_ill_formed,
                "trained": True,
            }
        )


@dataclasses.dataclass(kw_only=True, slots=True)
class Plan:
    """How one call's messages become the ids sent to the engine.

    Attributes:
        token_in: `[P]` int, the engine's `input_ids`.
        branch: the branch continued (None: a new branch from the chat template).
        boundary: index of the turn of `branch` continued from.
        delta_messages: the messages after that turn (rendered into `delta_text`).
        delta_text: the template's text of `delta_messages`, tokenized into the end of `token_in`.
        delta_ids: its ids.
        request: the call.
    """

    token_in: list[int]
    branch: _Branch | None
    boundary: int
    delta_messages: list[dict[str, Any]]
    delta_text: str
    delta_ids: list[int]
    request: ChatRequest


class AgentSession:
    """The branches of one agent run (one session id), and its calls in flight.

    Args:
        session_id: the id (the agent's API key, `metadata.session_id` or `user`).
        sampling_defaults: SGLang sampling params of the run (`max_new_tokens` caps each call).
        max_context_tokens: a call whose prompt reaches this many tokens is refused (0: no limit).
    """

    def __init__(self, session_id: str, *, sampling_defaults: Mapping[str, Any], max_context_tokens: int = 0):
        self.session_id = session_id
        self.sampling_defaults = dict(sampling_defaults)
        self.max_context_tokens = int(max_context_tokens or 0)
        self.branches: list[_Branch] = []
        self.inflight: set[asyncio.Task] = set()
        self.closed = False
        self.num_calls = 0
        self.num_forks = 0
        self.num_template_mismatches = 0
        self.num_unanswered = 0  # engine replies not recorded: the client had closed the connection
        self.num_dropped_tool_calls = 0  # calls past the first of a reply to `parallel_tool_calls: false`
        self.num_aborted = 0  # calls the engine aborted (weight update, the rollout's surplus): not recorded
        self.num_ill_formed = 0  # <tool_call> blocks of recorded replies that were not a call (left as text)

    def plan(self, tokenizer: Any, request: ChatRequest) -> Plan:
        """The engine input of a call: continues the branch sharing the longest history, else renders anew.

        Raises:
            ValueError: the chat template cannot render the messages.
        """
        tools_key = json.dumps(request.tools, sort_keys=True)
        best: tuple[int, bool, _Branch, int] | None = None
        for branch in self.branches:
            if branch.tools_key != tools_key:
                continue  # other tools: another system prompt
            for idx in range(len(branch.boundaries) - 1, -1, -1):
                n = branch.boundaries[idx].num_messages
                if n < len(request.keys) and request.keys[:n] == branch.keys[:n]:
                    candidate = (n, idx == len(branch.boundaries) - 1, branch, idx)
                    if best is None or candidate[:2] > best[:2]:
                        best = candidate
                    break
        if best is None:
            text = tokenizer.apply_chat_template(
                request.messages, tools=request.tools, tokenize=False, add_generation_prompt=True
            )
            ids = tokenizer.encode(text, add_special_tokens=False)
            return Plan(
                token_in=ids, branch=None, boundary=-1, delta_messages=[], delta_text="", delta_ids=[], request=request
            )
        n, _, branch, idx = best
        boundary = branch.boundaries[idx]
        delta = request.messages[n:]
        delta_text = render_continuation(tokenizer, delta, model_turn=boundary.model_text)
        delta_ids = tokenizer.encode(delta_text, add_special_tokens=False)
        return Plan(
            token_in=branch.sample.tokens[: boundary.num_tokens] + delta_ids,
            branch=branch,
            boundary=idx,
            delta_messages=delta,
            delta_text=delta_text,
            delta_ids=delta_ids,
            request=request,
        )

    def record(self, plan: Plan, turn: TurnRecord) -> None:
        """Appends a finished call to its branch (or to a new branch: fresh, or forked when the branch moved on)."""
        request = plan.request
        if plan.branch is None:
            branch = _Branch(
                prompt_ids=plan.token_in,
                messages=request.messages,
                tools=request.tools,
                tools_key=json.dumps(request.tools, sort_keys=True),
            )
            self.branches.append(branch)
        elif plan.boundary == len(plan.branch.boundaries) - 1:
            branch = plan.branch
        else:
            branch = plan.branch.fork(plan.boundary)
            branch.forked_from = self.branches.index(plan.branch)
            self.branches.append(branch)
            self.num_forks += 1
            logger.info(
                "agent session %s: call continues turn %d of branch %d, which went on: branch %d forks there",
                self.session_id,
                plan.boundary + 1,
                branch.forked_from,
                len(self.branches) - 1,
            )
        if plan.delta_ids:
            branch.sample.append_response_tokens(plan.delta_ids, trainable=False, text=plan.delta_text)
            record_segment(branch.sample, "observation", plan.delta_text, messages=plan.delta_messages)
        assert branch.sample.tokens == turn.prompt_ids, "the branch must hold exactly what was sent"
        branch.append_turn(turn, request.keys)
        self.num_calls += 1
        self.num_ill_formed += turn.num_ill_formed
        if turn.template_mismatch is not None:
            self.num_template_mismatches += 1

    def to_samples(
        self, base_sample: Sample, *, reward: float | dict | None, extra_metadata: Mapping[str, Any] | None
    ) -> list[Sample]:
        """One Sample per branch with a trained turn, in branch order.

        Each takes `index`, `group_index`, `label` and `metadata` from `base_sample`, shares its `rollout_id`
        (the index when it has none: siblings share one loss denominator), and gets `reward`; its `prompt` is
        `base_sample.prompt`, or the first call's messages when that is empty.
        `metadata["agent"]`: session id, branch number, branch count, the branch it forked from, the session's
        calls whose client left before the reply (`num_unanswered`, not recorded), the tool calls past the first of
        replies to `parallel_tool_calls: false` (`num_dropped_tool_calls`, not returned), the calls the engine
        aborted (`num_aborted`, not recorded: an episode the rollout's abort cut short has one), and per call
        `prompt_tokens`, `completion_tokens`, `finish_reason`, `template_mismatch`, `ill_formed_tool_calls`,
        `trained`.
        """
        samples = []
        for i, branch in enumerate(self.branches):
            s = branch.sample
            if not any(s.loss_mask or []):
                continue
            s.index, s.group_index, s.label = base_sample.index, base_sample.group_index, base_sample.label
            s.rollout_id = base_sample.rollout_id if base_sample.rollout_id is not None else base_sample.index
            if base_sample.prompt:
                s.prompt = base_sample.prompt
            s.session_id = self.session_id
            s.reward = reward
            agent = {
                "session_id": self.session_id,
                "branch": i,
                "num_branches": len(self.branches),
                "forked_from": branch.forked_from,
                "turns": branch.turns,
                "num_unanswered": self.num_unanswered,
                "num_dropped_tool_calls": self.num_dropped_tool_calls,
                "num_aborted": self.num_aborted,
            }
            s.metadata = {
                **base_sample.metadata,
                **(extra_metadata or {}),
                CONVERSATION_KEY: s.metadata[CONVERSATION_KEY],
                "agent": agent,
            }
            if s.status is Status.PENDING:
                s.status = Status.COMPLETED
            samples.append(s)
        return samples
