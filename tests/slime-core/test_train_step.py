"""`train_on_rollout`, the shared RL step, driven by a fake backend on tiny tensors.

The fake backend's "model" is one parameter per sample holding that sample's response log-probs, so every
value is known by hand. It plays rank 0 of `dp` identical data-parallel ranks: its collectives multiply by
`dp` (the other ranks contribute the same sums). Tolerance: float32 values against hand-computed floats,
abs 1e-6.
"""

import json
import math

import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.flops import model_config
from slime_core.train_step import (
    StepBackend,
    can_reuse_old_log_probs,
    runs_no_grad_forward,
    step_denominator,
    train_on_rollout,
)

ATOL = 1e-6

# A real, validated run config; tests set fields with model_copy.
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _cfg(**fields) -> SlimeArgs:
    return _CONFIG.model_copy(update=fields)


class FakeBackend:
    """`StepBackend` over per-sample log-prob parameters, SGD with lr 0.1, recording every call."""

    def __init__(self, batch: RolloutBatch, *, dp: int = 1, with_ref: bool = False) -> None:
        self.params = [torch.nn.Parameter(torch.full((n,), -1.0)) for n in batch.response_lengths]
        self.entropy = [torch.nn.Parameter(torch.full((n,), 0.5)) for n in batch.response_lengths]
        self.dp, self.lr, self.steps = dp, 0.1, 0
        self.ref = [p.detach().clone() for p in self.params] if with_ref else None
        self.teacher: list[torch.Tensor] | None = None  # tests set per-sample teacher log-probs
        self.calls: list[str] = []
        self.denominators: list[float] = []
        self.entropy_got_grad: list[bool] = []

    @property
    def has_ref(self) -> bool:
        return self.ref is not None

    @property
    def has_teacher(self) -> bool:
        return self.teacher is not None

    def compute_log_probs(self, batch, *, model="actor"):
        self.calls.append(f"log_probs:{model}")
        source = {"ref": self.ref, "teacher": self.teacher}.get(model, self.params)
        return [p.detach().clone() for p in source]

    def all_reduce_sum(self, tensor):
        self.calls.append("all_reduce_sum")
        return tensor * self.dp

    def forward_backward(self, batch, step, loss_fn, *, denominator):
        self.calls.append(f"forward_backward:{step}")
        self.denominators.append(denominator)
        for p in self.params + self.entropy:
            p.grad = None
        out = []
        for ids in batch.micro_batches[step]:
            if not ids:
                continue
            log_probs = [self.params[i] * 1.0 for i in ids]
            entropy = [self.entropy[i] * 1.0 for i in ids]
            loss, metrics = loss_fn(ids, log_probs, entropy)
            (loss / denominator).backward()
            self.entropy_got_grad += [self.entropy[i].grad is not None for i in ids]
            out.append(metrics)
        return out

    def optimizer_step(self):
        self.calls.append("optimizer_step")
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = float(torch.cat([g.reshape(-1) for g in grads]).norm()) if grads else 0.0
        lr = self.lr * (self.steps + 1)  # a visible schedule: 0.1, 0.2, ...
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    p -= self.lr * p.grad
        self.steps += 1
        return norm, lr

    def reduce_metric_sums(self, sums):
        self.calls.append("reduce_metric_sums")
        return {k: v * self.dp for k, v in sums.items()}

    def reset_optimizer_states(self):
        self.calls.append("reset_optimizer_states")

    def update_ref(self):
        self.calls.append("update_ref")
        self.ref = [p.detach().clone() for p in self.params]


def _batch(num_steps=1, *, dp=1, rollout_log_probs=False) -> RolloutBatch:
    """Per step 2 samples of 2 and 3 response tokens (one masked token), rewards +1 / -0.5."""
    lengths = [2, 3] * num_steps
    return RolloutBatch(
        tokens=[torch.arange(n + 2) for n in lengths],
        response_lengths=lengths,
        loss_masks=[torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0])] * num_steps,
        rewards=[1.0, -0.5] * num_steps,
        raw_rewards=[1.0, 0.0] * num_steps,
        loss_denominators=[2.0, 2.0] * num_steps,
        rollout_log_probs=[torch.full((n,), -1.0) for n in lengths] if rollout_log_probs else None,
        micro_batches=[[[2 * s], [2 * s + 1], []] for s in range(num_steps)],  # an empty slot on this rank
        step_sample_counts=[2 * dp] * num_steps,
        step_token_counts=[4.0 * dp] * num_steps,
    )


