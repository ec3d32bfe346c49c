"""`--use-torch-fused-adam` / `--use-foreach-grad-norm` (torch_optimizer.py) give megatron-core's fallback numbers.

megatron-core's optimizer and grad norm hard-code CUDA, so the pieces are checked on CPU directly: the multi-tensor
norm against a norm of the concatenated gradients, the scaling against megatron-core's own local implementation,
and torch's fused AdamW (switched on after construction, as megatron-core builds it) against the foreach AdamW
megatron-core runs by default, step by step (fp32; tolerances: 1e-6 relative on norms, 1e-6 absolute on weights).
"""

import types

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core import utils as mcore_utils  # noqa: E402
from megatron.core.optimizer import clip_grads  # noqa: E402

from slime_train_megatron import torch_optimizer as tp  # noqa: E402
from slime_train_megatron import trainer_parts  # noqa: E402
from slime_train_megatron.settings import MegatronSettings  # noqa: E402
from slime_train_megatron.torch_optimizer import (  # noqa: E402
    foreach_l2_norm,
    foreach_scale,
    use_foreach_grad_norm,
    use_torch_fused_adam,
)


def _grads(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in ((7, 5), (5,), (3, 4, 2), (1,))]


def test_foreach_norm_is_the_norm_of_all_gradients_together():
    grads = _grads()
    norm, extra = foreach_l2_norm(2048 * 32, None, [grads], False)
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    assert extra is None and norm.shape == (1,) and norm.dtype == torch.float32
    torch.testing.assert_close(norm[0], expected, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="per_tensor=False"):
        foreach_l2_norm(1, None, [grads], True)


@pytest.mark.parametrize("in_place", [True, False])
def test_foreach_scale_matches_megatron_cores_local_scale(in_place):
    src = _grads(1)
    ours = [g.clone() for g in src]
    theirs = [g.clone() for g in src]
    if in_place:  # how clip_grad_by_total_norm_fp32 calls it: [grads, grads]
        foreach_scale(1, None, [ours, ours], 0.37)
        mcore_utils.local_multi_tensor_scale(1, None, [theirs, theirs], 0.37)
    else:
        foreach_scale(1, None, [src, ours], 0.37)
        mcore_utils.local_multi_tensor_scale(1, None, [src, theirs], 0.37)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_grad_norm_switch_installs_and_restores_megatron_cores_hooks():
    assert clip_grads.multi_tensor_applier is mcore_utils.local_multi_tensor_applier  # no TE/Apex here
    try:
        assert use_foreach_grad_norm(True)
        assert clip_grads.l2_norm_impl is foreach_l2_norm and clip_grads.multi_tensor_scale_impl is foreach_scale
        # Through megatron-core's own applier, as get_grad_norm_fp32 calls it.
        norm, _ = clip_grads.multi_tensor_applier(clip_grads.l2_norm_impl, None, [_grads()], False)
        torch.testing.assert_close(norm, foreach_l2_norm(1, None, [_grads()], False)[0])
    finally:
        use_foreach_grad_norm(False)
    assert clip_grads.l2_norm_impl is mcore_utils.local_multi_tensor_l2_norm
    assert clip_grads.multi_tensor_scale_impl is mcore_utils.local_multi_tensor_scale


def _megatron_like(params, chained: bool):
    """torch AdamW as megatron-core 0.16 builds it without TE/Apex (no `fused=`), inside its wrapper(s)."""
    adam = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    inner = types.SimpleNamespace(optimizer=adam)
    return adam, (types.SimpleNamespace(chained_optimizers=[inner]) if chained else inner)


@pytest.mark.parametrize("chained", [False, True])
def test_fused_adam_switch_gives_the_foreach_updates(chained):
    start = [torch.randn(6, 4, generator=torch.Generator().manual_seed(3)), torch.randn(4)]
    ref_params = [torch.nn.Parameter(p.clone()) for p in start]
    params = [torch.nn.Parameter(p.clone()) for p in start]
    ref, _ = _megatron_like(ref_params, chained=False)
    adam, wrapper = _megatron_like(params, chained)
    ref.param_groups[0]["foreach"] = adam.param_groups[0]["foreach"] = True  # megatron-core's CUDA default
    for step in range(3):
        gen = torch.Generator().manual_seed(10 + step)
        for p, q in zip(ref_params, params, strict=True):
            g = torch.randn(p.shape, generator=gen)
            p.grad, q.grad = g.clone(), g.clone()
        if step == 1:  # switched mid-run: the counters of the first step move to where the kernel reads them
            assert use_torch_fused_adam(wrapper, True) == 1
            assert adam.param_groups[0]["fused"] is True and adam.param_groups[0]["foreach"] is False
        ref.step()
        adam.step()
        for p, q in zip(ref_params, params, strict=True):
            torch.testing.assert_close(q, p, atol=1e-6, rtol=0)
    assert all(state["step"].dtype == torch.float32 and float(state["step"]) == 3 for state in adam.state.values())
    assert use_torch_fused_adam(wrapper, False) == 1 and adam.param_groups[0]["fused"] is None


