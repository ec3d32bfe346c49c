"""Custom TIS functions and pg-loss reducers given by path (`--custom-tis-function-path`,
`--custom-pg-loss-reducer-function-path`): their values in the actor loss, and one error naming the plugin when one
returns the wrong shape."""

import pytest
import torch
from slime_core_objective_args import ATOL
from slime_core_objective_args import args as _args

from slime_core.algorithms import compute_actor_loss


def _two_sample_actor_loss(tmp_path, monkeypatch, module: str, source: str, **overrides):
    """`compute_actor_loss` on two samples (2 + 1 tokens, log-prob -1 each, advantage 1) with `source` importable
    as `module` (a plugin file), under `_args(use_kl_loss=False, entropy_coef=0.0, **overrides)`."""
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    lp = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0])]
    return compute_actor_loss(
        _args(use_kl_loss=False, entropy_coef=0.0, **overrides),
        log_probs=lp,
        old_log_probs=lp,
        advantages=[torch.ones(2), torch.ones(1)],
        loss_masks=[torch.ones(2), torch.ones(1)],
        loss_denominators=[2.0, 1.0],
        rollout_log_probs=lp,
        total_lengths=[3, 2],
    )


def test_custom_tis_function(tmp_path, monkeypatch):
    source = (
        "import torch\n"
        "def tis(args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):\n"
        "    masks = [m.clone() for m in loss_masks]\n"
        "    masks[0][0] = 0.0  # reject one token\n"
        "    return pg_loss * 2.0, masks, {'mis_weight': torch.full_like(pg_loss, 2.0)}\n"
    )
    loss, metrics = _two_sample_actor_loss(
        tmp_path, monkeypatch, "my_tis", source, custom_tis_function_path="my_tis.tis"
    )
    # pg per token -1 → ×2 = -2; sample 0 keeps one token over denominator 2 → -1; sample 1 → -2
    assert loss.item() == pytest.approx(-3.0, abs=ATOL)
    # Mismatch metrics average over the tokens before the rejection (the original's pre-RS reducer): 2 + 2.
    assert metrics["mis_weight"].item() == pytest.approx((2.0 + 2.0) / 2 + 2.0, abs=ATOL)
    assert metrics["ois"].item() == pytest.approx(1.0 + 1.0, abs=ATOL)


_BAD_TIS = """
import torch
def two_values(args, pg_loss, **kw):
    return pg_loss, {}
def one_value_per_sample(args, pg_loss, loss_masks, **kw):
    return torch.stack([pg_loss[:2].mean(), pg_loss[2:].mean()]), loss_masks, {}
def first_token_only(args, pg_loss, loss_masks, **kw):
    return pg_loss[:1] * 3.0, loss_masks, {}
def masks_as_one_tensor(args, pg_loss, loss_masks, **kw):
    return pg_loss, torch.cat(loss_masks), {}
def per_sample_metric(args, pg_loss, loss_masks, **kw):
    return pg_loss, loss_masks, {"w": torch.ones(2)}
def float_metric(args, pg_loss, loss_masks, **kw):
    return pg_loss, loss_masks, {"w": 1.0}
"""


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            "two_values",
            r"must return \(pg_loss \[3\], loss_masks 2×\[L_i\], metrics dict of \[3\] tensors\), got tuple",
        ),
        # These two were broadcast into the loss without a word: a [2] or [1] pg_loss over 3 tokens.
        ("one_value_per_sample", r"returned pg_loss shape \(2,\), expected a \[3\] tensor \(one value per token\)$"),
        ("first_token_only", r"returned pg_loss shape \(1,\), expected a \[3\] tensor"),
        ("masks_as_one_tensor", r"returned loss_masks Tensor, expected a list of 2 tensors$"),
        ("per_sample_metric", r"returned metric 'w' shape \(2,\), expected a \[3\] tensor"),
        ("float_metric", r"returned metric 'w' float, expected a \[3\] tensor"),
    ],
)
def test_a_custom_tis_function_returning_the_wrong_shape_is_one_error_naming_it(tmp_path, monkeypatch, fn, message):
    # Its return went unchecked: bare unpacking and broadcasting errors naming no plugin, or a silently wrong loss.
    with pytest.raises(ValueError, match=rf"^--custom-tis-function-path bad_tis\.{fn}: {message}"):
        _two_sample_actor_loss(tmp_path, monkeypatch, "bad_tis", _BAD_TIS, custom_tis_function_path=f"bad_tis.{fn}")


