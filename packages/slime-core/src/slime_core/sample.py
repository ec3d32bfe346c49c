"""`Sample`: one trajectory (prompt + generated response) as it moves from rollout to training.

A sample is created by the data source with a prompt and label, filled by a generate function
(one or several model turns, tool observations in between), scored by a reward function and
finally turned into training data by `slime_core.train_data`.

Token layout::

    tokens        = prompt ids + response ids           len = len(prompt ids) + response_length
    loss_mask     = [1 for model tokens, 0 for tool tokens]   len = response_length
    rollout_log_probs = [engine log-prob for model tokens, 0.0 for tool tokens]   len = response_length
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Sample", "Status", "status_from_finish_reason"]


class Status(enum.Enum):
    """Lifecycle of a sample.

    PENDING: not generated yet (or generation not finished).
    COMPLETED: the engine stopped on a stop token/string.
    TRUNCATED: the response-length budget ran out.
    ABORTED: the request was aborted (over-sampling surplus, weight update); may hold partial output.
    FAILED: a recoverable failure (e.g. env error); may hold partial output.
    """

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


_FINISH_REASON_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


def status_from_finish_reason(finish_reason: Any) -> Status | None:
    """Maps SGLang's `meta_info.finish_reason` to a `Status`.

    Args:
        finish_reason: SGLang's value: a dict like `{"type": "stop", "matched": 151645}`, a bare type
            string, or None (still running).

    Returns:
        stop -> COMPLETED, length -> TRUNCATED, abort -> ABORTED; None for anything else (the caller
        keeps the current status).
    """
    if isinstance(finish_reason, Mapping):
        finish_reason = finish_reason.get("type")
    if not isinstance(finish_reason, str):
        return None
    return _FINISH_REASON_TO_STATUS.get(finish_reason)


@dataclasses.dataclass(kw_only=True, slots=True)
class Sample:
    """One trajectory: prompt, generated response tokens, masks, engine log-probs and reward.

    Example:
        >>> s = Sample(prompt="1+1=", tokens=[16, 10, 16, 28], label="2")
        >>> s.append_response_tokens([17, 151645], log_probs=[-0.1, -0.02], text="2")
        >>> s.response_length, s.loss_mask, s.tokens[-2:]
        (2, [1, 1], [17, 151645])

    Attributes:
        prompt: prompt text (chat template already applied) or a list of chat messages.
        tokens: prompt ids followed by response ids, `[len(prompt ids) + response_length]` int.
        response: decoded response text, accumulated over turns (tool observations included).
        response_length: number of response-side tokens (model and tool tokens).
        label: ground truth for the reward function (e.g. a GSM8K solution), or None.
        reward: scalar reward, a dict of scores (selected by `--reward-key`), or None before scoring.
        loss_mask: `[response_length]` int in {0, 1}; 1 = trainable (model) token, 0 = tool/observation token.
            None until the first response token is appended.
        rollout_log_probs: `[response_length]` float, natural-log probability of each response token
            under the engine at the sampling temperature; 0.0 on non-trainable tokens. None if the
            engine gave none.
        status: lifecycle state, see `Status`.
        metadata: per-sample data from the dataset (`--metadata-key`) plus framework keys
            (`tools`, `rm_type`, `start_rollout_id`, `raw_reward`, ...).
        group_index: id of the prompt group (the `n_samples_per_prompt` siblings share it).
        index: global sample id; training data is sorted by it.
        rollout_id: id of the rollout execution that produced the sample; samples that fan out from
            one execution share it and share one loss denominator.
        weight_versions: the engine's `weight_version` for each generation call, in order.
        remove_sample: if True the sample's loss mask is zeroed when it becomes training data.
        session_id: routing key for engine affinity across turns.
        train_metadata: forwarded to the trainer unchanged.
        non_generation_time: seconds spent outside generation (tools, env), for perf metrics.
        teacher_log_probs: `[response_length]` float, natural-log probability of each response token under the
            on-policy-distillation teacher (`--use-opd --opd-type sglang`), or None.
    """

    Status = Status  # original plugins write `Sample.Status.TRUNCATED` (a nested enum there)

    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = dataclasses.field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    weight_versions: list[str] = dataclasses.field(default_factory=list)
    remove_sample: bool = False
    session_id: str | None = None
    train_metadata: dict[str, Any] | None = None
    non_generation_time: float = 0.0
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    teacher_log_probs: Any = None  # list[float]; the original's OPD post-process stores a float32 tensor

    # ---- derived views -------------------------------------------------------------------------

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens (`len(tokens) - response_length`)."""
        return len(self.tokens) - self.response_length

    @property
    def response_tokens(self) -> list[int]:
        """The response ids, `tokens[prompt_length:]`."""
        return self.tokens[self.prompt_length :]

    @property
    def effective_response_length(self) -> int:
        """Number of trainable response tokens (`sum(loss_mask)`; all of them if no mask yet)."""
        return self.response_length if self.loss_mask is None else int(sum(self.loss_mask))

    def get_reward_value(self, reward_key: str | None = None) -> float:
        """The scalar reward.

        Args:
            reward_key: key to select when `reward` is a dict (`--reward-key`).

        Raises:
            ValueError: if the sample has no reward yet, or `reward` is a dict and `reward_key` is missing
                from it or not given.
        """
        if self.reward is None:
            raise ValueError(f"sample {self.index} has no reward yet")
        if isinstance(self.reward, Mapping):
            if reward_key is None or reward_key not in self.reward:
                raise ValueError(
                    f"sample {self.index}: reward is a dict with keys {sorted(self.reward)}; "
                    f"set --reward-key to one of them (got {reward_key!r})"
                )
            return float(self.reward[reward_key])
        return float(self.reward)

    # ---- building the response -----------------------------------------------------------------

    def append_response_tokens(
        self,
        tokens: Sequence[int],
        *,
        log_probs: Sequence[float] | None = None,
        trainable: bool = True,
        text: str | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        """Appends one span of response tokens (a model turn or a tool observation).

        Keeps `tokens`, `loss_mask` and `rollout_log_probs` aligned and checks the invariants after the
        append. Model output must be appended as the engine's token ids; never decode and re-tokenize.

        Args:
            tokens: `[n]` token ids to append.
            log_probs: `[n]` engine log-probs (natural log). Required when `trainable` and the sample
                already carries log-probs (or this is its first span); must be None for non-trainable spans,
                which get 0.0.
            trainable: True for model-generated tokens (loss mask 1), False for tool/observation tokens.
            text: decoded text of the span, appended to `response`.
            meta_info: SGLang's `meta_info` of the generate call for a model span; its `weight_version`
                is recorded and its `finish_reason` updates `status`.

        Raises:
            ValueError: on a log-prob count that does not match the tokens, log-probs given for a
                non-trainable span, missing log-probs on a trainable span of a sample that has them, or
                any broken length invariant.
        """
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        if trainable:
            if log_probs is None:
                if self.rollout_log_probs is not None and n > 0:
                    raise ValueError(
                        f"sample {self.index}: trainable span of {n} tokens has no log-probs, "
                        "but the sample already carries rollout log-probs"
                    )
            elif len(log_probs) != n:
                raise ValueError(f"sample {self.index}: {len(log_probs)} log-probs for {n} tokens")
        elif log_probs is not None:
            raise ValueError(f"sample {self.index}: non-trainable span must not carry log-probs (they are 0.0)")

        if self.loss_mask is None:
            self.loss_mask = []
        if self.rollout_log_probs is None and trainable and log_probs is not None:
            # First span with log-probs: earlier spans (if any) were masked, so they get 0.0.
            self.rollout_log_probs = [0.0] * self.response_length

        self.tokens.extend(tokens)
        self.response_length += n
        self.loss_mask.extend([1 if trainable else 0] * n)
        if self.rollout_log_probs is not None:
            if trainable and log_probs is not None:
                self.rollout_log_probs.extend(float(x) for x in log_probs)
            else:
                self.rollout_log_probs.extend([0.0] * n)
        if text:
            self.response += text
        if meta_info is not None:
            version = meta_info.get("weight_version")
            if version is not None:
                self.weight_versions.append(str(version))
            status = status_from_finish_reason(meta_info.get("finish_reason"))
            if status is not None:
                self.status = status
        self.validate()

    def validate(self) -> None:
        """Checks the length invariants.

        Raises:
            ValueError: naming the broken invariant and the sample index.
        """
        if self.response_length < 0 or self.response_length > len(self.tokens):
            raise ValueError(
                f"sample {self.index}: response_length {self.response_length} outside [0, {len(self.tokens)}]"
            )
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(
                f"sample {self.index}: len(loss_mask)={len(self.loss_mask)} != response_length={self.response_length}"
            )
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"sample {self.index}: len(rollout_log_probs)={len(self.rollout_log_probs)} "
                f"!= response_length={self.response_length}"
            )
        if self.teacher_log_probs is not None and len(self.teacher_log_probs) != self.response_length:
            raise ValueError(
                f"sample {self.index}: len(teacher_log_probs)={len(self.teacher_log_probs)} "
                f"!= response_length={self.response_length}"
            )

    # ---- serialization -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON/pickle-friendly dict (status as its string value). Inverse of `from_dict`."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["status"] = self.status.value
        for key in ("tokens", "loss_mask", "rollout_log_probs", "weight_versions"):
            if out[key] is not None:
                out[key] = list(out[key])
        if out["teacher_log_probs"] is not None:
            out["teacher_log_probs"] = [float(x) for x in out["teacher_log_probs"]]  # a tensor becomes floats
        out["metadata"] = dict(self.metadata)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Rebuilds a sample from `to_dict` output.

        Raises:
            ValueError: on an unknown field or status (so a dump from another version fails loudly).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"Sample.from_dict: unknown fields {sorted(unknown)}")
        kwargs = dict(data)
        status = kwargs.get("status", Status.PENDING)
        if not isinstance(status, Status):
            try:
                status = Status(str(status).lower())
            except ValueError:
                raise ValueError(f"Sample.from_dict: unknown status {status!r}") from None
        kwargs["status"] = status
        sample = cls(**kwargs)
        sample.validate()
        return sample
