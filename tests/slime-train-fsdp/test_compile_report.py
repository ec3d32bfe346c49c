"""`FSDPTrainBackend.init` reports whether it compiled the decoder layers (`compile_layers_flag`): one gloo rank, CPU.

The driver names the first step "compile+train" from this report instead of restating
`model_loading.compiles_layers` (issue 27: the restated rule disagreed with the Megatron backend's).
"""

import pytest
import torch
import torch.distributed as dist

from slime_core.config import SlimeArgs


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(("fields", "reported"), [
    ({}, None),  # CPU default: eager
    ({"fsdp_compile_layers": True}, "--fsdp-compile-layers"),
])  # fmt: skip
def test_init_reports_the_compile_decision_it_used(tmp_path, make_tiny_qwen3, one_rank, fields, reported):
    from slime_train_fsdp import FSDPTrainBackend

    ckpt = make_tiny_qwen3(tmp_path / "model")
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp",
                               "hf_checkpoint": str(ckpt), **fields})  # fmt: skip
    backend = FSDPTrainBackend()
    assert backend.compile_layers_flag is None
    # Compiling sets a process-wide dynamo option (`prepare_layer_compile`): restored after the test.
    with torch._dynamo.config.patch(specialize_float=torch._dynamo.config.specialize_float):
        assert backend.init(cfg, with_ref=False) == 0
    compiled = [m for m in backend.model.model.layers if getattr(m, "_compiled_call_impl", None) is not None]
    assert backend.compile_layers_flag == reported
    assert len(compiled) == (2 if reported else 0)  # the report is what init did to the layers


@pytest.mark.parametrize(("fields", "reported"), [
    ({}, None),
    ({"fsdp_compile_layers": True}, "--fsdp-compile-layers"),
])  # fmt: skip
def test_the_critic_reports_the_compile_decision_it_used(tmp_path, make_tiny_qwen3, one_rank, fields, reported):
    """Issue 27: the critic compiled its layers as the actor does but reported nothing, so a PPO run's first step
    (the critic's) was not named "compile+train"."""
    from slime_core.critic import critic_config
    from slime_train_fsdp.critic_backend import FSDPCriticBackend

    ckpt = make_tiny_qwen3(tmp_path / "model")
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp",
                               "advantage_estimator": "ppo", "hf_checkpoint": str(ckpt), **fields})  # fmt: skip
    critic = FSDPCriticBackend()
    assert critic.compile_layers_flag is None
    with torch._dynamo.config.patch(specialize_float=torch._dynamo.config.specialize_float):
        assert critic.init(critic_config(cfg)) == 0
    compiled = [m for m in critic.model.model.layers if getattr(m, "_compiled_call_impl", None) is not None]
    assert critic.compile_layers_flag == reported
    assert len(compiled) == (2 if reported else 0)