def test_switches_leave_other_optimizers_alone():
    assert use_torch_fused_adam(types.SimpleNamespace(optimizer=object()), True) == 0  # TE/Apex FusedAdam stand-in


def test_precision_aware_optimizer_without_transformer_engine_is_one_clear_error():
    """Before: megatron-core's OptimizerConfig raised `TypeError: '>=' not supported between 'NoneType' and
    'Version'` (its TE version check) with the local layer spec."""
    settings = MegatronSettings(transformer_impl="local", use_precision_aware_optimizer=True)
    parts = types.SimpleNamespace(config=types.SimpleNamespace(params_dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"--use-precision-aware-optimizer needs Transformer Engine's FusedAdam"):
        trainer_parts.build_optimizer(parts, settings, cfg=None)


def test_device_grad_norm_is_the_2_norm_on_the_device_and_other_norms_go_to_megatron_core():
    """The norm megatron-core returns as a host float (`get_grad_norm_fp32`, world of one: no group), as a tensor."""
    from slime_train_megatron.torch_optimizer import device_grad_norm_fp32

    grads = _grads(4)
    norm = device_grad_norm_fp32(grads)
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    assert torch.is_tensor(norm) and norm.shape == () and norm.dtype == torch.float32
    torch.testing.assert_close(norm, expected, rtol=1e-6, atol=0)
    assert float(device_grad_norm_fp32([])) == 0.0
    assert float(device_grad_norm_fp32(grads[0])) == pytest.approx(float(torch.linalg.vector_norm(grads[0])), rel=1e-6)
    # The inf-norm is megatron-core's own (it hard-codes CUDA: what it is called with is what matters here).
    seen = {}
    real = tp._GRAD_NORM.original
    tp._GRAD_NORM.original = lambda g, n, group: seen.setdefault("call", (len(g), n, group)) and 7.0
    try:
        assert device_grad_norm_fp32(grads, norm_type=float("inf")) == 7.0
    finally:
        tp._GRAD_NORM.original = real
    assert seen["call"] == (4, float("inf"), None)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_device_clip_scales_as_megatron_cores_clip(max_norm):
    """Clipped (coefficient < 1) and not (a multiply by exactly 1.0): the gradients megatron-core's clip leaves."""
    from slime_train_megatron.torch_optimizer import device_clip_grad_by_total_norm_fp32, device_grad_norm_fp32

    params = [torch.nn.Parameter(torch.zeros(g.shape)) for g in _grads(5)]
    for p, g in zip(params, _grads(5), strict=True):
        p.grad = g.clone()
    params.append(torch.nn.Parameter(torch.zeros(3)))  # no grad: skipped, as megatron-core skips it
    norm = device_grad_norm_fp32([p.grad for p in params if p.grad is not None])
    device_clip_grad_by_total_norm_fp32(params, max_norm, norm)
    coeff = max_norm / (float(norm) + 1.0e-6)
    for p, g in zip(params, _grads(5), strict=False):
        expected = g * coeff if coeff < 1.0 else g  # megatron-core: dst = src * coeff only when coeff < 1
        torch.testing.assert_close(p.grad, expected, rtol=1e-6, atol=0)
    assert params[-1].grad is None


def test_grad_norm_switch_puts_the_device_norm_and_clip_in_megatron_cores_optimizer():
    from megatron.core.optimizer import optimizer as mcore_optimizer

    try:
        assert use_foreach_grad_norm(True)
        assert mcore_optimizer.get_grad_norm_fp32 is tp.device_grad_norm_fp32
        assert mcore_optimizer.clip_grad_by_total_norm_fp32 is tp.device_clip_grad_by_total_norm_fp32
    finally:
        use_foreach_grad_norm(False)
    assert mcore_optimizer.get_grad_norm_fp32 is clip_grads.get_grad_norm_fp32
    assert mcore_optimizer.clip_grad_by_total_norm_fp32 is clip_grads.clip_grad_by_total_norm_fp32


def test_grad_norm_switch_without_the_device_norm_keeps_megatron_cores_norm_under_the_foreach_hooks():
    """`device_norm=False` (the benchmark's `all_hostnorm`): foreach hooks, megatron-core's host-read norm and clip."""
    from megatron.core.optimizer import optimizer as mcore_optimizer

    try:
        assert use_foreach_grad_norm(True, device_norm=False)
        assert clip_grads.l2_norm_impl is foreach_l2_norm and clip_grads.multi_tensor_scale_impl is foreach_scale
        assert mcore_optimizer.get_grad_norm_fp32 is clip_grads.get_grad_norm_fp32
        assert mcore_optimizer.clip_grad_by_total_norm_fp32 is clip_grads.clip_grad_by_total_norm_fp32
    finally:
        use_foreach_grad_norm(False, device_norm=False)
    assert clip_grads.l2_norm_impl is mcore_utils.local_multi_tensor_l2_norm


def test_optimizer_step_leaves_a_device_norm_on_the_device_and_reads_a_float_norm():
    class _Sched:
        def step(self, increment):
            self.increment = increment

    def _opt(norm):
        return types.SimpleNamespace(step=lambda: (True, norm, None), param_groups=[{"lr": 0.25}])

    norm, lr = trainer_parts.optimizer_step(_opt(torch.tensor([3.5])), _Sched())
    assert torch.is_tensor(norm) and norm.shape == () and float(norm) == 3.5 and lr == 0.25
    assert trainer_parts.optimizer_step(_opt(2.0), _Sched()) == (2.0, 0.25)
    norm, _ = trainer_parts.optimizer_step(_opt(None), _Sched())
    assert norm != norm  # NaN: the optimizer reported none


def test_foreach_copy_this_to_that_rounds_as_megatron_cores_loop():
    src = _grads(4)
    ours = [torch.empty(g.shape, dtype=torch.bfloat16) for g in src]
    theirs = [torch.empty(g.shape, dtype=torch.bfloat16) for g in src]
    overflow = torch.tensor([3], dtype=torch.int)
    tp.foreach_copy_this_to_that(src, ours, overflow)
    tp._COPY.original(src, theirs)  # megatron-core's bf16 path: one copy_ per tensor
    assert int(overflow) == 0  # zeroed as megatron-core's Apex path does
    for a, b, s in zip(ours, theirs, src, strict=True):
        assert torch.equal(a, b) and not torch.equal(a.float(), s)  # rounded to bf16, not left in fp32


def _distrib_optimizer_state(seed: int):
    """What `DistributedOptimizer._copy_main_params_to_model_params` reads, for one rank owning two buckets.

    Two bf16 model parameters share bucket 0's flat param buffer at offsets 0 and 35 (with a 5-element pad
    between, which must stay untouched), a third lives alone in bucket 1; the fp32 shards are the updated values.
    """
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16)) for shape in ((6, 5), (4, 3), (7,))]
    buckets = [types.SimpleNamespace(param_data=torch.full((52,), 9.0, dtype=torch.bfloat16)),
               types.SimpleNamespace(param_data=torch.full((7,), 9.0, dtype=torch.bfloat16))]  # fmt: skip
    places = {0: (0, 0, 30), 1: (0, 35, 47), 2: (1, 0, 7)}  # param -> (bucket, start, end)
    gbuf_map = {p: (0, torch.bfloat16, places[i][0]) for i, p in enumerate(params)}
    ranges = {p: {"gbuf_world_in_bucket": types.SimpleNamespace(start=places[i][1], end=places[i][2],
                                                                size=places[i][2] - places[i][1])}
              for i, p in enumerate(params)}  # fmt: skip
    shards = [torch.randn(p.numel(), generator=gen) for p in params]
    return types.SimpleNamespace(
        is_stub_optimizer=False,
        ddp_config=types.SimpleNamespace(use_megatron_fsdp=False),
        config=types.SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False),
        shard_fp32_from_float16_groups=[shards[:2]],
        model_float16_groups=[params[:2]],
        shard_fp32_groups=[[shards[2]]],
        model_fp32_groups=[[params[2]]],
        model_param_gbuf_map=gbuf_map,
        buffers=[types.SimpleNamespace(buckets=buckets)],
        data_parallel_group=None,
        _get_model_param_range_map=lambda p: ranges[p],
        _get_fp8_params_and_shard_fp32_from_fp8=lambda: ([], [], []),
    )


