"""`slime_core.compile_setup`: what a trainer compiling its decoder layers sets before its first compile."""

from __future__ import annotations

import logging

import torch
import torch._inductor.async_compile as async_compile

from slime_core import compile_setup


def test_it_starts_torchs_pool_and_a_failure_only_costs_the_head_start(monkeypatch, caplog):
    started = []
    monkeypatch.setattr(async_compile, "maybe_warm_pool", lambda: started.append(True))
    compile_setup.start_compile_workers()
    assert started == [True]

    def broken():
        raise RuntimeError("no pool here")

    monkeypatch.setattr(async_compile, "maybe_warm_pool", broken)
    with caplog.at_level(logging.INFO, logger=compile_setup.__name__):
        compile_setup.start_compile_workers()  # does not raise
    assert "compile workers not started early (RuntimeError: no pool here)" in caplog.text


def _scaled_norm(x, eps):
    return torch.nn.functional.rms_norm(x, (4,), eps=eps) * 2


def test_float_inputs_compile_once_without_dynamos_restart():
    """A float argument (a norm's epsilon, the attention scale) made dynamo restart the frame's analysis after a
    full first attempt (`TensorifyScalarRestartAnalysis`): every fresh trainer process traced and lowered its
    decoder layer twice, 7.8 of the first compiled step's 9.8 s on CPU with every graph cached."""
    from torch._dynamo.utils import get_compilation_metrics

    x = torch.randn(3, 4)
    with torch._dynamo.config.patch(specialize_float=False):  # torch's default; the patch restores what was set
        torch._dynamo.reset()
        torch.compile(_scaled_norm, dynamic=True, backend="aot_eager")(x, 1e-6)
        restart = "<class 'torch._dynamo.exc.TensorifyScalarRestartAnalysis'>"
        assert get_compilation_metrics()[-1].restart_reasons == {restart}  # the restart this avoids
        compile_setup.specialize_float_inputs()
        torch._dynamo.reset()
        out = torch.compile(_scaled_norm, dynamic=True, backend="aot_eager")(x, 1e-6)
        assert get_compilation_metrics()[-1].restart_reasons == set()
    assert torch.equal(out, _scaled_norm(x, 1e-6))
