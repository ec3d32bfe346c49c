"""Loss reducers: per-token values of a micro-batch → one scalar (a SUM over samples).

Legend: `N` samples, `L_i` response length, `T = Σ L_i` concatenated response tokens.

A reducer is a callable `reduce(x: Tensor[T]) -> Tensor[]` over the concatenated per-token values of
the micro-batch's samples, in sample order. Built-ins:

* `sum_of_sample_mean` (default): `Σ_i Σ_t x_it·m_it / max(D_i, 1)`, `D_i` = the sample's loss
  denominator (its rollout's summed mask). The backend divides by the step's global sample count.
* `sum_of_token` (`--calculate-per-token-loss`): `Σ_i Σ_t x_it·m_it`; the backend divides by the
  step's global token count.
* `drgrpo` (Dr.GRPO, Liu et al. 2025, arXiv:2503.20783): `Σ_i Σ_t x_it·m_it / C` with the constant
  `C = --rollout-max-response-len`; selected with
  `--custom-pg-loss-reducer-function-path slime_core.algorithms.reducers.drgrpo`.

A sample whose mask is all zero contributes exactly 0 (never NaN).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from slime_core.config import SlimeArgs
from slime_core.host_to_device import to_device

logger = logging.getLogger(__name__)

__all__ = [
    "Reducer",
    "default_reducer",
    "drgrpo",
    "sample_means",
    "segment_sums",
    "sum_of_sample_mean",
    "sum_of_token",
]

Reducer = Callable[[torch.Tensor], torch.Tensor]


def segment_sums(x: torch.Tensor, response_lengths: Sequence[int]) -> torch.Tensor:
    """Sum `x` over each sample's span.

    Args:
        x: `[T]` float, concatenated per-token values.
        response_lengths: N ints summing to T (zeros allowed).

    Returns:
        `[N]` float, differentiable in `x`.

    Raises:
        ValueError: if the lengths do not sum to T.
    """
    if sum(response_lengths) != x.shape[0]:
        raise ValueError(f"response lengths sum to {sum(response_lengths)} but there are {x.shape[0]} tokens")
    # Built on the host and copied without a sync: `repeat_interleave` with device lengths reads its output size
    # back to the host (a sync per call; the loss reduces several terms per micro-batch).
    lengths = torch.as_tensor(list(response_lengths), dtype=torch.long)
    segment_ids = to_device(torch.repeat_interleave(torch.arange(len(response_lengths)), lengths), x.device)
    return x.new_zeros(len(response_lengths)).index_add(0, segment_ids, x)


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # where() rather than x·m: a non-finite value at a masked position (e.g. -inf log-prob of padding)
    # must give 0, and inf·0 would be NaN.
    mask = to_device(mask, x.device)
    return torch.where(mask > 0, x * mask, x.new_zeros(()))


def _flat_mask(loss_masks: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    if isinstance(loss_masks, torch.Tensor):
        return loss_masks.float()
    if not loss_masks:
        return torch.zeros(0)
    return torch.cat([m.reshape(-1).float() for m in loss_masks])


def sample_means(
    response_lengths: Sequence[int],
    loss_masks: Sequence[torch.Tensor] | torch.Tensor,
    loss_denominators: Sequence[float],
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Per-sample masked means: `x [T] -> [N]` with entry i = `(Σ_t x_it·m_it) / max(D_i, 1)`.

    The terms `sum_of_sample_mean` adds up. Mask and denominators go to `x`'s device once per device (a loss
    reduces several terms with one reducer), without a host-device sync.

    Args:
        response_lengths: N ints.
        loss_masks: N tensors `[L_i]` or one concatenated `[T]`.
        loss_denominators: N floats `D_i`.

    Raises:
        ValueError: if the denominators do not match the sample count.
    """
    if len(loss_denominators) != len(response_lengths):
        raise ValueError(f"{len(loss_denominators)} loss denominators for {len(response_lengths)} samples")
    mask = _flat_mask(loss_masks)
    denominators = torch.as_tensor(list(loss_denominators), dtype=torch.float32).clamp(min=1.0)
    on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def means(x: torch.Tensor) -> torch.Tensor:
        if x.device not in on_device:
            on_device[x.device] = (to_device(mask, x.device), to_device(denominators, x.device))
        device_mask, device_denominators = on_device[x.device]
        return segment_sums(_masked(x, device_mask), response_lengths) / device_denominators

    return means


