"""`slime.backends.megatron_utils.{loss,cp_utils}`: original TIS/MIS plugins load and run through our train step.

Tolerance: float32 results against hand-computed values, abs 1e-5.
"""

import math
import pathlib

import pytest
import torch

from slime.backends.megatron_utils import cp_utils
from slime.backends.megatron_utils.loss import icepop_function, vanilla_tis_function
from slime_core.algorithms import compute_actor_loss
from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.train_step import train_on_rollout

ATOL = 1e-5
PLUGINS = pathlib.Path(__file__).parent / "original_plugins"
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


class OneStepBackend:
    """A `StepBackend` whose model is one log-prob parameter per response token, all -1.0; SGD lr 0.1."""

    has_ref = False
    has_teacher = False

    def __init__(self, lengths):
        self.params = [torch.nn.Parameter(torch.full((n,), -1.0)) for n in lengths]

    def compute_log_probs(self, batch, *, model="actor"):
        return [p.detach().clone() for p in self.params]

    def all_reduce_sum(self, tensor):
        return tensor

    def forward_backward(self, batch, step, loss_fn, *, denominator):
        out = []
        for ids in batch.micro_batches[step]:
            log_probs = [self.params[i] * 1.0 for i in ids]
            loss, metrics = loss_fn(ids, log_probs, [torch.zeros_like(lp) for lp in log_probs])
            (loss / denominator).backward()
            out.append(metrics)
        return out

    def optimizer_step(self):
        with torch.no_grad():
            for p in self.params:
                p -= 0.1 * p.grad
        return 0.0, 0.1

    def reduce_metric_sums(self, sums):
        return dict(sums)

    def reset_optimizer_states(self):
        pass

    def update_ref(self):
        pass


def test_original_custom_tis_file_runs_through_the_train_step(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    lengths = [2, 3]
    batch = RolloutBatch(
        tokens=[torch.arange(n + 2) for n in lengths],
        response_lengths=lengths,
        loss_masks=[torch.ones(2), torch.ones(3)],
        rewards=[1.0, -0.5],
        raw_rewards=[1.0, 0.0],
        loss_denominators=[2.0, 3.0],
        rollout_log_probs=[torch.tensor([-1.2, -1.4]), torch.tensor([-0.5, -0.9, -1.0])],
        micro_batches=[[[0, 1]]],
        step_sample_counts=[2],
        step_token_counts=[5.0],
    )
    cfg = _CONFIG.model_copy(
        update=dict(use_tis=True, tis_clip=2.0, custom_tis_function_path="orig_tis_plugin.geometric_tis")
    )
    metrics, _ = train_on_rollout(cfg, OneStepBackend(lengths), 0, batch)
    # Trainer -1.0 everywhere; Δ = [0.2, 0.4] → w0 = e^0.3 = 1.349859; Δ = [-0.5, -0.1, 0] → w1 = e^-0.2 = 0.818731.
    # GRPO advantages are the rewards; one step, so the ratio is 1 and pg = -A·w per token:
    # (-1·1.349859 + 0.5·0.818731) / 2 samples.
    assert metrics["train/pg_loss"] == pytest.approx((-1.349859 + 0.5 * 0.818731) / 2, abs=ATOL)
    assert metrics["train/geo_weight"] == pytest.approx((1.349859 + 0.818731) / 2, abs=ATOL)
    tis0 = (math.exp(0.2) + math.exp(0.4)) / 2  # the original's `tis`: token ratios, mean per sample
    tis1 = (math.exp(-0.5) + math.exp(-0.1) + 1.0) / 3
    assert metrics["train/tis"] == pytest.approx((tis0 + tis1) / 2, abs=ATOL)
    assert metrics["train/ois"] == pytest.approx(1.0, abs=ATOL)


def test_original_loss_functions_equal_the_builtin_modes():
    g = torch.Generator().manual_seed(0)
    lp = [-torch.rand(n, generator=g) * 2 for n in (3, 4)]
    batch = dict(
        log_probs=lp,
        old_log_probs=lp,
        advantages=[torch.ones(3), -torch.ones(4)],
        loss_masks=[torch.ones(3), torch.tensor([1.0, 0.0, 1.0, 1.0])],
        loss_denominators=[3.0, 3.0],
        rollout_log_probs=[x + torch.randn(x.shape[0], generator=g) * 0.5 for x in lp],
    )
    for mode, path in (("truncate", "vanilla_tis_function"), ("icepop", "icepop_function")):
        fields = dict(use_tis=True, tis_clip=1.3, tis_clip_low=0.7, entropy_coef=0.0, use_kl_loss=False)
        builtin = compute_actor_loss(_CONFIG.model_copy(update=dict(fields, tis_mode=mode)), **batch)
        by_path = dict(fields, custom_tis_function_path=f"slime.backends.megatron_utils.loss.{path}")
        original = compute_actor_loss(_CONFIG.model_copy(update=by_path), **batch)
        assert original[0].item() == pytest.approx(builtin[0].item(), abs=ATOL)
        assert original[1]["tis_clipfrac"].item() == pytest.approx(builtin[1]["tis_clipfrac"].item(), abs=ATOL)
    # The original's positional call form.
    pg, masks, metrics = vanilla_tis_function(
        _CONFIG.model_copy(update=dict(tis_clip=2.0, tis_clip_low=0.0)),
        pg_loss=torch.ones(2),
        train_log_probs=[torch.tensor([0.0, 0.0])],
        rollout_log_probs=[torch.tensor([-math.log(3.0), 0.0])],
        loss_masks=[torch.ones(2)],
        total_lengths=[4],
        response_lengths=[2],
    )
    assert pg.tolist() == pytest.approx([2.0, 1.0], abs=ATOL)  # ratios 3 → clamped to 2, and 1
    assert metrics["tis_clipfrac"].tolist() == [1.0, 0.0]
    _, _, ice = icepop_function(
        _CONFIG.model_copy(update=dict(tis_clip=2.0, tis_clip_low=0.5)),
        pg_loss=torch.ones(1),
        train_log_probs=[torch.zeros(1)],
        rollout_log_probs=[torch.zeros(1)],
        loss_masks=[torch.ones(1)],
    )
    assert ice["tis"].tolist() == [1.0]


def test_cp_utils_whole_responses_and_reducer():
    x = torch.tensor([1.0, 2.0, 3.0])
    assert cp_utils.all_gather_with_cp(x, 5, 3) is x
    assert cp_utils.slice_log_prob_with_cp([0.1, 0.2], 4, 2) == [0.1, 0.2]
    with pytest.raises(ValueError, match="2 values for a response of 3 tokens"):
        cp_utils.all_gather_with_cp(x[:2], 5, 3)
    masks = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0, 1.0])]
    values = torch.tensor([4.0, 100.0, 1.0, 2.0, 3.0])
    mean = cp_utils.get_sum_of_sample_mean([4, 5], [2, 3], masks)
    assert mean(values).item() == pytest.approx(4.0 / 1 + 6.0 / 3, abs=ATOL)  # own mask sums: 1 and 3
    given = cp_utils.get_sum_of_sample_mean([4, 5], [2, 3], masks, [2.0, 4.0])
    assert given(values).item() == pytest.approx(4.0 / 2 + 6.0 / 4, abs=ATOL)
    per_token = cp_utils.get_sum_of_sample_mean([4, 5], [2, 3], masks, calculate_per_token_loss=True)
    assert per_token(values).item() == pytest.approx(10.0, abs=ATOL)