def test_step_denominator_sample_or_token_count():
    batch = _batch(2, dp=2)
    assert step_denominator(_cfg(), batch, 1) == 4.0
    assert step_denominator(_cfg(calculate_per_token_loss=True), batch, 0) == 8.0
    batch.step_sample_counts = [0, 0]
    assert step_denominator(_cfg(), batch, 0) == 1.0  # clamped: an empty step divides by 1
    batch.step_token_counts = [1.0]
    with pytest.raises(ValueError, match="step_token_counts must have one entry per step"):
        step_denominator(_cfg(calculate_per_token_loss=True), batch, 0)


def test_reuse_rule():
    one, two = _batch(1), _batch(2)
    assert can_reuse_old_log_probs(_cfg(), one)
    assert can_reuse_old_log_probs(_cfg(advantage_estimator="reinforce_plus_plus_baseline"), one)
    assert not can_reuse_old_log_probs(_cfg(), two)  # the second step's weights have moved
    assert not can_reuse_old_log_probs(_cfg(kl_coef=0.1), one)  # reward KL needs them before training
    assert not can_reuse_old_log_probs(_cfg(advantage_estimator="gspo"), one)  # the spec says no
    assert not can_reuse_old_log_probs(_cfg(advantage_estimator="rloo"), one)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, False),  # one step: old = detach(current)
        ({"num_steps_per_rollout": 2}, True),
        ({"kl_coef": 0.1}, True),  # reward KL: old and reference log-probs before training
        ({"use_kl_loss": True, "kl_loss_coef": 0.01}, True),  # the reference forward
        ({"advantage_estimator": "gspo"}, True),  # its spec reuses nothing
        ({"use_rollout_logprobs": True}, False),
        ({"use_rollout_logprobs": True, "get_mismatch_metrics": True}, False),  # taken from the training forward
        ({"use_rollout_logprobs": True, "get_mismatch_metrics": True, "num_steps_per_rollout": 2}, True),
        ({"loss_type": "sft_loss", "num_steps_per_rollout": 2}, False),  # the NLL never reads them
    ],
)
def test_runs_no_grad_forward_says_what_a_step_does(fields, expected):
    """The compile warm-up's predicate (`runs_no_grad_forward`, from the config) against the step itself: a step
    at that config calls `compute_log_probs` exactly when the predicate says so."""
    cfg = _cfg(**fields)
    steps = cfg.num_steps_per_rollout or 1
    batch = _batch(steps, rollout_log_probs=cfg.use_rollout_logprobs)
    backend = FakeBackend(batch, with_ref=cfg.with_ref)
    train_on_rollout(cfg, backend, 0, batch)
    assert any(call.startswith("log_probs:") for call in backend.calls) is expected, backend.calls
    assert runs_no_grad_forward(cfg) is expected


def test_one_step_grpo_by_hand_and_reused_log_probs():
    """Ratio 1 (old = detach(current)): pg_loss = -Σ_i r_i·(Σ_t m_t)/D_i summed over 2 identical DP ranks and
    divided by the global 4 samples = -(1·2/2 - 0.5·2/2)·2/4 = -0.25; no separate old-log-prob forward."""
    batch = _batch(1, dp=2)
    backend = FakeBackend(batch, dp=2)
    assert isinstance(backend, StepBackend)
    metrics, steps = train_on_rollout(_cfg(), backend, 0, batch)
    # One reduce_metric_sums after the last step: the steps' metrics, the goodput counts and the rollout means.
    assert backend.calls == ["forward_backward:0", "optimizer_step", "reduce_metric_sums"]
    assert backend.denominators == [4.0]
    assert metrics["train/pg_loss"] == pytest.approx(-0.25, abs=ATOL)
    assert metrics["train/loss"] == pytest.approx(-0.25, abs=ATOL)
    assert metrics["train/ppo_kl"] == 0.0 and metrics["train/pg_clipfrac"] == 0.0
    # entropy_loss: each sample's masked mean of 0.5 (2 and 2 trained tokens over D=2) → 0.5 + 0.5, ×2 ranks, /4.
    assert metrics["train/entropy_loss"] == pytest.approx(0.5, abs=ATOL)
    assert metrics["train/lr"] == pytest.approx(0.1)
    assert {k for k in metrics if k.startswith("train/")} == {
        "train/loss",
        "train/pg_loss",
        "train/pg_clipfrac",
        "train/ppo_kl",
        "train/entropy_loss",
        "train/grad_norm",
        "train/global_batch_size",
        "train/lr",
        "train/lr-pg_0",  # the original's name
    }
    # Goodput: 2 + 2 trainable tokens, every advantage non-zero (rewards +1, -0.5), on 2 identical DP ranks.
    assert metrics["goodput/tokens_trained"] == 8.0 and metrics["goodput/tokens_zero_advantage"] == 0.0
    assert {"perf/log_probs_time", "perf/ref_log_probs_time", "perf/actor_train_time"} <= set(metrics)
    assert metrics["perf/actor_train_time"] >= 0.0
    assert steps == [{k: v for k, v in metrics.items() if k.startswith("train/")}]
    assert backend.entropy_got_grad == [False, False]  # --entropy-coef 0: the entropy is detached
    # d loss/d lp = -A·m/D/denominator: sample 0 → -1/2/4 per token; the SGD step raised its log-probs.
    torch.testing.assert_close(backend.params[0].detach(), torch.full((2,), -1.0 + 0.1 / 8))


