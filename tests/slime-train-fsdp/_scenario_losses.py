"""The loss-type scenario `loss_types`: --loss-type sft_loss / custom_loss, --freeze-params-name-list and
--only-train-params-name-list, and the policy loss's refusal without advantages."""

from __future__ import annotations

import pathlib
import sys
import types

import torch
from slime_fsdp_test_worker_common import full_params, make_args, make_batch

from slime_train_fsdp import FSDPTrainBackend


def _custom_loss(args, batch, logits, sum_of_sample_mean):
    """`--custom-loss-function-path` plugin of `scenario_loss_types`: twice the SFT loss; records its inputs."""
    _custom_loss.seen.append(
        {
            "advantages_none": batch["advantages"] is None,
            "entropy_grad": all(e.requires_grad for e in logits["entropy"]),
            "token_lengths": [int(t.numel()) for t in batch["tokens"]],
            "total_lengths": list(batch["total_lengths"]),
        }
    )
    nll = -sum_of_sample_mean(torch.cat(logits["log_probs"]))
    return 2.0 * nll, {"nll": nll}


_custom_loss.seen = []


def scenario_loss_types(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """--loss-type sft_loss / custom_loss with --disable-compute-advantages-and-returns, from the same weights."""
    plugin = types.ModuleType("slime_fsdp_test_custom_loss")
    plugin.loss = _custom_loss
    sys.modules[plugin.__name__] = plugin
    batch = make_batch(0, 1)
    res: dict = {}
    sft = FSDPTrainBackend()
    sft.init(make_args(ckpt, loss_type="sft_loss", disable_compute_advantages_and_returns=True), with_ref=False)
    res["before"] = sft.compute_log_probs(batch)
    sft.train(0, batch)
    res["sft_steps"], res["sft_after"] = sft.step_metrics, sft.compute_log_probs(batch)
    del sft
    custom = FSDPTrainBackend()
    args = make_args(
        ckpt,
        loss_type="custom_loss",
        custom_loss_function_path=f"{plugin.__name__}.loss",
        disable_compute_advantages_and_returns=True,
    )
    custom.init(args, with_ref=False)
    custom.train(0, batch)
    res["custom_steps"], res["custom_seen"] = custom.step_metrics, list(_custom_loss.seen)
    del custom
    for key, flags in (
        ("freeze", {"freeze_params_name_list": [r"\.mlp\.", "embed_tokens"]}),
        ("only_train", {"only_train_params_name_list": [r"layers\.1\.self_attn\.", "lm_head"]}),
    ):
        f = FSDPTrainBackend()
        f.init(make_args(ckpt, **flags), with_ref=False)
        before_params = full_params(f)
        f.train(0, batch)
        res[key] = {n: bool((p != before_params[n]).any()) for n, p in full_params(f).items()}
        del f
    policy = FSDPTrainBackend()
    # Validation rejects this combination; the copy skips it to reach the loss's own check.
    policy.init(make_args(ckpt).model_copy(update={"disable_compute_advantages_and_returns": True}), with_ref=False)
    try:
        policy.train(0, batch)
    except ValueError as exc:
        res["policy_error"] = str(exc)
    return res
