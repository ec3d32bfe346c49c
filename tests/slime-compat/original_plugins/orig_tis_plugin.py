"""A custom TIS function written for the original slime (THUDM/slime), as its author would write it there.

`--custom-tis-function-path orig_tis_plugin.geometric_tis`: one weight per response, the geometric mean of the
token ratios capped at `--tis-clip`, computed on the whole response (gathered over context-parallel ranks with
the original's `cp_utils`, then sliced back), plus the original's token-level `tis` metrics from
`slime.backends.megatron_utils.loss.vanilla_tis_function`.
"""

import torch

from slime.backends.megatron_utils.loss import vanilla_tis_function


def geometric_tis(
    args,
    *,
    pg_loss,
    train_log_probs,
    rollout_log_probs,
    loss_masks,
    total_lengths,
    response_lengths,
    **kwargs,
):
    from slime.backends.megatron_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp

    weights = []
    for train, rollout, mask, total, response in zip(
        train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths, strict=False
    ):
        full_train = all_gather_with_cp(train, total, response)
        full_rollout = all_gather_with_cp(rollout, total, response)
        mean_log_ratio = ((full_train - full_rollout) * mask).sum() / mask.sum().clamp(min=1)
        weight = torch.exp(mean_log_ratio).clamp(max=args.tis_clip) * torch.ones_like(full_train)
        weights.append(slice_log_prob_with_cp(weight, total, response))
    weights = torch.cat(weights)

    _, _, token_metrics = vanilla_tis_function(
        args,
        pg_loss=pg_loss,
        train_log_probs=train_log_probs,
        rollout_log_probs=rollout_log_probs,
        loss_masks=loss_masks,
    )
    metrics = {"geo_weight": weights.clone().detach(), "tis": token_metrics["tis"]}
    return pg_loss * weights, loss_masks, metrics
