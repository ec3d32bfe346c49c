"""`model_loading.start_compile_workers`: inductor's worker pool started at model build, not at the first compile."""

from __future__ import annotations

import logging

import torch._inductor.async_compile as async_compile

from slime_train_fsdp import model_loading


def test_it_starts_torchs_pool_and_a_failure_only_costs_the_head_start(monkeypatch, caplog):
    started = []
    monkeypatch.setattr(async_compile, "maybe_warm_pool", lambda: started.append(True))
    model_loading.start_compile_workers()
    assert started == [True]

    def broken():
        raise RuntimeError("no pool here")

    monkeypatch.setattr(async_compile, "maybe_warm_pool", broken)
    with caplog.at_level(logging.INFO, logger=model_loading.__name__):
        model_loading.start_compile_workers()  # does not raise
    assert "compile workers not started early (RuntimeError: no pool here)" in caplog.text
