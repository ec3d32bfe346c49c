"""`--bias-swiglu-fusion`, `--bias-dropout-fusion` and `--megatron-compile-layers` keep the local spec's numbers.

On CPU, fp32, a tiny Qwen3: each switch against the default path on the same weights and batch; log-probs, per-step
losses and grad norms agree (1e-5 absolute on log-probs and losses, 1e-4 relative on grad norms).

megatron-core's fusions are `torch.compile`d functions (`megatron.core.jit.jit_fuser`); here they run as their
eager originals (inductor's C++ build would take minutes on a 2-core machine), so what is checked is the fused code
path megatron-core takes (its SwiGLU autograd function with the hand-written backward, its bias-dropout-add), and a
spy proves each was taken. `--megatron-compile-layers` compiles with the `aot_eager` backend: dynamo's graphs and
AOT autograd's joint graph, without inductor's code generation.
"""

import importlib.util
import pathlib

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.fusions import fused_bias_dropout, fused_bias_swiglu  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "_output_head_cases", pathlib.Path(__file__).parent / "test_output_head.py"
)
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)  # the same config and batch as the head tests (a sibling file, not a package)


def _eager_spy(monkeypatch, module, name: str, calls: dict) -> None:
    """Replaces the compiled `module.name` by its eager original, counting calls."""
    original = getattr(module, name)._torchdynamo_orig_callable

    def spy(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)


def _run(backend, batch):
    lp = backend.compute_log_probs(batch)
    backend.train(0, batch)
    return lp, backend.step_metrics


def _assert_same(got, expected):
    (lp_got, steps_got), (lp_exp, steps_exp) = got, expected
    for a, b in zip(lp_got, lp_exp, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for s_got, s_exp in zip(steps_got, steps_exp, strict=True):
        for key in ("train/loss", "train/pg_loss", "train/entropy_loss"):
            assert s_got[key] == pytest.approx(s_exp[key], abs=1e-5), key
        assert s_got["train/grad_norm"] == pytest.approx(s_exp["train/grad_norm"], rel=1e-4)


_FUSED = {fused_bias_swiglu: ("swiglu", "swiglu_back"),
          fused_bias_dropout: ("bias_dropout_add_fused_train", "bias_dropout_add_fused_inference")}  # fmt: skip
_BASELINE: dict[str, tuple] = {}  # hf dir -> the default path's (log-probs, step metrics), fused calls, compiles


@pytest.fixture()
def baseline(cpu_backend_env, tiny_hf):
    """The default path's log-probs and step on the tiny Qwen3, computed once for both tests (the same config and
    batch), with what it called of the fused functions and of `compile_decoder_layers` (both tests assert none)."""
    from slime_train_megatron import model, trainer_parts

    _, hf_dir = tiny_hf("qwen3")
    if str(hf_dir) not in _BASELINE:
        calls: dict[str, int] = {}
        compiled = []
        with pytest.MonkeyPatch.context() as mp:
            for module, names in _FUSED.items():
                for name in names:
                    _eager_spy(mp, module, name, calls)
            mp.setattr(
                trainer_parts, "compile_decoder_layers", lambda m: compiled.append(m) or model.compile_decoder_layers(m)
            )
            expected = _run(_backend(cpu_backend_env, _cases._config(hf_dir)), _cases._batch())
        _BASELINE[str(hf_dir)] = (expected, calls, compiled)
    return (hf_dir, *_BASELINE[str(hf_dir)])


def test_megatron_cores_swiglu_and_bias_dropout_fusions_give_the_same_step(cpu_backend_env, baseline, monkeypatch):
    hf_dir, expected, baseline_calls, _ = baseline
    assert baseline_calls == {}  # the default path does not touch the fused functions
    flags = [*_cases._config(hf_dir).megatron_args, "--bias-swiglu-fusion", "--bias-dropout-fusion"]
    fused_args = _cases._config(hf_dir, megatron_args=flags)
    calls: dict[str, int] = {}
    for module, names in _FUSED.items():
        for name in names:
            _eager_spy(monkeypatch, module, name, calls)
    fused = _backend(cpu_backend_env, fused_args)
    assert fused.module.config.bias_activation_fusion and fused.module.config.bias_dropout_fusion
    _assert_same(_run(fused, _cases._batch()), expected)
    assert set(calls) == {"swiglu", "swiglu_back", "bias_dropout_add_fused_train", "bias_dropout_add_fused_inference"}


def test_compiled_decoder_layers_give_the_same_step(cpu_backend_env, baseline, monkeypatch):
    from slime_train_megatron import model, trainer_parts

    hf_dir, expected, _, baseline_compiled = baseline
    assert baseline_compiled == []  # the default path compiles no layer
    compiled = []

    def compile_aot_eager(module):
        compiled.append(model.compile_decoder_layers(module, backend="aot_eager"))
        return compiled[-1]

    monkeypatch.setattr(trainer_parts, "compile_decoder_layers", compile_aot_eager)
    flags = [*_cases._config(hf_dir).megatron_args, "--megatron-compile-layers"]
    backend = _backend(cpu_backend_env, _cases._config(hf_dir, megatron_args=flags))
    assert compiled == [2]  # both decoder layers of the tiny model
    torch._dynamo.utils.counters.clear()
    _assert_same(_run(backend, _cases._batch()), expected)
    # megatron-core's RowParallelLinear warned on every call (`tp_group=None`), a graph break in every compiled layer
    # until `model.tp_group_or_default` resolved the group without the warning.
    breaks = [reason for reason in torch._dynamo.utils.counters["graph_break"] if "warn" in reason]
    assert torch._dynamo.utils.counters["graph_break"] and breaks == []  # RoPE's .tolist() still breaks


def _backend(env, args):
    backend = env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    return backend