_BAD_REDUCERS = """
import torch
def no_reducer(total_lengths, response_lengths, loss_masks, per_token):
    return 3.0
def per_token_values(total_lengths, response_lengths, loss_masks, per_token):
    return lambda x: x * torch.cat(loss_masks)
def per_sample_sums(total_lengths, response_lengths, loss_masks, per_token):
    return lambda x: torch.stack([s.sum() for s in x.split(response_lengths)])
def python_float(total_lengths, response_lengths, loss_masks, per_token):
    return lambda x: float(x.detach().sum())
"""


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("no_reducer", r"returned float 3\.0, not a reducer \(a function of the per-token pg_loss \[T\] to a scalar"),
        # These made the loss a vector: the backend's backward failed with torch's "grad can be implicitly created
        # only for scalar outputs", naming no plugin.
        ("per_token_values", r"its reducer returned shape \(3,\), not a scalar tensor \(0-d, with grad\)$"),
        ("per_sample_sums", r"its reducer returned shape \(2,\), not a scalar tensor"),
        ("python_float", r"its reducer returned float, not a scalar tensor"),
    ],
)
def test_a_pg_loss_reducer_that_does_not_reduce_to_a_scalar_is_one_error_naming_it(tmp_path, monkeypatch, fn, message):
    with pytest.raises(ValueError, match=rf"^--custom-pg-loss-reducer-function-path bad_reducers\.{fn}: {message}"):
        _two_sample_actor_loss(tmp_path, monkeypatch, "bad_reducers", _BAD_REDUCERS, use_tis=False,
                               custom_pg_loss_reducer_function_path=f"bad_reducers.{fn}")  # fmt: skip


_COUNTING_REDUCER = """
import torch
CALLS = []
def reducer(total_lengths, response_lengths, loss_masks, per_token):
    CALLS.append([m.tolist() for m in loss_masks])
    mask = torch.cat(loss_masks)
    return lambda x: (x * mask).sum()
"""


def test_a_pg_loss_reducer_factory_is_called_once_with_the_tis_function_s_masks(tmp_path, monkeypatch):
    # The original calls the factory once per loss call, with the TIS function's modified masks under --use-tis
    # (`pg_loss_masks = modified_response_masks`); it was also called with the batch's masks before the TIS function
    # ran here, so a factory that counts or logs its calls saw two per micro-batch.
    tis_source = (
        "def tis(args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):\n"
        "    masks = [m.clone() for m in loss_masks]\n"
        "    masks[0][0] = 0.0\n"
        "    return pg_loss, masks, {}\n"
    )
    (tmp_path / "once_tis.py").write_text(tis_source)
    loss, _ = _two_sample_actor_loss(tmp_path, monkeypatch, "count_reducer", _COUNTING_REDUCER, use_tis=True,
                                     custom_tis_function_path="once_tis.tis",
                                     custom_pg_loss_reducer_function_path="count_reducer.reducer")  # fmt: skip
    import count_reducer

    assert count_reducer.CALLS == [[[0.0, 1.0], [1.0]]]
    assert loss.item() == pytest.approx(-2.0, abs=ATOL)  # pg -1 per token over the two tokens kept


def test_a_tis_function_that_rejects_tokens_in_place_has_them_left_out_as_in_the_original(tmp_path, monkeypatch):
    # The original rebuilds the reducer from the masks the TIS function returns, whatever object they are; one that
    # zeroed the masks it was given in place and returned them was read here as "no token rejected" (the masks were
    # compared by identity), so the rejected token stayed in the loss.
    source = (
        "def tis(args, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths):\n"
        "    loss_masks[0][0] = 0.0  # reject one token, in place\n"
        "    return pg_loss, loss_masks, {}\n"
    )
    loss, _ = _two_sample_actor_loss(
        tmp_path, monkeypatch, "inplace_tis", source, custom_tis_function_path="inplace_tis.tis"
    )
    # pg -1 per token; sample 0 keeps one token over its denominator 2 -> -0.5; sample 1 -> -1
    assert loss.item() == pytest.approx(-1.5, abs=ATOL)