def test_two_steps_compute_old_log_probs_once_and_average():
    batch = _batch(2)
    backend = FakeBackend(batch)
    metrics, steps = train_on_rollout(_cfg(entropy_coef=0.01), backend, 3, batch)
    assert backend.calls == [
        "log_probs:actor",
        *("forward_backward:0", "optimizer_step"),
        *("forward_backward:1", "optimizer_step"),
        "reduce_metric_sums",  # once for both steps: no device read between the steps
    ]
    assert len(steps) == 2 and steps[0]["train/lr"] == pytest.approx(0.1) and metrics["train/lr"] == 0.2
    for key in ("train/pg_loss", "train/grad_norm", "train/entropy_loss"):
        assert metrics[key] == pytest.approx((steps[0][key] + steps[1][key]) / 2, abs=ATOL)
    assert all(backend.entropy_got_grad)  # --entropy-coef != 0: the entropy keeps its graph


def test_a_pipeline_stage_without_the_loss_reports_the_last_stages_train_metrics():
    """PP 2: rank 0 (first stage; a run logs its metrics) computes no loss and is handed the last stage's sums by
    `reduce_metric_sums`; it reported no train/loss, pg_loss, entropy_loss, ... (named from its own empty metrics)."""
    last = FakeBackend(_batch(2))
    reduce = last.reduce_metric_sums
    last.reduce_metric_sums = lambda sums: setattr(last, "sums", reduce(sums)) or last.sums
    last_metrics, last_steps = train_on_rollout(_cfg(entropy_coef=0.01), last, 0, _batch(2))
    first = FakeBackend(_batch(2))
    first.forward_backward = lambda *args, **kwargs: []  # no loss on this stage
    first.reduce_metric_sums = lambda sums: dict(last.sums)
    first_metrics, first_steps = train_on_rollout(_cfg(entropy_coef=0.01), first, 0, _batch(2))
    names = ("train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/entropy_loss")
    assert last_metrics["train/loss"] != 0.0
    for got, expected in zip([first_metrics, *first_steps], [last_metrics, *last_steps], strict=True):
        assert {k: got[k] for k in names} == {k: expected[k] for k in names}


@pytest.mark.parametrize("num_steps", [1, 2])
def test_the_originals_trainer_side_rollout_means(num_steps):
    """`rollout/log_probs`, `rollout/ref_log_probs`, `rollout/advantages` as the original's `log_rollout_data`:
    per sample the mean over trainable tokens, then the mean over the samples of all DP ranks. One step reuses the
    training forward's log-probs (recorded there), two steps compute them first: the same values."""
    batch = _batch(num_steps, dp=2)
    backend = FakeBackend(batch, dp=2, with_ref=True)
    with torch.no_grad():
        for s in range(num_steps):  # sample means -2 and -1 (the masked -9 left out)
            backend.params[2 * s].copy_(torch.tensor([-1.0, -3.0]))
            backend.params[2 * s + 1].copy_(torch.tensor([-0.5, -9.0, -1.5]))
    backend.ref = [p.detach().clone() - 1.0 for p in backend.params]
    metrics, _ = train_on_rollout(_cfg(), backend, 0, batch)
    assert ("log_probs:actor" in backend.calls) == (num_steps == 2)
    assert metrics["rollout/log_probs"] == pytest.approx(-1.5, abs=ATOL)  # (-2 - 1) / 2, on 2 identical ranks
    assert metrics["rollout/ref_log_probs"] == pytest.approx(-2.5, abs=ATOL)
    # GRPO: every token of a sample carries its (already normalized) reward +1 / -0.5, its return too.
    assert metrics["rollout/advantages"] == pytest.approx(0.25, abs=ATOL)
    assert metrics["rollout/returns"] == pytest.approx(0.25, abs=ATOL)
    assert "rollout/values" not in metrics  # no critic
    assert metrics["goodput/tokens_trained"] == 8.0 * num_steps  # the shared reduction keeps the goodput counts


