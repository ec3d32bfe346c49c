"""`compute_train_loss`: the `--loss-type` dispatch (policy_loss, sft_loss, custom_loss).

Tolerance: float64 hand references vs float32 implementation, atol 1e-6.
"""

import sys
import types

import pytest
import torch

from slime_core.algorithms import LossInputs, compute_actor_loss, compute_train_loss, needs_old_log_probs
from slime_core.config import SlimeArgs
from slime_core.plugins import PluginError

ATOL = 1e-6


# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the functions' own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _args(**kw):
    base = dict(
        loss_type="policy_loss",
        custom_loss_function_path=None,
        advantage_estimator="grpo",
        eps_clip=0.2,
        eps_clip_high=None,
        eps_clip_c=None,
        entropy_coef=0.0,
        use_kl_loss=False,
        calculate_per_token_loss=False,
        kl_coef=0.0,
    )
    base.update(kw)
    return _CONFIG.model_copy(update=base)


def _inputs():
    lp = [torch.tensor([-0.5, -1.0, -2.0]), torch.tensor([-0.25]), torch.tensor([-3.0, -0.1])]
    return dict(
        log_probs=[x.clone().requires_grad_(True) for x in lp],
        old_log_probs=[x - 0.1 for x in lp],
        advantages=[torch.full((3,), 1.0), torch.full((1,), -1.0), torch.full((2,), 0.5)],
        loss_masks=[torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0]), torch.tensor([0.0, 0.0])],
        loss_denominators=[2.0, 1.0, 4.0],
        entropy=[torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.4]), torch.tensor([0.5, 0.6])],
        total_lengths=[5, 3, 4],
        tokens=[torch.arange(5), torch.arange(3), torch.arange(4)],
    )


def _register(monkeypatch, name, fn):
    module = types.ModuleType(name)
    module.loss = fn
    monkeypatch.setitem(sys.modules, name, module)
    return f"{name}.loss"


def test_policy_loss_is_compute_actor_loss():
    b = _inputs()
    loss, metrics = compute_train_loss(_args(), LossInputs(**b))
    b2 = _inputs()
    b2.pop("tokens")
    ref_loss, ref_metrics = compute_actor_loss(_args(), **b2)
    assert loss.item() == pytest.approx(float(ref_loss), abs=ATOL)
    assert metrics.keys() == ref_metrics.keys() and "pg_clipfrac" in metrics


def test_sft_loss_is_masked_nll_by_hand():
    b = _inputs()
    loss, metrics = compute_train_loss(_args(loss_type="sft_loss"), LossInputs(**b))
    # sample 0: -(-0.5 - 2.0)/2 = 1.25; sample 1: 0.25/1; sample 2: all masked -> 0.
    assert loss.item() == pytest.approx(1.5, abs=ATOL)
    assert metrics.keys() == {"loss"}
    loss.backward()
    # d loss / d lp = -m_t / D_i.
    assert b["log_probs"][0].grad.tolist() == pytest.approx([-0.5, 0.0, -0.5], abs=ATOL)
    assert b["log_probs"][1].grad.tolist() == pytest.approx([-1.0], abs=ATOL)
    assert b["log_probs"][2].grad.tolist() == pytest.approx([0.0, 0.0], abs=ATOL)


def test_sft_loss_needs_no_advantages_or_old_log_probs():
    b = _inputs()
    b.update(advantages=None, old_log_probs=None)
    loss, _ = compute_train_loss(_args(loss_type="sft_loss", calculate_per_token_loss=True), LossInputs(**b))
    assert loss.item() == pytest.approx(0.5 + 2.0 + 0.25, abs=ATOL)  # per-token: plain masked sum


def test_policy_loss_without_advantages_is_an_error():
    b = _inputs()
    b["advantages"] = None
    with pytest.raises(ValueError, match="--disable-compute-advantages-and-returns"):
        compute_train_loss(_args(), LossInputs(**b))