def sum_of_sample_mean(
    response_lengths: Sequence[int],
    loss_masks: Sequence[torch.Tensor] | torch.Tensor,
    loss_denominators: Sequence[float],
) -> Reducer:
    """Default reducer: `Σ_i (Σ_t x_it·m_it) / max(D_i, 1)`.

    Args:
        response_lengths: N ints.
        loss_masks: N tensors `[L_i]` or one concatenated `[T]`.
        loss_denominators: N floats `D_i`.

    Returns:
        A reducer `Tensor[T] -> scalar`.

    Raises:
        ValueError: if the denominators do not match the sample count.
    """
    means = sample_means(response_lengths, loss_masks, loss_denominators)

    def reduce(x: torch.Tensor) -> torch.Tensor:
        return means(x).sum()

    return reduce


def sum_of_token(response_lengths: Sequence[int], loss_masks: Sequence[torch.Tensor] | torch.Tensor) -> Reducer:
    """Per-token reducer (`--calculate-per-token-loss`): `Σ_i Σ_t x_it·m_it`.

    Args:
        response_lengths: N ints.
        loss_masks: N tensors `[L_i]` or one concatenated `[T]`.

    Returns:
        A reducer `Tensor[T] -> scalar`.
    """
    mask = _flat_mask(loss_masks)
    total = sum(response_lengths)

    def reduce(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != total:
            raise ValueError(f"response lengths sum to {total} but there are {x.shape[0]} tokens")
        return _masked(x, mask).sum()

    return reduce


def default_reducer(
    calculate_per_token_loss: bool,
    response_lengths: Sequence[int],
    loss_masks: Sequence[torch.Tensor] | torch.Tensor,
    loss_denominators: Sequence[float],
) -> Reducer:
    """`sum_of_token` with `--calculate-per-token-loss`, else `sum_of_sample_mean`."""
    if calculate_per_token_loss:
        return sum_of_token(response_lengths, loss_masks)
    return sum_of_sample_mean(response_lengths, loss_masks, loss_denominators)


def drgrpo(
    total_lengths: Sequence[int] | None,
    response_lengths: Sequence[int],
    loss_masks: Sequence[torch.Tensor],
    calculate_per_token_loss: bool,
    *,
    args: SlimeArgs,
) -> Reducer:
    """Dr.GRPO reducer factory: `Σ_i Σ_t x_it·m_it / C`, `C = args.rollout_max_response_len`.

    Has the `--custom-pg-loss-reducer-function-path` signature
    `(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)` plus the `args`
    keyword, which `compute_actor_loss` passes to factories that accept it.

    Raises:
        ValueError: if `rollout_max_response_len` is not a positive int, or with
            `--calculate-per-token-loss` (the backend would divide by the token count again).
    """
    constant = args.rollout_max_response_len
    if not isinstance(constant, int) or constant <= 0:
        raise ValueError(f"the drgrpo reducer needs --rollout-max-response-len > 0, got {constant!r}")
    if calculate_per_token_loss:
        raise ValueError("the drgrpo reducer cannot be combined with --calculate-per-token-loss")
    per_token = sum_of_token(response_lengths, loss_masks)
    return lambda x: per_token(x) / constant


def drgrpo_config_problems(cfg: SlimeArgs) -> list[str]:
    """What `drgrpo` refuses of the run's flags, found before the run starts (it raises at the first train step).

    The app's plugin check calls a reducer factory's `check_config(cfg)` when it has one.

    Returns:
        One line per problem (empty: the flags suit it).
    """
    problems = []
    if not isinstance(cfg.rollout_max_response_len, int) or cfg.rollout_max_response_len <= 0:
        problems.append("Dr.GRPO divides by --rollout-max-response-len, which is not set")
    if cfg.calculate_per_token_loss:
        problems.append(
            "Dr.GRPO divides by the constant --rollout-max-response-len, and --calculate-per-token-loss would divide "
            "by the token count as well: drop --calculate-per-token-loss"
        )
    return problems


drgrpo.check_config = drgrpo_config_problems  # type: ignore[attr-defined]