def _k3(d: float) -> float:
    return math.exp(-d) - 1 + d


@pytest.mark.parametrize(
    ("kl_type", "expected"),
    [
        ("k1", ((0.5 + 1.0) / 2 + (1.0 + 2.0) / 2) / 2),
        ("k3", ((_k3(0.5) + _k3(1.0)) / 2 + (_k3(1.0) + _k3(2.0)) / 2) / 2),
    ],
)
def test_rollout_kl_is_the_reward_shaping_kl_the_advantages_used(kl_type, expected):
    """`rollout/kl` with `--kl-coef`, the original's `rollout_data["kl"]` in `log_rollout_data`.

    It was not written, so a `--kl-coef` run's KL penalty could not be watched. Old minus reference log-prob
    per token: sample 0 [0.5, 1.0], sample 1 [1.0, (masked) 5.0, 2.0]; per sample the mean of the estimator over
    trainable tokens, then over the 2 rollouts (the other `rollout/*` means). Without `--kl-coef`: no key.
    """
    batch = _batch(1)
    backend = FakeBackend(batch, with_ref=True)
    with torch.no_grad():
        backend.params[0].copy_(torch.tensor([-1.0, -2.0]))
        backend.params[1].copy_(torch.tensor([-1.0, -9.0, -3.0]))
    backend.ref = [
        backend.params[0].detach() - torch.tensor([0.5, 1.0]),
        backend.params[1].detach() - torch.tensor([1.0, 5.0, 2.0]),
    ]
    metrics, _ = train_on_rollout(_cfg(kl_coef=0.1, kl_loss_type=kl_type), backend, 0, batch)
    assert metrics["rollout/kl"] == pytest.approx(expected, abs=ATOL)
    metrics, _ = train_on_rollout(_cfg(kl_coef=0.0), FakeBackend(batch, with_ref=True), 0, batch)
    assert "rollout/kl" not in metrics


def test_rollout_mean_sums_have_the_same_names_on_a_rank_without_samples():
    # Megatron all-reduces the sums as one vector in name order: a rank with no samples must send the same names.
    from slime_core.step_metrics import rollout_mean_sums as _rollout_mean_sums
    from slime_core.step_metrics import rollout_means as _rollout_means

    empty = RolloutBatch(
        tokens=[], response_lengths=[], loss_masks=[], rewards=[], raw_rewards=[], loss_denominators=[],
        micro_batches=[[[]]], step_sample_counts=[0], step_token_counts=[0.0],
    )  # fmt: skip
    sums = _rollout_mean_sums(empty, {"log_probs": {}, "ref_log_probs": None, "advantages": []})
    assert sums == {"rollout/log_probs.sum": 0.0, "rollout/log_probs.count": 0.0, "rollout/advantages.sum": 0.0,
                    "rollout/advantages.count": 0.0}  # fmt: skip
    assert _rollout_means(sums, 0) == {}  # nothing to average anywhere: no key rather than a division by zero


def test_a_fanned_out_rollout_is_one_rollout_in_the_loss_and_the_rollout_means_as_in_the_original():
    # One rollout fanned out into two samples (2 and 3 trainable tokens, rewards +1 / -0.5 broadcast as GRPO
    # advantages): they share its mask total 5 as denominator (slime/ray/rollout.py `rollout_mask_sums`) and the
    # step counts 1 rollout (`global_batch_sizes`). The original (megatron_utils/loss.py: loss_function,
    # observability/train_metric_utils.py: reduce_train_step_metrics, log_rollout_data) then gives, by hand:
    #   rollout/advantages = (1·2 + (-0.5)·3) / 5 / 1 rollout = 0.1   (not the mean of sample means (1 - 0.5)/2 = 0.25)
    #   train/pg_loss      = -(1·2 - 0.5·3) / 5 / 1 = -0.1            (ratio 1: each token's PPO loss is -A)
    batch = RolloutBatch(
        tokens=[torch.arange(4), torch.arange(5)],
        response_lengths=[2, 3],
        loss_masks=[torch.ones(2), torch.ones(3)],
        rewards=[1.0, -0.5],
        raw_rewards=[1.0, 0.0],
        loss_denominators=[5.0, 5.0],
        micro_batches=[[[0], [1]]],
        step_sample_counts=[2],
        step_rollout_counts=[1],
        step_token_counts=[5.0],
    )
    backend = FakeBackend(batch)
    metrics, _ = train_on_rollout(_cfg(), backend, 0, batch)
    assert backend.denominators == [1.0]
    assert metrics["train/global_batch_size"] == 1.0  # the original's per-step metric: rollouts, not samples
    assert metrics["rollout/advantages"] == pytest.approx(0.1, abs=ATOL)
    assert metrics["rollout/returns"] == pytest.approx(0.1, abs=ATOL)
    assert metrics["rollout/log_probs"] == pytest.approx(-1.0, abs=ATOL)  # every log-prob is -1
    assert metrics["train/pg_loss"] == pytest.approx(-0.1, abs=ATOL)


