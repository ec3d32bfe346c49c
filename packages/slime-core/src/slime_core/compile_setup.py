"""Process-wide torch.compile settings for a trainer that compiles its decoder layers (both backends).

`--fsdp-compile-layers` and `--megatron-compile-layers` compile each decoder layer with `dynamic=True` (regional
compilation). Two things about torch's defaults cost every fresh trainer process time at its first compiled step,
with every graph already in inductor's caches (the compile warm-up's, or an earlier launch's); the backends call
`prepare_layer_compile` before their first compile, in the trainer and in the FSDP warm-up's process alike.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

__all__ = ["prepare_layer_compile", "specialize_float_inputs", "start_compile_workers"]


def prepare_layer_compile(device: torch.device) -> None:
    """`specialize_float_inputs`, and on CUDA `start_compile_workers` (inductor's Triton workers)."""
    specialize_float_inputs()
    if device.type == "cuda":
        start_compile_workers()


def specialize_float_inputs() -> None:
    """Makes dynamo treat Python float inputs of compiled code as constants (process-wide).

    Under `dynamic=True` dynamo first traces a float argument of the decoder layer as a symbolic value; its
    tensorify pass then cannot keep it symbolic and restarts the whole frame's analysis with it constant
    (`TensorifyScalarRestartAnalysis`), after the first attempt went through AOT autograd: in every fresh process
    the layer was traced and lowered twice. CPU, tiny Qwen3 under FSDP: 7.8 of the 9.8 s the first compiled step
    spent compiling, with its graphs all in inductor's cache. Constant is what the restart ends in, so the graphs
    are the same; the compile warm-up and the trainer both set it (the flag is part of the cache key). The floats
    (the attention scale, a norm's epsilon, the head's temperature) are fixed for a run.
    """
    torch._dynamo.config.specialize_float = True


def start_compile_workers() -> None:
    """Starts inductor's pool of compile worker processes now, in the background, instead of at the first compile.

    At a compile, inductor loads each Triton kernel of the graph (from its caches after the compile warm-up) in
    the pool's workers once the pool is up, and one by one in this process until then: a pool that only starts at
    the first compiled step loads that step's kernels serially. Starting it at model build, minutes before the
    first compiled step (the warm-up runs meanwhile), takes that wait off the step. `TORCHINDUCTOR_COMPILE_THREADS=1`
    means no pool (nothing starts). It is torch's own call (`torch._inductor.async_compile.maybe_warm_pool`, made
    at the first compile), so a torch without it only loses the head start.
    """
    try:
        from torch._inductor.async_compile import maybe_warm_pool

        maybe_warm_pool()
    except Exception as exc:  # noqa: BLE001 - private API; without it the first compile starts the pool itself
        logger.info("inductor's compile workers not started early (%s: %s)", type(exc).__name__, exc)