def policy_plus_length_bonus(args, batch, logits, sum_of_sample_mean):
    """A custom loss written for the original: its policy loss plus a term (the usual reason to write one)."""
    from slime.backends.megatron_utils.loss import policy_loss_function

    loss, metrics = policy_loss_function(args, batch, logits, sum_of_sample_mean)
    bonus = sum_of_sample_mean(torch.cat(logits["log_probs"]))
    return loss - 0.5 * bonus, {**metrics, "bonus": bonus.detach()}


def sft_through_the_original(args, batch, logits, sum_of_sample_mean):
    from slime.backends.megatron_utils.loss import sft_loss_function

    return sft_loss_function(args, batch, logits, sum_of_sample_mean)


def test_a_custom_loss_wrapping_the_originals_policy_and_sft_losses():
    # The original's custom losses import policy_loss_function / sft_loss_function to add a term; the module had
    # neither, so such a plugin stopped at its import.
    from slime_core.algorithms import LossInputs, compute_train_loss

    g = torch.Generator().manual_seed(1)
    old = [-torch.rand(n, generator=g) for n in (2, 3)]
    masks = [torch.ones(2), torch.tensor([1.0, 0.0, 1.0])]

    def inputs():
        lp = [(x + 0.1).requires_grad_() for x in old]
        return LossInputs(log_probs=lp, old_log_probs=old, advantages=[torch.ones(2), -torch.ones(3)],
                          loss_masks=masks, loss_denominators=[2.0, 2.0],
                          entropy=[torch.zeros(2), torch.zeros(3)], total_lengths=[4, 5])  # fmt: skip

    fields = dict(use_tis=False, use_kl_loss=False, entropy_coef=0.0, eps_clip=0.2, eps_clip_high=0.28)
    builtin, builtin_metrics = compute_train_loss(_CONFIG.model_copy(update=fields), inputs())
    custom = dict(loss_type="custom_loss", custom_loss_function_path=f"{__name__}.policy_plus_length_bonus")
    custom_cfg = _CONFIG.model_copy(update=dict(fields, **custom))
    loss, metrics = compute_train_loss(custom_cfg, inputs())
    # bonus = Σ_i Σ_t m·lp / D_i over the shifted log-probs.
    bonus = sum(float(((x + 0.1) * m).sum()) / 2.0 for x, m in zip(old, masks, strict=True))
    assert metrics["bonus"].item() == pytest.approx(bonus, abs=ATOL)
    assert loss.item() == pytest.approx(builtin.item() - 0.5 * bonus, abs=ATOL)
    assert metrics["pg_clipfrac"].item() == pytest.approx(builtin_metrics["pg_clipfrac"].item(), abs=ATOL)
    sft = dict(loss_type="custom_loss", custom_loss_function_path=f"{__name__}.sft_through_the_original")
    sft_cfg = _CONFIG.model_copy(update=sft)
    sft_loss, _ = compute_train_loss(sft_cfg, inputs())
    assert sft_loss.item() == pytest.approx(-bonus, abs=ATOL)
