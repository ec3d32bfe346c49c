"""`slime.backends.megatron_utils.cp_utils`: the context-parallel helpers custom TIS/MIS functions call.

In the original a loss plugin sees each rank's shard of a response under context parallelism and calls
`all_gather_with_cp` / `slice_log_prob_with_cp` to move between the shard and the whole response. Here both
backends hand the loss whole responses (shards are gathered before it), so a plugin's gather and slice are the
identity: the same code gives the same numbers at any context-parallel size. `get_sum_of_sample_mean` builds the
loss reducer (`slime_core.algorithms.reducers`), for custom `--custom-pg-loss-reducer-function-path` factories.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from slime_core.algorithms.reducers import sum_of_sample_mean, sum_of_token

__all__ = ["all_gather_with_cp", "get_sum_of_sample_mean", "slice_log_prob_with_cp"]


def _check_length(name: str, values: Sequence, total_length: int, response_length: int) -> None:
    if len(values) != response_length:
        raise ValueError(
            f"{name}: {len(values)} values for a response of {response_length} tokens (total length {total_length}); "
            "the loss gets whole responses here, one value per response token"
        )


def all_gather_with_cp(tensor: torch.Tensor, total_length: int, response_length: int) -> torch.Tensor:
    """The whole response's values `[response_length, ...]`: `tensor` itself (it already is the whole response).

    Raises:
        ValueError: `tensor` does not have `response_length` rows.
    """
    _check_length("all_gather_with_cp", tensor, total_length, response_length)
    return tensor


def slice_log_prob_with_cp(
    log_prob: list[float] | torch.Tensor, total_length: int, response_length: int
) -> list[float] | torch.Tensor:
    """This rank's part of a whole response's values: all of them (`log_prob` itself), as at context parallel 1.

    Raises:
        ValueError: `log_prob` does not have `response_length` entries.
    """
    _check_length("slice_log_prob_with_cp", log_prob, total_length, response_length)
    return log_prob


def get_sum_of_sample_mean(
    total_lengths: list[int],
    response_lengths: list[int],
    loss_masks: list[torch.Tensor],
    sample_denoms: list[torch.Tensor] | list[float] | torch.Tensor | None = None,
    calculate_per_token_loss: bool = False,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The micro-batch reducer `x [T] -> scalar`: `Σ_i Σ_t x_it·m_it / max(D_i, 1)`, or `Σ_i Σ_t x_it·m_it`.

    Args:
        total_lengths: N prompt+response lengths (unused: responses are whole here).
        response_lengths: N `L_i`, summing to T.
        loss_masks: N `[L_i]` in {0, 1}.
        sample_denoms: N denominators `D_i` (default: each sample's mask sum).
        calculate_per_token_loss: the masked token sum instead (`--calculate-per-token-loss`).

    Returns:
        The reducer (`slime_core.algorithms.reducers.sum_of_sample_mean` / `sum_of_token`).
    """
    if calculate_per_token_loss:
        return sum_of_token(response_lengths, loss_masks)
    if sample_denoms is None:
        denoms = [float(m.sum()) for m in loss_masks]
    else:
        denoms = [float(d) for d in sample_denoms]
    return sum_of_sample_mean(response_lengths, loss_masks, denoms)