def test_rollout_log_probs_ref_whitening_reset_and_ref_update():
    batch = _batch(2, rollout_log_probs=True)
    backend = FakeBackend(batch, with_ref=True)
    cfg = _cfg(
        use_rollout_logprobs=True,
        normalize_advantages=True,
        advantage_estimator="reinforce_plus_plus_baseline",
        reset_optimizer_states=True,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        ref_update_interval=2,
    )
    metrics, _ = train_on_rollout(cfg, backend, 0, batch)
    assert backend.calls[:3] == ["reset_optimizer_states", "log_probs:ref", "all_reduce_sum"]
    assert "log_probs:actor" not in backend.calls  # the engine's log-probs are the old ones
    assert "update_ref" not in backend.calls  # (0 + 1) % 2 != 0
    assert {"train/kl_loss", "train/train_rollout_logprob_abs_diff"} <= set(metrics)
    train_on_rollout(cfg, backend, 1, batch)
    assert backend.calls[-1] == "update_ref"  # (1 + 1) % 2 == 0: the reference follows the actor


def test_sft_loss_skips_old_log_probs_and_advantages():
    batch = _batch(2)
    backend = FakeBackend(batch)
    cfg = _cfg(loss_type="sft_loss", disable_compute_advantages_and_returns=True)
    metrics, steps = train_on_rollout(cfg, backend, 0, batch)
    assert "log_probs:actor" not in backend.calls
    assert backend.calls[:2] == ["forward_backward:0", "optimizer_step"]
    assert {k for k in metrics if k.startswith("train/")} == {
        "train/loss",
        "train/grad_norm",
        "train/global_batch_size",
        "train/lr",
        "train/lr-pg_0",
    }
    # No advantages: every trainable token (4 samples × 2) carries a gradient.
    assert metrics["goodput/tokens_trained"] == 8.0 and metrics["goodput/tokens_zero_advantage"] == 0.0
    # Step 0: NLL -Σ_i (Σ_t m_t·lp_t)/D_i = -(-2/2) - (-2/2) = 2, divided by the step's 2 samples.
    assert steps[0]["train/loss"] == pytest.approx(1.0, abs=ATOL)


def test_goodput_counts_zero_advantage_tokens():
    """A zero reward (a group with equal rewards) gives zero advantages: its trainable tokens teach nothing."""
    batch = _batch(1)
    batch.rewards = [0.0, -0.5]
    metrics, _ = train_on_rollout(_cfg(), FakeBackend(batch), 0, batch)
    assert metrics["goodput/tokens_trained"] == 2.0  # sample 1: tokens 0 and 2 (token 1 is masked)
    assert metrics["goodput/tokens_zero_advantage"] == 2.0  # sample 0: both tokens


def test_errors():
    with pytest.raises(ValueError, match="--use-rollout-logprobs needs rollout log-probs"):
        train_on_rollout(_cfg(use_rollout_logprobs=True), FakeBackend(_batch()), 0, _batch())
    empty = _batch()
    empty.micro_batches = []
    with pytest.raises(ValueError, match="no optimizer step"):
        train_on_rollout(_cfg(), FakeBackend(_batch()), 0, empty)