def test_distributed_optimizer_param_copy_writes_what_megatron_cores_writes():
    ours, theirs = _distrib_optimizer_state(5), _distrib_optimizer_state(5)
    tp._distrib_copy_main_params_to_model_params(ours)
    tp._DISTRIB_COPY.original(theirs)  # megatron-core's own method on the same state
    for a, b in zip(ours.buffers[0].buckets, theirs.buffers[0].buckets, strict=True):
        assert torch.equal(a.param_data, b.param_data)
    flat = ours.buffers[0].buckets[0].param_data
    assert torch.equal(flat[:30], ours.shard_fp32_from_float16_groups[0][0].bfloat16())
    assert torch.equal(flat[30:35], torch.full((5,), 9.0, dtype=torch.bfloat16))  # the pad is not written


def test_param_copy_switch_installs_and_restores_megatron_cores_copies():
    from megatron.core.optimizer import distrib_optimizer, optimizer

    try:
        tp.use_foreach_param_copy(True)
        assert optimizer._multi_tensor_copy_this_to_that is tp.foreach_copy_this_to_that
        assert (distrib_optimizer.DistributedOptimizer._copy_main_params_to_model_params
                is tp._distrib_copy_main_params_to_model_params)  # fmt: skip
    finally:
        tp.use_foreach_param_copy(False)
    assert optimizer._multi_tensor_copy_this_to_that is tp._COPY.original
    assert distrib_optimizer.DistributedOptimizer._copy_main_params_to_model_params is tp._DISTRIB_COPY.original
