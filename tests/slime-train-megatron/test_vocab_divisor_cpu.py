"""`--make-vocab-size-divisible-by` in the Megatron actor on CPU: the model, its checkpoints and their checks.

Tiny Qwen3 of vocabulary 300 (conftest `tiny_hf`): 64 pads it to 320 rows at TP 1, Megatron's default 128 to 384.
"""

import pytest
import torch

from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")

_LOCAL_FP32 = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]


def _config(hf_dir, *flags, **fields) -> SlimeArgs:
    return SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": [*_LOCAL_FP32, *flags], **fields,
    })  # fmt: skip


def _hf_log_probs(hf_model, tokens):
    with torch.no_grad():
        return torch.log_softmax(hf_model(tokens[None]).logits[0].double(), -1)[:-1].gather(1, tokens[1:, None])[:, 0]


def test_a_64_padded_checkpoint_loads_with_64_and_is_refused_with_128(cpu_backend_env, tiny_hf, tmp_path):
    from slime_convert import hf_to_mcore
    from slime_core.batch import RolloutBatch

    hf_model, hf_dir = tiny_hf("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "ref", make_vocab_size_divisible_by=64, progress=False)
    divisor = ["--make-vocab-size-divisible-by", "64"]
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(_config(hf_dir, *divisor, "--ref-load", str(tmp_path / "ref"), save=str(tmp_path / "save")),
                 with_ref=False)  # fmt: skip
    embedding = backend.module.embedding.word_embeddings.weight
    assert embedding.shape == (320, 64) and backend.module.output_layer.weight.shape == (320, 64)
    assert torch.equal(embedding[:300].detach(), hf_model.state_dict()["model.embed_tokens.weight"])

    tokens = torch.tensor([5, 17, 299, 3, 250, 8])  # 299: the last real row, next to the padding
    batch = RolloutBatch(
        tokens=[tokens], response_lengths=[5], loss_masks=[torch.ones(5)], rewards=[1.0], raw_rewards=[1.0],
        loss_denominators=[5.0], micro_batches=[[[0]]], step_sample_counts=[1], step_token_counts=[5.0],
    )  # fmt: skip
    (got,) = backend.compute_log_probs(batch)
    torch.testing.assert_close(got.double(), _hf_log_probs(hf_model, tokens), atol=1e-5, rtol=0)  # fp32 vs fp64

    # The weights the engines get: HF names and rows, the padding dropped.
    pushed = dict(kv for bucket in backend.named_hf_weights(1 << 20) for kv in bucket)
    assert pushed.keys() == hf_model.state_dict().keys()
    for name, tensor in hf_model.state_dict().items():
        assert torch.equal(pushed[name], tensor), name

    backend.save(0)
    resumed = cpu_backend_env.MegatronTrainBackend()
    assert resumed.init(_config(hf_dir, *divisor, "--load", str(tmp_path / "save")), with_ref=False) == 1
    (again,) = resumed.compute_log_probs(batch)
    assert torch.equal(again, got)

    for flags, flag, path in (([], "--load", tmp_path / "save"), ([], "--ref-load", tmp_path / "ref")):
        with pytest.raises(ValueError) as info:
            cpu_backend_env.MegatronTrainBackend().init(_config(hf_dir, *flags, flag, str(path)), with_ref=False)
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"{flag} {path}: written with ")
        assert "--make-vocab-size-divisible-by 64, read with --make-vocab-size-divisible-by 128" in message


def test_the_critic_pads_records_and_checks_the_divisor(cpu_backend_env, tiny_hf, tmp_path):
    from slime_core.critic import critic_config
    from slime_train_megatron.critic_backend import MegatronCriticBackend

    _, hf_dir = tiny_hf("qwen3")
    divisor = ["--make-vocab-size-divisible-by", "64"]
    cfg = critic_config(_config(hf_dir, *divisor, advantage_estimator="ppo", save=str(tmp_path / "run")))
    critic = MegatronCriticBackend()
    critic.init(cfg)
    assert critic.module.embedding.word_embeddings.weight.shape == (320, 64)
    critic.save(0)
    assert MegatronCriticBackend().init(critic_config(cfg.model_copy(update={"load": str(tmp_path / "run")}))) == 1
    plain = _config(hf_dir, advantage_estimator="ppo", load=str(tmp_path / "run"))
    with pytest.raises(ValueError) as info:
        MegatronCriticBackend().init(critic_config(plain))
    message = str(info.value)
    assert "\n" not in message and "written with --make-vocab-size-divisible-by 64, read with " in message