def test_custom_loss_gets_original_signature_and_reducer(monkeypatch):
    seen = {}

    def loss(args, batch, logits, sum_of_sample_mean):
        seen.update(args=args, batch=batch, logits=logits)
        lp = torch.cat(logits["log_probs"])
        ent = torch.cat(logits["entropy"])
        return -2.0 * sum_of_sample_mean(lp), {"my_entropy": sum_of_sample_mean(ent), "n": 3}

    args = _args(loss_type="custom_loss", custom_loss_function_path=_register(monkeypatch, "custom_loss_ok", loss))
    b = _inputs()
    b["advantages"] = None  # --disable-compute-advantages-and-returns
    total, metrics = compute_train_loss(args, LossInputs(**b))
    assert total.item() == pytest.approx(2 * 1.5, abs=ATOL)
    # Entropy reduced by hand: (0.1 + 0.3)/2 + 0.4/1 + 0 = 0.6.
    assert float(metrics["my_entropy"]) == pytest.approx(0.6, abs=ATOL)
    assert float(metrics["n"]) == 3.0 and float(metrics["loss"]) == pytest.approx(3.0, abs=ATOL)
    assert all(not v.requires_grad for v in metrics.values())
    batch = seen["batch"]
    # The plugin view is the config plus the original's defaults for two unset paths (PluginArgs.from_config).
    view_defaults = {"rollout_sample_hook_path": [], "eval_function_path": args.rollout_function_path}
    assert seen["args"].to_dict() == {**args.to_dict(), **view_defaults} and batch["advantages"] is None
    assert batch["response_lengths"] == [3, 1, 2] and batch["total_lengths"] == [5, 3, 4]
    assert batch["log_probs"] is b["old_log_probs"] and batch["tokens"] is b["tokens"]
    total.backward()
    assert b["log_probs"][0].grad.tolist() == pytest.approx([-1.0, 0.0, -1.0], abs=ATOL)


def test_custom_loss_bad_return_and_bad_path(monkeypatch):
    bad = _register(monkeypatch, "custom_loss_bad", lambda args, batch, logits, reduce: 1.0)
    with pytest.raises(ValueError, match="must return \\(loss, metrics dict\\)"):
        compute_train_loss(_args(loss_type="custom_loss", custom_loss_function_path=bad), LossInputs(**_inputs()))
    vec = _register(monkeypatch, "custom_loss_vec", lambda args, batch, logits, reduce: (torch.ones(2), {}))
    with pytest.raises(ValueError, match="loss must be a scalar tensor"):
        compute_train_loss(_args(loss_type="custom_loss", custom_loss_function_path=vec), LossInputs(**_inputs()))
    with pytest.raises(PluginError, match="--custom-loss-function-path"):
        compute_train_loss(
            _args(loss_type="custom_loss", custom_loss_function_path="no_such_mod_xyz.f"), LossInputs(**_inputs())
        )


@pytest.mark.parametrize(("metric", "got"), [(torch.ones(6), "shape (6,)"), ("fine", "str"), (None, "NoneType")])
def test_a_custom_loss_metric_that_is_not_a_scalar_is_one_error_naming_it(monkeypatch, metric, got):
    # A per-token metric passed here and failed after the step's backward as torch's "shape '[]' is invalid for input
    # of size 6"; a string or None as "new(): invalid data type": neither named the plugin or the metric.
    def loss(args, batch, logits, sum_of_sample_mean):
        return -sum_of_sample_mean(torch.cat(logits["log_probs"])), {"kept": metric}

    path = _register(monkeypatch, f"custom_loss_metric_{type(metric).__name__}", loss)  # loaded once per path
    with pytest.raises(ValueError) as e:
        compute_train_loss(_args(loss_type="custom_loss", custom_loss_function_path=path), LossInputs(**_inputs()))
    assert str(e.value) == (
        f"--custom-loss-function-path {path}: metric 'kept' ({got}) is not a scalar (a number or a one-element tensor)"
    )


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="unknown --loss-type 'value_loss'"):
        compute_train_loss(_args(loss_type="value_loss"), LossInputs(**_inputs()))


def test_needs_old_log_probs():
    assert needs_old_log_probs(_args())
    assert needs_old_log_probs(_args(loss_type="custom_loss"))
    assert not needs_old_log_probs(_args(loss_type="sft_loss"))
    assert needs_old_log_probs(_args(loss_type="sft_loss", kl_coef=0.1))  # reward-shaping KL reads them


def test_a_trainer_hook_may_keep_state_on_args_as_on_the_original_namespace(monkeypatch):
    # Reproducer: without --custom-config-path a custom loss got the frozen config, and `args.calls = ...` (the
    # original's args is a plain Namespace) failed with pydantic's "Instance is frozen".
    def loss(args, batch, logits, sum_of_sample_mean):
        args.calls = getattr(args, "calls", 0) + 1
        return -sum_of_sample_mean(torch.cat(logits["log_probs"])), {"calls": args.calls}

    args = _args(loss_type="custom_loss", custom_loss_function_path=_register(monkeypatch, "custom_loss_state", loss))
    calls = [float(compute_train_loss(args, LossInputs(**_inputs()))[1]["calls"]) for _ in range(2)]
    assert calls == [1.0, 2.0] and not hasattr(args, "calls")
