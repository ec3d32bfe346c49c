"""`Sample`: one trajectory (prompt + generated response) as it moves from rollout to training.

A sample is created by the data source with a prompt and label, filled by a generate function
(one or several model turns, tool observations in between), scored by a reward function and
finally turned into training data by `slime_core.train_data`.

Token layout::

    tokens        = prompt ids + response ids           len = len(prompt ids) + response_length
    loss_mask     = [1 for model tokens, 0 for tool tokens]   len = response_length
    rollout_log_probs = [engine log-prob for model tokens, 0.0 for tool tokens]   len = response_length
    rollout_top_p_token_offsets = [0, ...]   len = response_length + 1 (top-p replay only)

Vision-language samples also carry their images (`multimodal_inputs`, as the dataset gave them) and, once the
prompt went through the model's processor, the vision tensors the trainer's forward needs
(`multimodal_train_inputs`); `tokens` then hold the processor's ids, image placeholders expanded to one token
per merged vision patch. Text-only samples leave both None.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.error_text import preview
from slime_core.sample_codec import as_int32, decode_tensor, encode_media, encode_tensor
from slime_core.sample_fields import ORIGINAL_ONLY_FIELDS, check_field_types
from slime_core.sample_status import Status, as_status, status_from_finish_reason

if TYPE_CHECKING:
    import torch  # only for annotations: processes that never touch vision tensors (reward workers) skip it

__all__ = ["Sample", "Status", "as_status", "status_from_finish_reason", "validate_top_p_offsets"]


def validate_top_p_offsets(token_ids: Sequence[int], offsets: Sequence[int], num_rows: int, *, what: str) -> None:
    """Checks one sample's ragged nucleus encoding.

    Args:
        token_ids: `[K_i]` the kept ids of all positions, concatenated.
        offsets: `[num_rows + 1]` non-decreasing, `offsets[0] == 0`, `offsets[-1] == len(token_ids)`; position t
            kept `token_ids[offsets[t]:offsets[t + 1]]`.
        num_rows: the number of positions (the sample's response length).
        what: names the sample in the error (e.g. "sample 12").

    Raises:
        ValueError: naming the broken rule.
    """
    if len(offsets) != num_rows + 1:
        raise ValueError(
            f"{what}: {len(offsets)} top-p offsets for {num_rows} response tokens (expected {num_rows + 1})"
        )
    if offsets[0] != 0 or offsets[-1] != len(token_ids):
        raise ValueError(
            f"{what}: top-p offsets must run from 0 to len(token_ids)={len(token_ids)}, got {offsets[0]}..{offsets[-1]}"
        )
    if any(b < a for a, b in zip(offsets[:-1], offsets[1:], strict=True)):
        raise ValueError(f"{what}: top-p offsets must be non-decreasing")


# Not `slots=True`: plugins written for the original slime set their own attributes on samples
# (`sample.payload_text = ...` in its retool example), which a slotted class would refuse.
@dataclasses.dataclass(kw_only=True)
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
        rollout_top_p_token_ids: top-p replay (`--rollout-top-p < 1`): the token ids the engine kept at every
            response position, concatenated; position t kept `ids[offsets[t]:offsets[t + 1]]` (empty for tool
            tokens). None if the engine returned none (the original's field).
        rollout_top_p_token_offsets: `[response_length + 1]` int offsets into `rollout_top_p_token_ids`, or None.
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
        generate_function_path: per-sample override of `--custom-generate-function-path` (eval datasets).
        custom_rm_path: per-sample override of `--custom-rm-path` (eval datasets).
        apply_chat_template_kwargs: per-sample chat-template kwargs (original field; prompts arrive rendered).
        multimodal_inputs: raw media of the prompt, `{"images": [image, ...]}` in placeholder order; an image is
            a file path or a `data:image/...;base64,` URI (`slime_rollout.data.multimodal` normalizes dataset values).
            None for text-only prompts.
        multimodal_train_inputs: the processor's vision tensors for the trainer's forward, e.g.
            `{"pixel_values": [P, C*T*p*p] float32, "image_grid_thw": [num_images, 3] int64}` (`P` patches over
            all images); None for text-only samples. A plugin may keep other processor outputs here (lists);
            `to_dict` keeps them as they are. Samples of one prompt group may share the tensors.
        multimodal_train_input_id: cache id of `multimodal_train_inputs` (original field).
        rollout_routed_experts: `[len(tokens) - 1, num_hidden_layers, num_experts_per_tok]` int32 tensor, the
            experts the engine routed every token it ran to (`--use-rollout-routing-replay`; SGLang's
            `meta_info.routed_experts`, `slime_core.routing_replay`), or None.
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
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
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
    apply_chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, torch.Tensor] | None = None
    teacher_log_probs: Any = None  # list[float]; the original's OPD post-process stores a float32 tensor
    multimodal_train_input_id: str | None = None  # the original's cache id; not read here
    rollout_routed_experts: Any = None  # torch.Tensor [T - 1, L, K] int32 (nested int lists are accepted)

    def __post_init__(self) -> None:
        # A string status stayed a string: never equal to a Status, it crashed `to_dict` (debug dumps).
        self.status = as_status(self.status, f"sample {self.index}")

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

    def get_reward_value(self, reward_key: Any = None) -> float:
        """The scalar reward.

        Args:
            reward_key: key to select when `reward` is a dict (`--reward-key`), or an object with a
                `reward_key` attribute (the original's signature is `get_reward_value(args)`).

        Raises:
            ValueError: if the sample has no reward yet, `reward` is a dict and `reward_key` is missing from it or
                not given, or the value is not a number (a dict's `{"score": None}`, a string: they failed as a
                bare `float()` error naming neither the sample nor the key).
        """
        if reward_key is not None and not isinstance(reward_key, str):
            reward_key = reward_key.reward_key  # the run's args, as original plugins pass them
        if self.reward is None:
            raise ValueError(f"sample {self.index} has no reward yet")
        value, what = self.reward, "reward"
        if isinstance(self.reward, Mapping):
            if reward_key is None or reward_key not in self.reward:
                raise ValueError(
                    f"sample {self.index}: reward is a dict with keys {sorted(map(str, self.reward))}; "
                    f"set --reward-key to one of them (got {reward_key!r})"
                )
            value, what = self.reward[reward_key], f"reward's --reward-key {reward_key!r} score"
        # A number (bool and numpy scalars included) or a 0-d tensor/array; a str is not one (the original's
        # torch.tensor(rewards) refuses it too).
        if not (isinstance(value, numbers.Real) or getattr(value, "ndim", None) == 0):
            raise ValueError(
                f"sample {self.index}: its {what} is {type(value).__name__} {preview(value, 60)}, not a number"
            )
        return float(value)

    def metadata_raw_reward(self) -> float | None:
        """`metadata["raw_reward"]` as a float (a plugin's override of the logged raw reward), or None without one.

        Raises:
            ValueError: it is not a finite real number (None, a string, a dict, NaN), naming the sample; a bare
                `float()` failed naming neither, and NaN was logged and trained on as the raw reward.
        """
        if "raw_reward" not in self.metadata:
            return None
        value = self.metadata["raw_reward"]
        try:
            number = float(value) if isinstance(value, numbers.Real) or getattr(value, "ndim", None) == 0 else math.nan
        except (TypeError, ValueError, OverflowError):  # a 0-d array of text, an int past float range
            number = math.nan
        if not math.isfinite(number):
            raise ValueError(
                f"sample {self.index}: metadata['raw_reward'] is {type(value).__name__} {preview(value, 60)}, "
                "not a finite number"
            )
        return number

    def unsupported_fields(self) -> list[str]:
        """Names of the original fields this sample sets that this version cannot train with (none left).

        Kept for plugins and for a field that a later original adds: training data refuses what it names.
        """
        return []

    # ---- building the response -----------------------------------------------------------------

    def append_response_tokens(
        self,
        tokens_or_args: Any = None,
        /,
        *,
        tokens: Sequence[int] | None = None,
        log_probs: Sequence[float] | None = None,
        trainable: bool = True,
        text: str | None = None,
        meta_info: Mapping[str, Any] | None = None,
        update_terminal_info: bool = True,
        top_p: tuple[Sequence[int], Sequence[int]] | None = None,
    ) -> None:
        """Appends one span of response tokens (a model turn or a tool observation).

        Keeps `tokens`, `loss_mask` and `rollout_log_probs` aligned and checks the invariants after the
        append. Model output must be appended as the engine's token ids; never decode and re-tokenize.
        A response built without this method (tokens and `response_length` set directly, no `loss_mask`) is
        all trainable: its mask starts as ones over the existing response.

        Rollout log-probs cover every trainable token or none: a trainable span needs `log_probs`, and the
        first span with log-probs cannot be appended to a response that already has trainable tokens without
        them (filling those with 0.0 would claim probability 1 for tokens the engine never scored). A sample
        without rollout log-probs (SFT data, a custom generate function) sets its fields directly.

        Two call forms: `append_response_tokens(ids, log_probs=...)`, and the original slime's
        `append_response_tokens(args, tokens=ids, log_probs=...)` (there the first argument is the run's
        `args`: a `meta_info` holding `routed_experts` then also sets `rollout_routed_experts` under
        `--use-rollout-routing-replay`, `slime_core.reply_routes`, as the original's append does).

        Args:
            tokens_or_args: `[n]` token ids to append; or, when `tokens` is given, the original's `args`.
            tokens: `[n]` token ids to append (the original's keyword).
            log_probs: `[n]` engine log-probs (natural log). Required for a trainable span; must be None for
                non-trainable spans, which get 0.0.
            trainable: True for model-generated tokens (loss mask 1), False for tool/observation tokens.
            text: decoded text of the span, appended to `response`.
            meta_info: SGLang's `meta_info` of the generate call for a model span; its `weight_version`
                is recorded and its `finish_reason` updates `status`; without `top_p`, a trainable span takes its
                top-p sets from it (`top_p_token_ids`/`_offsets`, `slime_core.top_p_sets`), as the original's does.
            update_terminal_info: False to leave `status` and `weight_versions` alone (a span that is not
                the end of a generate call).
            top_p: `(token_ids, offsets)` the engine kept at each of the `n` positions (top-p replay; `offsets`
                has `n + 1` entries from 0), for a trainable span. Like log-probs, they cover every trainable
                token of a sample or none; non-trainable spans get empty sets.

        Raises:
            ValueError: on a log-prob count that does not match the tokens, log-probs given for a
                non-trainable span, a trainable span without log-probs, log-probs for a response whose
                earlier trainable tokens have none, `meta_info` top-p sets that do not describe the span, or any
                broken length invariant.
        """
        args = tokens_or_args if tokens is not None else None  # the original's call form passes the run's args
        if tokens is None:
            tokens = tokens_or_args if tokens_or_args is not None else []
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        if top_p is None and meta_info is not None and trainable and n > 0:
            # The reply's own sets, as the original's append reads them: a generate function written for it passes
            # only meta_info, and its samples trained on the full softmax. Imported here: it imports this module.
            from slime_core.top_p_sets import parse_top_p_sets

            top_p = parse_top_p_sets(meta_info, n, what=f"sample {self.index}: meta_info")
        self._check_span_log_probs(n, log_probs, trainable)
        self._check_span_top_p(n, top_p, trainable)
        if self.loss_mask is None:
            # Set directly without a mask (e.g. by a custom generate function): all of it is trainable.
            self.loss_mask = [1] * self.response_length
        if self.rollout_log_probs is None and n == 0 and trainable and log_probs is not None:
            # An empty model span given its (empty) log-prob list starts the list, as the original's append does: its
            # multi_agent example appends an aborted reply so and then reads len(rollout_log_probs).
            if not any(self.loss_mask):
                self.rollout_log_probs = [0.0] * self.response_length
        if self.rollout_log_probs is None and trainable and n > 0:
            if any(self.loss_mask):
                raise ValueError(
                    f"sample {self.index}: span with log-probs appended to a response whose "
                    f"{sum(self.loss_mask)} trainable tokens have none; rollout log-probs must cover every "
                    "trainable token or none"
                )
            # First span with log-probs: earlier spans (if any) are masked, so they get 0.0.
            self.rollout_log_probs = [0.0] * self.response_length

        self.tokens.extend(tokens)
        self.response_length += n
        self.loss_mask.extend([1 if trainable else 0] * n)
        if self.rollout_log_probs is not None:
            if trainable and log_probs is not None:
                self.rollout_log_probs.extend(float(x) for x in log_probs)
            else:
                self.rollout_log_probs.extend([0.0] * n)
        self._extend_top_p(n, top_p)
        if text:
            self.response += text
        if meta_info is not None and update_terminal_info:
            version = meta_info.get("weight_version")
            if version is not None:
                self.weight_versions.append(str(version))
            status = status_from_finish_reason(meta_info.get("finish_reason"))
            if status is not None:
                self.status = status
        if args is not None and meta_info is not None and meta_info.get("routed_experts") is not None:
            # The reply's MoE routes, as the original's append decodes them (`--use-rollout-routing-replay`).
            from slime_core.reply_routes import attach_routed_experts  # imported here: it imports this module

            attach_routed_experts(args, self, meta_info)
        self.validate()

    def _check_span_log_probs(self, n: int, log_probs: Sequence[float] | None, trainable: bool) -> None:
        if not trainable:
            if log_probs is not None:
                raise ValueError(f"sample {self.index}: non-trainable span must not carry log-probs (they are 0.0)")
            return
        if log_probs is None:
            if n > 0:
                raise ValueError(
                    f"sample {self.index}: trainable span of {n} tokens has no log-probs; pass the engine's "
                    "log-probs (or set the sample's fields directly for data without rollout log-probs)"
                )
        elif len(log_probs) != n:
            raise ValueError(f"sample {self.index}: {len(log_probs)} log-probs for {n} tokens")

    def _check_span_top_p(self, n: int, top_p: tuple[Sequence[int], Sequence[int]] | None, trainable: bool) -> None:
        if top_p is not None:
            if not trainable:
                raise ValueError(f"sample {self.index}: a non-trainable span has no top-p sets (they are empty)")
            validate_top_p_offsets(top_p[0], top_p[1], n, what=f"sample {self.index} (appended span)")
        if not trainable or n == 0:
            return
        has_sets = self.rollout_top_p_token_offsets is not None
        if has_sets and top_p is None:
            raise ValueError(f"sample {self.index}: trainable span without top-p sets, but the sample carries them")
        if not has_sets and top_p is not None and any(self.loss_mask or [1] * self.response_length):
            raise ValueError(
                f"sample {self.index}: top-p sets for a response whose earlier trainable tokens have none; they must "
                "cover every trainable token or none"
            )

    def _extend_top_p(self, n: int, top_p: tuple[Sequence[int], Sequence[int]] | None) -> None:
        if top_p is not None and self.rollout_top_p_token_offsets is None:
            # First span with sets: earlier positions (masked) get empty ones.
            self.rollout_top_p_token_ids = []
            self.rollout_top_p_token_offsets = [0] * (self.response_length - n + 1)
        if self.rollout_top_p_token_offsets is None:
            return
        base = self.rollout_top_p_token_offsets[-1]
        if top_p is None:
            self.rollout_top_p_token_offsets.extend([base] * n)
            return
        ids, offsets = top_p
        self.rollout_top_p_token_ids.extend(int(t) for t in ids)
        self.rollout_top_p_token_offsets.extend(base + int(o) for o in offsets[1:])

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
        if (self.rollout_top_p_token_ids is None) != (self.rollout_top_p_token_offsets is None):
            raise ValueError(f"sample {self.index}: rollout_top_p_token_ids and _offsets must be set together")
        if self.rollout_top_p_token_offsets is not None:
            validate_top_p_offsets(
                self.rollout_top_p_token_ids,
                self.rollout_top_p_token_offsets,
                self.response_length,
                what=f"sample {self.index}",
            )

    # ---- serialization -------------------------------------------------------------------------

    def plugin_attributes(self) -> dict[str, Any]:
        """The attributes a plugin set on this sample that are not fields (`sample.tool_call_count = 3`)."""
        names = {f.name for f in dataclasses.fields(self)}
        return {k: v for k, v in vars(self).items() if k not in names and not k.startswith("_")}

    def to_dict(self) -> dict[str, Any]:
        """A JSON/pickle-friendly dict (status as its string value). Inverse of `from_dict`.

        Plugin attributes (`plugin_attributes`) are included as they are, as the original's `to_dict` (a copy of
        `__dict__`) has them: its retool example sets `sample.tool_call_count`, which its reward function reads.
        """
        out = {**self.plugin_attributes(), **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
        out["status"] = self.status.value
        for key in (
            "tokens",
            "loss_mask",
            "rollout_log_probs",
            "rollout_top_p_token_ids",
            "rollout_top_p_token_offsets",
            "weight_versions",
        ):
            if out[key] is not None:
                out[key] = list(out[key])
        if out["teacher_log_probs"] is not None:
            out["teacher_log_probs"] = [float(x) for x in out["teacher_log_probs"]]  # a tensor becomes floats
        out["metadata"] = dict(self.metadata)
        if self.multimodal_inputs is not None:
            out["multimodal_inputs"] = {
                k: [encode_media(x) for x in v] if isinstance(v, list) else v for k, v in self.multimodal_inputs.items()
            }
        if self.multimodal_train_inputs is not None:
            # Tensors as builtins; any other value (transformers 5's `mm_token_type_ids` lists, which the original's
            # geo3k_vlm_multi_turn example keeps from the processor's output) as it is, as the original's to_dict.
            out["multimodal_train_inputs"] = {
                k: encode_tensor(v) if callable(getattr(v, "detach", None)) else v
                for k, v in self.multimodal_train_inputs.items()
            }
        if self.rollout_routed_experts is not None:
            out["rollout_routed_experts"] = encode_tensor(as_int32(self.rollout_routed_experts))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Rebuilds a sample from `to_dict` output, or from the original's (its debug dumps).

        The original's fields this version does not keep (`sample_fields.ORIGINAL_ONLY_FIELDS`: `spec_info`,
        `prefix_cache_info`, engine statistics) are read past; `--load-debug-rollout-data` counts and logs them.
        Any other key is a plugin attribute (the original's dumps hold them: its retool example's `payload_text`,
        `tool_call_count`) and is set on the sample, as the original's `from_dict` does.

        Raises:
            ValueError: a key that cannot be a plugin attribute (not an identifier, a leading underscore, the
                name of a `Sample` method or property, or any key not a field in a dict without `status`, which
                every `to_dict` writes), naming it, or an unknown status.
            TypeError: `data` is not a mapping, or a field of the wrong type, naming the field and the value's
                type (`slime_core.sample_fields.check_field_types`).
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"Sample.from_dict: a sample must be a dict of fields, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        attributes = set(data) - names - ORIGINAL_ONLY_FIELDS.keys()
        bad = [
            k for k in attributes if not isinstance(k, str) or not k.isidentifier() or k[0] == "_" or hasattr(cls, k)
        ]
        if not bad and attributes and "status" not in data:
            bad = list(attributes)  # not a to_dict() (every one has "status", the original's reads it): foreign
        if bad:
            raise ValueError(
                f"Sample.from_dict: unknown fields {sorted(map(str, bad))}: neither a field of this version's or the "
                "original's Sample nor a name a plugin attribute can have"
            )
        kwargs = {k: v for k, v in data.items() if k in names}
        for key in ("rollout_top_p_token_ids", "rollout_top_p_token_offsets"):
            value = kwargs.get(key)
            if hasattr(value, "reshape") and callable(getattr(value, "tolist", None)):
                kwargs[key] = value.reshape(-1).tolist()  # the original's samples keep these as int32 tensors
        reward = kwargs.get("reward")
        if getattr(reward, "ndim", None) == 0 and callable(getattr(reward, "item", None)):
            kwargs["reward"] = reward.item()  # a reward function's 0-d tensor, kept as is by the original
        check_field_types(kwargs)
        kwargs["status"] = as_status(kwargs.get("status", Status.PENDING), "Sample.from_dict")
        if kwargs.get("multimodal_train_inputs") is not None:
            kwargs["multimodal_train_inputs"] = {
                k: decode_tensor(v) if isinstance(v, Mapping) else v
                for k, v in kwargs["multimodal_train_inputs"].items()
            }
        routes = kwargs.get("rollout_routed_experts")
        if isinstance(routes, Mapping):
            kwargs["rollout_routed_experts"] = decode_tensor(routes, "rollout_routed_experts")
        sample = cls(**kwargs)
        for key in attributes:
            setattr(sample, key, data[key])
        sample.validate()
        return sample
