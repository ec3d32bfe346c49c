"""`MegatronCriticBackend` (the PPO value model) and the Megatron actor's OPD teacher on CPU (world of 1, fp32).

The CUDA-only pieces of megatron-core (optimizer, pipeline schedule) are the CPU stand-ins of `conftest.py`'s
`cpu_backend_env` fixture; everything else is the backend's own code. Values and log-probs are checked against a
plain transformers forward (1e-5, fp32 against fp32; fp64 softmax for log-probs).
"""

import importlib.util
import pathlib

import pytest
import torch

from slime_core.config import SlimeArgs
from slime_core.critic import critic_config

pytest.importorskip("megatron.core")

_spec = importlib.util.spec_from_file_location(
    "slime_megatron_cpu_harness", pathlib.Path(__file__).with_name("test_backend_cpu.py")
)
_harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness)
_batch = _harness._batch


def _critic_cls():
    # Its optimizer, schedule and forward steps are the base class's: the fixture's CPU patches apply.
    from slime_train_megatron.critic_backend import MegatronCriticBackend

    return MegatronCriticBackend()


FLAGS = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer"]


def _run_config(hf_dir, **fields) -> SlimeArgs:
    return SlimeArgs.from_dict(
        {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
         "megatron_args": FLAGS, "rollout_temperature": 0.9, **fields}
    )  # fmt: skip


def _hf_values(hf_dir, head_w, head_b, batch) -> list[torch.Tensor]:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for t, r in zip(batch.tokens, batch.response_lengths, strict=True):
            hidden = model(t[None]).last_hidden_state[0, len(t) - r - 1 : len(t) - 1]
            out.append(hidden @ head_w[0] + head_b[0])
    return out


