"""`slime_core.weight_swap.WeightSwap`: the reference/teacher swap both training backends use (exact values)."""

import pytest
import torch

from slime_core.weight_swap import WeightSwap


def _model() -> torch.nn.Linear:
    layer = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
    return layer


def _set(layer: torch.nn.Linear, values: list[float]) -> None:
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([values]))


def test_a_held_role_is_swapped_in_for_the_body_and_the_trained_weights_come_back():
    layer = _model()
    swap = WeightSwap(layer.named_parameters, missing={"ref": "no reference model: --use-kl-loss"})
    swap.hold("ref")  # [1, 2]
    _set(layer, [3.0, 4.0])  # training moved the weights
    x = torch.tensor([1.0, 1.0])
    with swap.swapped("ref"):
        assert float(layer(x)) == 3.0  # 1 + 2
    assert layer.weight.tolist() == [[3.0, 4.0]]
    with swap.swapped("actor"):
        assert float(layer(x)) == 7.0
    swap.hold("ref")  # --ref-update-interval: the current weights become the reference
    _set(layer, [0.0, 0.0])
    with swap.swapped("ref"):
        assert layer.weight.tolist() == [[3.0, 4.0]]


def test_the_trained_weights_come_back_when_the_body_raises():
    layer = _model()
    swap = WeightSwap(layer.named_parameters)
    swap.hold("teacher", {"weight": torch.tensor([[9.0, 9.0]])})
    with pytest.raises(RuntimeError, match="forward failed"), swap.swapped("teacher"):
        assert layer.weight.tolist() == [[9.0, 9.0]]
        raise RuntimeError("forward failed")
    assert layer.weight.tolist() == [[1.0, 2.0]]


def test_capture_holds_what_the_loader_put_in_and_restores_the_model():
    layer = _model()
    swap = WeightSwap(layer.named_parameters)
    swap.capture("teacher", lambda: _set(layer, [5.0, 6.0]))  # e.g. load_hf_weights(--opd-teacher-load)
    assert layer.weight.tolist() == [[1.0, 2.0]] and swap.holds("teacher") and not swap.holds("ref")
    with swap.swapped("teacher"):
        assert layer.weight.tolist() == [[5.0, 6.0]]


def test_snapshots_are_host_copies_not_views():
    layer = _model()
    swap = WeightSwap(layer.named_parameters)
    snap = swap.snapshot()
    _set(layer, [0.0, 0.0])
    assert snap["weight"].tolist() == [[1.0, 2.0]] and snap["weight"].device.type == "cpu"


def test_unknown_or_missing_roles_fail_with_the_backend_message():
    swap = WeightSwap(_model().named_parameters, missing={"teacher": "no teacher model: --opd-type fsdp"})
    with pytest.raises(ValueError, match="no teacher model: --opd-type fsdp"), swap.swapped("teacher"):
        pass
    with pytest.raises(ValueError, match="model must be 'actor', 'ref' or 'teacher', got 'critic'"):
        with swap.swapped("critic"):
            pass
    with pytest.raises(ValueError, match="unknown weight role 'critic'"):
        swap.hold("critic")