def test_an_opd_teacher_checkpoint_with_another_divisor_is_refused(cpu_backend_env, tiny_hf, tmp_path):
    from slime_convert import hf_to_mcore

    _, hf_dir = tiny_hf("qwen3")
    teacher = tmp_path / "teacher"
    hf_to_mcore(hf_dir, teacher, make_vocab_size_divisible_by=64, progress=False)
    opd = dict(use_opd=True, opd_type="megatron", opd_kl_coef=0.5, advantage_estimator="grpo",
               opd_teacher_load=str(teacher))  # fmt: skip
    actor = cpu_backend_env.MegatronTrainBackend()
    actor.init(_config(hf_dir, "--make-vocab-size-divisible-by", "64", **opd), with_ref=False)
    assert actor.has_teacher
    with pytest.raises(ValueError) as info:
        cpu_backend_env.MegatronTrainBackend().init(_config(hf_dir, **opd), with_ref=False)
    assert str(info.value).startswith(f"--opd-teacher-load {teacher}: written with --make-vocab-size-divisible-by 64")


_TP2 = """
import sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, port, hf_dir, ckpt_dir, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from megatron.core import parallel_state
    from slime_convert import ModelArgs
    from slime_train_megatron.checkpoint import load_checkpoint
    from slime_train_megatron.model import build_gpt_model, build_transformer_config, iter_hf_weights, load_hf_weights
    from slime_train_megatron.settings import MegatronSettings

    s = MegatronSettings(tensor_model_parallel_size=2, fp32=True, transformer_impl="local",
                         make_vocab_size_divisible_by=64)
    args = ModelArgs.from_hf_dir(hf_dir, make_vocab_size_divisible_by=s.make_vocab_size_divisible_by)
    parallel_state.initialize_model_parallel(**s.parallel_state_kwargs())
    torch.manual_seed(0)
    config = build_transformer_config(args, s, cpu=True)
    from_hf = build_gpt_model(args, s, config)
    load_hf_weights(from_hf, hf_dir, args, s)
    from_ckpt = build_gpt_model(args, s, config)
    load_checkpoint(ckpt_dir, from_ckpt, None, None, load_rng=False)
    result = {
        "rows": from_hf.embedding.word_embeddings.weight.shape[0],
        "hf": dict(iter_hf_weights(from_hf, args)),
        "ckpt": dict(iter_hf_weights(from_ckpt, args)),
    }
    if rank == 0:
        torch.save(result, out)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]), *sys.argv[2:]), nprocs=2)
"""


@pytest.mark.slow  # two spawned gloo ranks importing megatron-core: ~40 s
def test_tp2_with_divisor_64_loads_hf_and_torch_dist_and_exports_bit_exact(tiny_hf, tmp_path):
    """Two gloo ranks at TP 2: vocabulary 300 → 384 rows (64 × 2 × 3), 192 per rank; HF → model → HF and HF →
    torch_dist → model → HF give back the HF tensors bit for bit."""
    import socket
    import subprocess
    import sys

    from slime_convert import hf_to_mcore

    hf_model, hf_dir = tiny_hf("qwen3")
    ckpt = hf_to_mcore(hf_dir, tmp_path / "mcore", tensor_model_parallel_size=2, make_vocab_size_divisible_by=64,
                       progress=False)  # fmt: skip
    script = tmp_path / "tp2.py"
    script.write_text(_TP2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "out.pt"
    subprocess.run([sys.executable, str(script), str(port), str(hf_dir), str(ckpt), str(out)], check=True,
                   timeout=300)  # fmt: skip
    result = torch.load(out, weights_only=False)
    assert result["rows"] == 192
    expected = hf_model.state_dict()
    for source in ("hf", "ckpt"):
        assert result[source].keys() == expected.keys(), source
        for name, tensor in expected.items():
            assert torch.equal(result[source][name], tensor), (source, name)