def test_ppo_advantages_use_the_critic_values():
    """γ = λ = 1: A_t = r - V_t. Sample 0: 1 - [0.25, 0.5] = [0.75, 0.5]; sample 1: -0.5 on every token. At ratio 1
    pg_loss = -Σ_i (Σ_t A_t·m_t)/D_i / 2 samples = -((0.75 + 0.5)/2 + (-0.5 - 0.5)/2) / 2 = -0.0625."""
    batch = _batch(1)
    batch.values = [torch.tensor([0.25, 0.5]), torch.zeros(3)]
    backend = FakeBackend(batch)
    cfg = _cfg(advantage_estimator="ppo", gamma=1.0, lambd=1.0)
    metrics, _ = train_on_rollout(cfg, backend, 0, batch)
    assert backend.calls[0] == "log_probs:actor"  # the ppo spec never reuses the training forward's log-probs
    assert metrics["train/pg_loss"] == pytest.approx(-0.0625, abs=ATOL)
    # The original's rollout means: values (0.375 + 0) / 2, returns = A + V = r: (1 - 0.5) / 2, advantages
    # (0.625 - 0.5) / 2 (sample 1's masked middle token left out).
    assert metrics["rollout/values"] == pytest.approx(0.1875, abs=ATOL)
    assert metrics["rollout/returns"] == pytest.approx(0.25, abs=ATOL)
    assert metrics["rollout/advantages"] == pytest.approx(0.0625, abs=ATOL)
    batch.values = None
    with pytest.raises(ValueError, match="ppo needs the critic's values in RolloutBatch.values"):
        train_on_rollout(cfg, FakeBackend(batch), 0, batch)


@pytest.mark.parametrize("teacher_source", ["batch", "backend"])
def test_opd_reverse_kl_in_advantages_and_metric(teacher_source):
    """old lp = -1 everywhere; teacher s0 [-1.5, -0.5], s1 [-1, -1, -2] → d = old - teacher = [0.5, -0.5], [0, 0, 1].
    A = r - 0.5·d = [0.75, 1.25], [-0.5, -0.5, -1]; pg_loss = -((0.75 + 1.25)/2 + (-0.5 - 1)/2)/2 = -0.125;
    opd_reverse_kl = ((0.5 - 0.5)/2 + (0 + 1)/2)/2 = 0.25 (sample 1's middle token is masked out)."""
    batch = _batch(1)
    teacher = [torch.tensor([-1.5, -0.5]), torch.tensor([-1.0, -1.0, -2.0])]
    backend = FakeBackend(batch)
    if teacher_source == "batch":
        batch.teacher_log_probs = teacher
    else:
        backend.teacher = teacher
    cfg = _cfg(use_opd=True, opd_type="sglang" if teacher_source == "batch" else "fsdp", opd_kl_coef=0.5)
    assert not can_reuse_old_log_probs(cfg, batch)  # the advantages need the old log-probs before training
    metrics, _ = train_on_rollout(cfg, backend, 0, batch)
    assert ("log_probs:teacher" in backend.calls) == (teacher_source == "backend")
    assert metrics["train/pg_loss"] == pytest.approx(-0.125, abs=ATOL)
    assert metrics["train/opd_reverse_kl"] == pytest.approx(0.25, abs=ATOL)
    # The original's trainer-side rollout/teacher_log_probs and rollout/opd_reverse_kl (rollout_data keys it averages
    # per rollout), absent before: teacher (-1.5 - 0.5)/2 = -1 and (-1 - 2)/2 = -1.5 → -1.25; reverse KL as above.
    assert metrics["rollout/teacher_log_probs"] == pytest.approx(-1.25, abs=ATOL)
    assert metrics["rollout/opd_reverse_kl"] == pytest.approx(0.25, abs=ATOL)
    plain_batch = _batch(1)
    plain, _ = train_on_rollout(_cfg(), FakeBackend(plain_batch), 0, plain_batch)
    assert "rollout/teacher_log_probs" not in plain and "rollout/opd_reverse_kl" not in plain


def test_opd_without_teacher_log_probs_fails_clearly():
    batch = _batch(1)
    with pytest.raises(ValueError, match="--opd-type fsdp: the batch has no teacher_log_probs and the trainer holds"):
        train_on_rollout(_cfg(use_opd=True, opd_type="fsdp"), FakeBackend(batch), 0, batch)


