"""`MegatronTrainBackend.init` reports whether it compiled the decoder layers (`compile_layers_flag`), on CPU.

The driver names the first step "compile+train" from this report; it used to restate the rule itself and named a
Qwen3-MoE run's first step so on GPUs, where `settings.compiles_layers` keeps MoE layers eager (issue 27). The GPU
decision is taken here by the real rule with `cuda=True`; the compile itself is recorded, not run (it is lazy and
not what is tested: the report must be what `build_parallel_model` did).
"""

import pytest

pytest.importorskip("megatron.core")

from slime_core.config import SlimeArgs  # noqa: E402


@pytest.mark.parametrize(
    ("model_type", "flags", "compiled"),
    [
        ("qwen3", [], True),  # dense, TP = CP = 1, local spec, packed attention: the GPU default compiles
        ("qwen3_moe", [], False),  # experts stay eager by default (the run that was named "compile+train")
        ("qwen3", ["--no-megatron-compile-layers"], False),
        ("qwen3_moe", ["--megatron-compile-layers"], True),  # an explicit flag wins, MoE too
    ],
)
def test_init_reports_the_compile_decision_it_used(cpu_backend_env, tiny_hf, monkeypatch, model_type, flags, compiled):
    from slime_train_megatron import settings, trainer_parts

    rule = settings.compiles_layers
    monkeypatch.setattr(trainer_parts, "compiles_layers", lambda s, *, cuda, **kw: rule(s, cuda=True, **kw))
    calls = []
    monkeypatch.setattr(trainer_parts, "compile_decoder_layers", lambda module: calls.append(module))
    _, hf_dir = tiny_hf(model_type)
    megatron_args = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", *flags]
    if model_type == "qwen3_moe":  # the default (alltoall) dispatcher builds CUDA buffers
        megatron_args += ["--moe-token-dispatcher-type", "allgather"]
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron",
                               "hf_checkpoint": str(hf_dir), "megatron_args": megatron_args})  # fmt: skip
    backend = cpu_backend_env.MegatronTrainBackend()
    assert backend.compile_layers_flag is None  # nothing reported before init
    assert backend.init(cfg, with_ref=False) == 0
    assert len(calls) == int(compiled)
    assert backend.compile_layers_flag == ("--megatron-compile-layers" if compiled else None)


@pytest.mark.parametrize(("flags", "compiled"), [([], True), (["--no-megatron-compile-layers"], False)])
def test_the_critic_reports_the_compile_decision_it_used(cpu_backend_env, tiny_hf, monkeypatch, flags, compiled):
    """Issue 27: the critic compiled its layers as the actor does but reported nothing (its first step, the run's
    first with PPO, was not named "compile+train")."""
    from slime_core.critic import critic_config
    from slime_train_megatron import settings, trainer_parts
    from slime_train_megatron.critic_backend import MegatronCriticBackend

    rule = settings.compiles_layers
    monkeypatch.setattr(trainer_parts, "compiles_layers", lambda s, *, cuda, **kw: rule(s, cuda=True, **kw))
    calls = []
    monkeypatch.setattr(trainer_parts, "compile_decoder_layers", lambda module: calls.append(module))
    _, hf_dir = tiny_hf("qwen3")
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron",
                               "advantage_estimator": "ppo", "hf_checkpoint": str(hf_dir),
                               "megatron_args": ["--fp32", "--transformer-impl", "local",
                                                 "--no-use-distributed-optimizer", *flags]})  # fmt: skip
    critic = MegatronCriticBackend()
    assert critic.compile_layers_flag is None
    assert critic.init(critic_config(cfg)) == 0
    assert len(calls) == int(compiled)
    assert critic.compile_layers_flag == ("--megatron-compile-layers" if compiled else None)
