"""`train_critic_on_rollout`, the PPO critic's step, driven by a fake critic backend on hand-computed values.

The fake critic's values are fixed per-token bases plus ONE shared scalar `shift` (its only parameter, SGD with
lr 1), so the first optimizer step moves the values the second step sees, which exercises the value clip.
Tolerance: float32 against hand-computed floats, abs 1e-6.
"""

import numpy as np
import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.critic import CriticStepBackend, _prediction_metrics, critic_config, train_critic_on_rollout

ATOL = 1e-6

_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "advantage_estimator": "ppo"})


class FakeCritic:
    """Values `base_i + shift`; `shift` is trained with SGD (lr 1)."""

    def __init__(self, bases: list[torch.Tensor]) -> None:
        self.bases = bases
        self.shift = torch.nn.Parameter(torch.zeros(()))
        self.calls: list[str] = []

    def compute_values(self, batch):
        self.calls.append("compute_values")
        return [(b + self.shift).detach() for b in self.bases]

    def all_reduce_sum(self, tensor):
        return tensor

    def forward_backward(self, batch, step, loss_fn, *, denominator):
        self.calls.append(f"forward_backward:{step}")
        self.shift.grad = None
        out = []
        for ids in batch.micro_batches[step]:
            loss, metrics = loss_fn(ids, [self.bases[i] + self.shift for i in ids])
            (loss / denominator).backward()
            out.append(metrics)
        return out

    def optimizer_step(self):
        grad = float(self.shift.grad)
        with torch.no_grad():
            self.shift -= self.shift.grad
        return abs(grad), 1.0

    def reduce_metric_sums(self, sums):
        return dict(sums)

    def reset_optimizer_states(self):
        self.calls.append("reset_optimizer_states")


def _batch() -> RolloutBatch:
    """Step 0: sample 0 (2 tokens, reward 1); step 1: sample 1 (1 token, reward 0)."""
    return RolloutBatch(
        tokens=[torch.arange(4), torch.arange(3)],
        response_lengths=[2, 1],
        loss_masks=[torch.ones(2), torch.ones(1)],
        rewards=[1.0, 0.0],
        raw_rewards=[1.0, 0.0],
        loss_denominators=[2.0, 1.0],
        micro_batches=[[[0]], [[1]]],
        step_sample_counts=[1, 1],
        step_token_counts=[2.0, 1.0],
    )


def test_gae_returns_value_clip_and_prediction_metrics_by_hand():
    """γ = λ = 0.5, V0 = [0.2, 0.4], r0 = 1: δ = [0.5·0.4 - 0.2, 1 - 0.4] = [0, 0.6], A = [0.25·0.6, 0.6],
    R0 = A + V = [0.35, 1.0]; V1 = [0.5], r1 = 0: R1 = [0].

    Step 0 (V = V_old): loss = ((0.2-0.35)² + (0.4-1)²)/2 = 0.19125; d/dshift = (-0.15) + (-0.6) = -0.75 → shift 0.75.
    Step 1: V = 1.25, V_old = 0.5 → clipped (|0.75| > 0.2), V_clip = 0.7, loss = max(0.7², 1.25²) = 1.5625;
    grad 2·1.25 = 2.5."""
    batch = _batch()
    critic = FakeCritic([torch.tensor([0.2, 0.4]), torch.tensor([0.5])])
    assert isinstance(critic, CriticStepBackend)
    cfg = critic_config(_CONFIG.model_copy(update={"gamma": 0.5, "lambd": 0.5, "value_clip": 0.2}))
    metrics, values = train_critic_on_rollout(cfg, critic, 0, batch)
    assert critic.calls == ["compute_values", "forward_backward:0", "forward_backward:1"]
    torch.testing.assert_close(values[0], torch.tensor([0.2, 0.4]))  # the values before the update
    torch.testing.assert_close(values[1], torch.tensor([0.5]))
    assert float(critic.shift.detach()) == pytest.approx(0.75 - 2.5, abs=ATOL)
    assert metrics["train/critic-value_loss"] == pytest.approx((0.19125 + 1.5625) / 2, abs=ATOL)
    assert metrics["train/critic-value_clipfrac"] == pytest.approx(0.5, abs=ATOL)  # step 1 fully clipped
    assert metrics["train/critic-grad_norm"] == pytest.approx((0.75 + 2.5) / 2, abs=ATOL)
    v, r = np.array([0.2, 0.4, 0.5]), np.array([0.35, 1.0, 0.0])
    assert metrics["train/critic-explained_variance"] == pytest.approx(1 - np.var(r - v) / np.var(r), abs=1e-6)
    assert metrics["train/critic-value_mean"] == pytest.approx(v.mean(), abs=ATOL)
    assert metrics["train/critic-return_mean"] == pytest.approx(r.mean(), abs=ATOL)
    assert metrics["train/critic-return_std"] == pytest.approx(r.std(), abs=ATOL)
    assert metrics["train/critic-lr"] == 1.0


def test_masked_tokens_leave_the_metrics_and_constant_returns_leave_out_explained_variance():
    batch = _batch()
    batch.loss_masks = [torch.tensor([1.0, 0.0]), torch.ones(1)]
    batch.rewards = [0.0, 0.0]
    critic = FakeCritic([torch.tensor([0.0, 5.0]), torch.tensor([0.0])])
    cfg = critic_config(_CONFIG.model_copy(update={"reset_optimizer_states": True}))
    metrics, _ = train_critic_on_rollout(cfg, critic, 0, batch)
    assert critic.calls[0] == "reset_optimizer_states"
    # γ = λ = 1: every return is the reward, 0; the masked value 5.0 is in neither metric.
    assert metrics["train/critic-value_mean"] == 0.0 and metrics["train/critic-return_mean"] == 0.0
    # Var(R) = 0: undefined, so no point (a NaN made the tracker warn on every such rollout); return_std says why.
    assert "train/critic-explained_variance" not in metrics and metrics["train/critic-return_std"] == 0.0
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["train/critic-value_loss"] == 0.0  # sample 0: (0-0)² on its one trained token


@pytest.mark.parametrize("reward", [123.456, 1e4, 3.7e-7])
def test_equal_returns_of_any_scale_leave_out_explained_variance(reward):
    """8k equal float32 returns: the one-pass `ΣR²/n - mean²` was 1e-10 at 123.456 (explained variance -5e11)
    and the absolute 1e-12 cut called returns of scale 1e-7 equal even where they differ."""
    n = 1000
    values = [torch.randn(n, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    returns = [torch.full((n,), reward, dtype=torch.float32) for _ in range(8)]
    masks = [torch.ones(n) for _ in range(8)]
    metrics = _prediction_metrics(FakeCritic([]), values, returns, masks)
    assert "explained_variance" not in metrics and metrics["return_std"] == 0.0
    # Returns that do differ at that scale keep a finite explained variance, as numpy computes it (rel 1e-9).
    returns[0] = returns[0] * torch.linspace(0.5, 1.5, n)
    metrics = _prediction_metrics(FakeCritic([]), values, returns, masks)
    v, r = torch.cat(values).double().numpy(), torch.cat(returns).double().numpy()
    assert metrics["explained_variance"] == pytest.approx(1 - np.var(r - v) / np.var(r), rel=1e-9)
    assert metrics["return_std"] == pytest.approx(np.std(r), rel=1e-9)


def test_no_steps_is_an_error():
    batch = _batch()
    batch.micro_batches = []
    with pytest.raises(ValueError, match="no optimizer step"):
        train_critic_on_rollout(critic_config(_CONFIG), FakeCritic([torch.zeros(2), torch.zeros(1)]), 0, batch)