def test_critic_values_training_checkpoint(cpu_backend_env, tiny_hf, tmp_path):
    _, hf_dir = tiny_hf("qwen2")  # tied embeddings: the critic unties them
    cfg = critic_config(
        _run_config(hf_dir, advantage_estimator="ppo", critic_lr=1e-2, lr=1e-6, save=str(tmp_path / "run"))
    )
    from slime_core.protocols import CriticBackend

    critic = _critic_cls()
    assert isinstance(critic, CriticBackend)
    assert critic.init(cfg) == 0
    head = critic.module.output_layer
    assert tuple(head.weight.shape) == (1, 64) and float(head.bias.detach().abs().max()) == 0.0
    assert not critic.module.share_embeddings_and_output_weights
    batch = _batch()
    values = critic.compute_values(batch)
    expected = _hf_values(hf_dir, head.weight.detach(), head.bias.detach(), batch)
    for got, want in zip(values, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    history = [critic.train_critic(rid, batch)[0] for rid in range(12)]
    assert history[0]["train/critic-lr"] == pytest.approx(1e-2)  # --critic-lr
    # γ = λ = 1: the returns are the rewards [1, -1, 0.5]; the critic fits them.
    assert history[-1]["train/critic-value_loss"] < 0.2 * history[0]["train/critic-value_loss"]
    assert history[-1]["train/critic-explained_variance"] > 0.8 > history[0]["train/critic-explained_variance"]
    critic.save(11)
    assert (tmp_path / "run" / "critic" / "latest_checkpointed_iteration.txt").read_text() == "11"
    saved = critic.compute_values(batch)
    resumed = _critic_cls()
    assert resumed.init(critic_config(cfg.model_copy(update={"load": str(tmp_path / "run")}))) == 12
    for a, b in zip(saved, resumed.compute_values(batch), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="neither a critic torch_dist checkpoint nor an HF directory"):
        _critic_cls().init(critic_config(cfg.model_copy(update={"critic_load": "/nope"})))


def test_an_actors_checkpoint_given_as_the_critics_is_refused_naming_the_flag(cpu_backend_env, tiny_hf, tmp_path):
    # Issue 27, hostile pass 31: --critic-load at the actor's save (an easy slip: both are torch_dist folders) stopped
    # the critic's ranks inside megatron's load ("CheckpointException ... KeyError: 'output_layer.bias'").
    _, hf_dir = tiny_hf("qwen3")
    run = _run_config(hf_dir, advantage_estimator="ppo", save=str(tmp_path / "actor"))
    actor = cpu_backend_env.MegatronTrainBackend()
    actor.init(run, with_ref=False)
    actor.save(0)
    with pytest.raises(ValueError) as e:
        _critic_cls().init(critic_config(run.model_copy(update={"critic_load": str(tmp_path / "actor"), "save": None})))
    assert str(e.value) == (
        f"--critic-load {tmp_path / 'actor'}: iter_0000000 is not a critic checkpoint: it holds an output layer of "
        "shape [384, 64], a value head is [1, 64] with a bias (an actor's checkpoint? the critic's are saved in "
        "<--save>/critic); give the critic's checkpoint folder, or an HF directory to start the value model from"
    )
    # The critic's own checkpoint next to it resumes.
    critic = _critic_cls()
    critic.init(critic_config(run))
    critic.save(0)
    assert _critic_cls().init(critic_config(run.model_copy(update={"load": str(tmp_path / "actor")}))) == 1


def test_the_critic_is_a_critic_backend_and_nothing_of_the_actor():
    """Composition, not an actor subclass that refuses: the actor-only API does not exist on the critic."""
    from slime_core.critic import CriticStepBackend
    from slime_core.protocols import CriticBackend, TrainBackend
    from slime_train_megatron.backend import MegatronTrainBackend
    from slime_train_megatron.critic_backend import MegatronCriticBackend

    assert not issubclass(MegatronCriticBackend, MegatronTrainBackend)
    critic = MegatronCriticBackend()
    assert isinstance(critic, CriticBackend) and isinstance(critic, CriticStepBackend)
    assert not isinstance(critic, TrainBackend)
    actor_only = ("compute_log_probs", "train", "update_ref", "has_ref", "has_teacher", "save_hf", "named_hf_weights")
    assert [m for m in actor_only if hasattr(critic, m)] == []


def test_opd_teacher_from_hf_and_from_a_checkpoint(cpu_backend_env, tiny_hf, tmp_path):
    from transformers import AutoModelForCausalLM

    student_model, student_dir = tiny_hf("qwen3")
    teacher_dir = tmp_path / "teacher"
    torch.manual_seed(1)
    teacher_model = AutoModelForCausalLM.from_config(student_model.config, dtype=torch.float32).eval()
    teacher_model.save_pretrained(teacher_dir)
    opd = dict(use_opd=True, opd_type="megatron", opd_kl_coef=0.5, advantage_estimator="grpo")
    actor = cpu_backend_env.MegatronTrainBackend()
    actor.init(_run_config(student_dir, opd_teacher_load=str(teacher_dir), **opd), with_ref=False)
    assert actor.has_teacher
    batch = _batch()

    def hf_log_probs(model):
        out = []
        with torch.no_grad():
            for t, r in zip(batch.tokens, batch.response_lengths, strict=True):
                lp = torch.log_softmax(model(t[None]).logits[0].double() / 0.9, -1)
                out.append(lp[len(t) - r - 1 : len(t) - 1].gather(1, t[len(t) - r :, None])[:, 0])
        return out

    student = actor.compute_log_probs(batch)
    teacher = actor.compute_log_probs(batch, model="teacher")
    for got, want in zip(teacher, hf_log_probs(teacher_model), strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    for got, want in zip(actor.compute_log_probs(batch), student, strict=True):
        assert torch.equal(got, want)  # the actor's weights are back after the teacher's forward
    metrics = actor.train(0, batch)
    assert metrics["train/opd_reverse_kl"] != 0.0
    actor.cfg = actor.cfg.model_copy(update={"save": str(tmp_path / "student")})
    actor.settings = actor.settings.model_copy(update={"save": str(tmp_path / "student")})
    actor.save(0)
    trained = actor.compute_log_probs(batch)
    from_ckpt = cpu_backend_env.MegatronTrainBackend()
    from_ckpt.init(_run_config(student_dir, opd_teacher_load=str(tmp_path / "student"), **opd), with_ref=False)
    for got, want in zip(from_ckpt.compute_log_probs(batch, model="teacher"), trained, strict=True):
        assert torch.equal(got, want)
