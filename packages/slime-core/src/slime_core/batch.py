"""`RolloutBatch`: the training data of one rollout for one data-parallel rank.

Built by `slime_core.train_data.build_rollout_batches` from samples (reward post-processing,
loss masks, loss denominators, micro-batch schedule), shipped to each trainer rank, consumed
by the training backends. Everything is on CPU; tensors are created once here.

Shapes: `N` = samples on this rank, `L_i` = response length of sample i, `T_i` = total length.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from slime_core.algorithms.top_p import KeptTokens

__all__ = ["RolloutBatch"]


@dataclasses.dataclass(kw_only=True, slots=True)
class RolloutBatch:
    """Training data of one rollout for one DP rank, with its micro-batch schedule.

    Example:
        >>> b = RolloutBatch(tokens=[torch.tensor([5, 6, 7])], response_lengths=[1],
        ...     loss_masks=[torch.tensor([1.0])], rewards=[0.5], raw_rewards=[1.0],
        ...     loss_denominators=[1.0], micro_batches=[[[0]]])
        >>> b.num_samples, b.num_steps, b.total_lengths
        (1, 1, [3])

    Attributes:
        tokens: N tensors `[T_i]` int64, prompt + response ids.
        response_lengths: N ints `L_i`.
        loss_masks: N tensors `[L_i]` float32 in {0, 1}.
        rewards: N floats, post-processed (group-normalized) scalar rewards; the advantage input.
        raw_rewards: N floats, rewards as the reward function returned them.
        loss_denominators: N floats, the token count that sample i's loss is divided by in the default
            per-rollout token-mean reducer: the summed loss mask of all samples sharing its `rollout_id`
            (its own mask sum when it is alone), at least 1.
        rollout_log_probs: N tensors `[L_i]` float32 (engine log-probs, 0.0 on masked tokens), or None.
        rollout_top_p_token_ids: N tensors `[K_i]` int64, the token ids the engine kept at each response position
            (top-p replay, `--rollout-top-p < 1`), or None when the engine returned none.
        rollout_top_p_token_offsets: N tensors `[L_i + 1]` int64 offsets into them (position t kept
            `ids[offsets[t]:offsets[t + 1]]`), or None.
        truncated: N ints, 1 if the sample hit the response-length limit.
        sample_indices: N ints, `Sample.index` (global ids, for dumps and ordering).
        micro_batches: the schedule: `micro_batches[step][mb]` is a list of local sample positions
            (indices into the lists above). Every DP rank has the same number of steps and the same number
            of micro-batches per step (some may be empty lists).
        step_sample_counts: per optimizer step, the number of samples in the step across all DP ranks.
        step_rollout_counts: per optimizer step, the number of rollouts in the step across all DP ranks (samples
            sharing a `rollout_id` count once; `--global-batch-size` counts rollouts): what the default
            per-rollout-mean loss and its metrics are divided by, as the original's `global_batch_sizes`. Empty:
            every sample is its own rollout, and `step_sample_counts` is used.
        step_token_counts: per optimizer step, the summed loss mask across all DP ranks (divides the
            per-token loss with `--calculate-per-token-loss`).
        metadata: N dicts forwarded from `Sample.train_metadata` (may be empty dicts).
        multimodal_train_inputs: N entries of `Sample.multimodal_train_inputs` (vision tensors such as
            `pixel_values` `[P_i, C*T*p*p]` float32 and `image_grid_thw` `[num_images_i, 3]` int64, or None for a
            sample without images), or None when no sample of the rollout has any (text-only runs).
        teacher_log_probs: N tensors `[L_i]` float32, the on-policy-distillation teacher's log-probs of the
            response tokens scored during the rollout (`--opd-type sglang`), or None.
        rollout_routed_experts: N tensors `[T_i - 1, L, K]` int32, the experts the engine routed each token it ran to
            (`L` decoder layers, `K` experts per token; `--use-rollout-routing-replay`, `slime_core.routing_replay`),
            or None.
        values: N tensors `[L_i]` float32, the PPO critic's values of the response tokens before its update
            (attached by the trainer app after the critic step; `V_t` is the value of the state that emits
            response token t), or None.
    """

    tokens: list[torch.Tensor]
    response_lengths: list[int]
    loss_masks: list[torch.Tensor]
    rewards: list[float]
    raw_rewards: list[float]
    loss_denominators: list[float]
    micro_batches: list[list[list[int]]]
    rollout_log_probs: list[torch.Tensor] | None = None
    rollout_top_p_token_ids: list[torch.Tensor] | None = None
    rollout_top_p_token_offsets: list[torch.Tensor] | None = None
    truncated: list[int] = dataclasses.field(default_factory=list)
    sample_indices: list[int] = dataclasses.field(default_factory=list)
    step_sample_counts: list[int] = dataclasses.field(default_factory=list)
    step_rollout_counts: list[int] = dataclasses.field(default_factory=list)
    step_token_counts: list[float] = dataclasses.field(default_factory=list)
    metadata: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    multimodal_train_inputs: list[dict[str, torch.Tensor] | None] | None = None
    teacher_log_probs: list[torch.Tensor] | None = None
    rollout_routed_experts: list[torch.Tensor] | None = None
    values: list[torch.Tensor] | None = None

    @property
    def num_samples(self) -> int:
        """N, the number of samples on this rank."""
        return len(self.tokens)

    @property
    def num_steps(self) -> int:
        """Number of optimizer steps in this rollout."""
        return len(self.micro_batches)

    @property
    def total_lengths(self) -> list[int]:
        """`T_i` for each sample."""
        return [int(t.numel()) for t in self.tokens]

    @property
    def prompt_lengths(self) -> list[int]:
        """`T_i - L_i` for each sample."""
        return [int(t.numel()) - r for t, r in zip(self.tokens, self.response_lengths, strict=True)]

    def kept_tokens(self, ids: list[int]) -> KeptTokens | None:
        """The top-p replay sets of samples `ids`, their response positions concatenated in that order.

        Returns:
            `KeptTokens` over `Σ L_i` rows, or None when the batch carries no sets (no replay).
        """
        if self.rollout_top_p_token_ids is None or self.rollout_top_p_token_offsets is None:
            return None
        from slime_core.algorithms.top_p import KeptTokens

        return KeptTokens.from_offsets(
            [self.rollout_top_p_token_ids[i] for i in ids], [self.rollout_top_p_token_offsets[i] for i in ids]
        )