def test_get_mismatch_metrics_with_rollout_log_probs_uses_the_trainers():
    """`--get-mismatch-metrics --use-rollout-logprobs`: the loss is the engine-old one, the metrics the trainer's.

    Trainer log-probs are -1.0 (the fake model), the engine's -1.2: Δ = 0.2 on every trainable token, so
    `mis_kl = -0.2` per sample mean, summed over the step's 2 samples and divided by its 2 samples.
    """
    batch = _batch(2, rollout_log_probs=True)
    batch.rollout_log_probs = [torch.full((n,), -1.2) for n in batch.response_lengths]
    backend = FakeBackend(batch)
    cfg = _cfg(use_rollout_logprobs=True, get_mismatch_metrics=True)
    metrics, steps = train_on_rollout(cfg, backend, 0, batch)
    # Two steps: the trainer's log-probs before training come from one forward, as in the original.
    assert backend.calls.count("log_probs:actor") == 1
    # Step 0: loss_denominators are 2 per sample; sample 1 has 2 trainable tokens of its 3.
    assert steps[0]["train/mis_kl"] == pytest.approx(-0.2, abs=ATOL)
    assert steps[0]["train/mis_log_ppl_diff"] == pytest.approx(-0.2, abs=ATOL)
    assert steps[0]["train/mis_training_log_ppl"] == pytest.approx(1.0, abs=ATOL)
    assert steps[0]["train/mis_rollout_log_ppl"] == pytest.approx(1.2, abs=ATOL)
    # Step 1 trains on samples the first step's update did not touch (their own parameters): same gap.
    assert steps[1]["train/mis_kl"] == pytest.approx(-0.2, abs=ATOL)
    # rollout/log_probs is the trainer's (-1.0), as the original's rollout_data["log_probs"]; it was the engine's
    # -1.2 (the old log-probs the loss uses here), so the two log-prob means showed no mismatch at all.
    assert metrics["rollout/log_probs"] == pytest.approx(-1.0, abs=ATOL)
    # One step per rollout: the training forward's detached log-probs are the trainer's, no extra forward.
    single = _batch(1, rollout_log_probs=True)
    single.rollout_log_probs = [torch.full((n,), -1.2) for n in single.response_lengths]
    one = FakeBackend(single)
    out, _ = train_on_rollout(cfg, one, 0, single)
    assert "log_probs:actor" not in one.calls
    assert out["train/mis_k3_kl"] == pytest.approx(math.exp(0.2) - 0.2 - 1, abs=ATOL)
    assert out["rollout/log_probs"] == pytest.approx(-1.0, abs=ATOL)  # recorded in the training forward
    # Without --get-mismatch-metrics the trainer never scores them: no rollout/log_probs (the original writes none).
    plain, _ = train_on_rollout(_cfg(use_rollout_logprobs=True), FakeBackend(single), 0, single)
    assert "rollout/log_probs" not in plain


def test_rollout_mean_sums_leave_out_a_masked_minus_inf_and_take_the_recorded_means_as_tensors():
    # The per-sample mean was values·mask: a -inf log-prob at a masked (padding) token made the sum NaN. The
    # training forward records its means as 0-d tensors (no host sync per sample); one transfer reads them all.
    from slime_core.step_metrics import rollout_mean_sums as _rollout_mean_sums

    batch = _batch(1, dp=1)
    masks = [torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.0, 0.0])]
    batch.loss_masks = masks
    ref = [torch.tensor([-1.0, float("-inf"), -3.0]), torch.tensor([float("-inf"), 5.0])]
    recorded = {0: torch.tensor(-2.0), 1: torch.tensor(0.0)}
    sums = _rollout_mean_sums(batch, {"log_probs": recorded, "ref_log_probs": ref, "values": None})
    assert list(sums) == ["rollout/log_probs.sum", "rollout/log_probs.count", "rollout/ref_log_probs.sum",
                          "rollout/ref_log_probs.count"]  # fmt: skip
    assert sums["rollout/log_probs.sum"] == pytest.approx(-2.0, abs=ATOL) and sums["rollout/log_probs.count"] == 2.0
    # (-1 - 3) / 2 for the first sample; the second has no trainable token: it adds 0 (the original's clamp).
    assert sums["rollout/ref_log_probs.sum"] == pytest.approx(-2.0, abs=ATOL)
    assert all(isinstance(value, float) for value in sums.values())


# test_flops.DENSE: 264 decoder-layer parameters per token, attention 2·2·6 per s², lm_head 2·10·4 per response token.
FLOPS_CONFIG = dict(hidden_size=4, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=3,
                    intermediate_size=5, vocab_size=10)  # fmt: skip


