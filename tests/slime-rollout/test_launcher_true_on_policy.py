"""`--true-on-policy-mode` reaches every SGLang engine's command line as SGLang's own on-policy flags."""

from slime_core.config import SlimeArgs
from slime_rollout.engines.launch import build_sglang_command


def _command(monkeypatch, **kw):
    monkeypatch.delenv("SLIME_SGLANG_ARGS", raising=False)
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": "/models/qwen3",
                               "train_backend": "fsdp", **kw})  # fmt: skip
    return build_sglang_command(cfg, host="127.0.0.1", port=15000, nccl_port=15001, tp_size=1, base_gpu_id=0,
                                random_seed=1234, memory_saver=False, python="py")  # fmt: skip


def test_mode_adds_on_policy_target_determinism_and_triton(monkeypatch):
    flags = " ".join(_command(monkeypatch, true_on_policy_mode=True))
    assert "--rl-on-policy-target fsdp --enable-deterministic-inference --attention-backend triton" in flags
    assert "--random-seed 1234" in flags


def test_without_the_mode_none_of_them(monkeypatch):
    flags = " ".join(_command(monkeypatch))
    for flag in ("--rl-on-policy-target", "--enable-deterministic-inference", "--attention-backend"):
        assert flag not in flags
