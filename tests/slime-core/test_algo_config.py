"""The algorithms read their fields from the real run config (`SlimeArgs`), not just test namespaces."""

import types

import pytest
import torch

from slime_core.algorithms import compute_actor_loss, compute_advantages_and_returns
from slime_core.config import SlimeArgs

# Tolerance: the same computation twice, exact equality expected (atol 0).


def _config(**kw):
    base = {"rollout_batch_size": 2, "n_samples_per_prompt": 2, "num_rollout": 1, "hf_checkpoint": "/tmp/unused"}
    base.update(kw)
    return SlimeArgs.from_dict(base)


@pytest.mark.parametrize(
    "overrides",
    [
        {"advantage_estimator": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.01, "use_tis": True},
        {"advantage_estimator": "gspo", "eps_clip": 3e-4, "eps_clip_high": 4e-4},
        {"advantage_estimator": "cispo", "eps_clip": 1.0, "eps_clip_high": 4.0, "entropy_coef": 0.01},
        {"advantage_estimator": "reinforce_plus_plus", "normalize_advantages": True, "kl_coef": 0.05, "gamma": 0.9},
        {"advantage_estimator": "reinforce_plus_plus_baseline", "normalize_advantages": True, "kl_coef": 0.05},
        {"advantage_estimator": "grpo", "calculate_per_token_loss": True, "use_opsm": True},
    ],
)
def test_real_config_drives_the_algorithms(overrides):
    args = _config(**overrides)
    g = torch.Generator().manual_seed(0)
    lengths = [3, 2, 4, 1]
    lp = [-torch.rand(n, generator=g) for n in lengths]
    old = [x + 0.1 * torch.randn(n, generator=g) for x, n in zip(lp, lengths, strict=True)]
    ref = [x + 0.1 * torch.randn(n, generator=g) for x, n in zip(lp, lengths, strict=True)]
    masks = [torch.ones(n) for n in lengths]
    adv, ret = compute_advantages_and_returns(
        args, rewards=[1.0, 0.0, 0.5, -1.0], loss_masks=masks, log_probs=old, ref_log_probs=ref
    )
    kw = dict(
        log_probs=[x.requires_grad_(True) for x in lp],
        old_log_probs=old,
        advantages=adv,
        loss_masks=masks,
        loss_denominators=[float(n) for n in lengths],
        ref_log_probs=ref,
        rollout_log_probs=old,
        entropy=[torch.rand(n, generator=g) for n in lengths],
    )
    loss, metrics = compute_actor_loss(args, **kw)
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values())
    loss.backward()
    # same result from a plain namespace holding the config's values
    plain = types.SimpleNamespace(**args.model_dump())
    loss2, metrics2 = compute_actor_loss(plain, **kw)
    assert loss2.item() == loss.item()
    assert metrics2.keys() == metrics.keys()