def test_a_train_step_reports_the_original_length_means_and_tflops(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(FLOPS_CONFIG))
    batch = RolloutBatch(
        tokens=[torch.arange(3), torch.arange(5)],
        response_lengths=[2, 3],
        loss_masks=[torch.ones(2), torch.ones(3)],
        rewards=[1.0, -1.0],
        raw_rewards=[1.0, 0.0],
        loss_denominators=[2.0, 3.0],
        micro_batches=[[[0], [1]]],
        truncated=[0, 1],
        step_sample_counts=[4],
        step_token_counts=[10.0],
    )
    cfg = _cfg(hf_checkpoint=str(tmp_path), actor_num_gpus_per_node=2)
    model_config.cache_clear()
    try:
        metrics, _ = train_on_rollout(cfg, FakeBackend(batch, dp=2), 0, batch)
    finally:
        model_config.cache_clear()
    # Two identical DP ranks: 4 samples of 3, 5, 3, 5 tokens; responses 2, 3, 2, 3; one in two truncated.
    assert metrics["rollout/total_lengths"] == 4.0
    assert metrics["rollout/response_lengths"] == 2.5
    assert metrics["rollout/truncated"] == 0.5
    # Forward FLOPs: 2*264*16 + 2*2*6*68 + 2*10*4*10 = 8448 + 1632 + 800 = 10880, over 2 GPUs.
    seconds = metrics["perf/actor_train_time"]
    assert metrics["perf/actor_train_tflops"] == pytest.approx(3 * 10880 / 2 / 1e12 / seconds)
    assert metrics["perf/actor_train_tok_per_s"] == pytest.approx(16 / seconds)
    # One step: the old log-probs come from the training forward, so no separate forward is timed.
    assert "perf/log_probs_tflops" not in metrics and "perf/ref_log_probs_tflops" not in metrics


SEEN_BATCHES = []


def batch_reading_loss(args, batch, logits, sum_of_sample_mean):
    """A custom loss written for the original: it reads the batch keys the original's loss batch has."""
    SEEN_BATCHES.append(batch)
    lp = torch.cat(logits["log_probs"])
    returns = torch.cat(batch["returns"])
    return -sum_of_sample_mean(lp * returns), {}


def test_a_custom_loss_gets_the_originals_returns_and_rollout_mask_sums():
    # The original's loss batch holds returns, values, teacher_log_probs, rollout_mask_sums and unconcat_tokens; they
    # were missing here, so a custom loss reading batch["returns"] failed with KeyError: 'returns'.
    SEEN_BATCHES.clear()
    batch = _batch(1)
    cfg = _cfg(loss_type="custom_loss", custom_loss_function_path=f"{__name__}.batch_reading_loss")
    metrics, _ = train_on_rollout(cfg, FakeBackend(batch), 0, batch)
    seen = SEEN_BATCHES[0]  # micro-batch [0]: sample 0, reward +1 → GRPO returns = advantages = 1 on each token
    torch.testing.assert_close(seen["returns"][0], torch.ones(2))
    torch.testing.assert_close(seen["returns"][0], seen["advantages"][0])
    assert seen["rollout_mask_sums"] == [2.0] and seen["unconcat_tokens"] is seen["tokens"]
    assert seen["values"] is None and seen["teacher_log_probs"] is None
    # The loss: -Σ_i Σ_t m·r·lp / D over both micro-batches (lp = -1) = (1·2/2) + (-0.5·2/2) = 0.5, over 2 samples.
    assert metrics["train/loss"] == pytest.approx(0.25, abs=ATOL)


def advantages_without_returns(args, rollout_data):
    """A custom advantage function that forgets `rollout_data["returns"]`."""
    rollout_data["advantages"] = [torch.ones_like(m) for m in rollout_data["loss_masks"]]


def failing_advantages(args, rollout_data):
    raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("advantages_without_returns", r"returns \(rollout 5\) did not set rollout_data\[.returns.\]"),
        ("failing_advantages", r"boom"),
    ],
)
def test_a_trainer_side_hooks_error_names_the_rollout(hook, message):
    # Before: "--custom-advantage-function-path <path> did not set ..." named the hook but not which rollout it was.
    path = f"{__name__}.{hook}"
    batch = _batch()
    with pytest.raises((ValueError, RuntimeError), match=message) as info:
        train_on_rollout(_cfg(custom_advantage_function_path=path), FakeBackend(batch), 5, batch)
    text = str(info.value) + "".join(getattr(info.value, "__notes__", ()))
    assert f"--custom-advantage-function-path {path} (rollout 5)" in text
    # Outside a step, nothing is named (the variable is reset when the step ends, even by an error).
    from slime_core.hook_deadline import hook_label

    assert hook_label("--custom-loss-function-path m.f") == "--custom-loss-function-path m.f"
