"""GPU tests of `MegatronTrainBackend` (tiny Qwen3 from config; ranks are fresh `python` processes).

Run on the GPU machine: `uv run pytest tests/slime-train-megatron -m "gpu and megatron"`.
"""

import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.megatron]

WORKER = pathlib.Path(__file__).with_name("_gpu_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(scenario: str, hf_dir: pathlib.Path, out: pathlib.Path, world: int) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        cmd = [sys.executable, str(WORKER), scenario, str(hf_dir), str(out), str(world)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=900)[0] for p in procs]
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"{scenario} rank {rank} failed:\n{log[-5000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _need_gpus(n: int) -> None:
    if not torch.cuda.is_available() or torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA GPU(s)")


def test_log_probs_match_hf_in_bf16(tiny_hf, tmp_path):
    _need_gpus(1)
    hf_model, hf_dir = tiny_hf("qwen3")
    (res,) = _launch("logprobs", hf_dir, tmp_path / "out", 1)
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gpu_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    batch = worker.batch()
    for t, r, got in zip(batch.tokens, batch.response_lengths, res["log_probs"], strict=True):
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(t[None]).logits[0].double() / 0.8, -1)
        expected = ref[len(t) - r - 1 : len(t) - 1].gather(1, t[len(t) - r :, None])[:, 0]
        # bf16 weights and activations vs the fp32 HF model: 0.1 absolute in log-prob.
        torch.testing.assert_close(got.double(), expected, atol=0.1, rtol=0)


def test_grpo_step_and_pushed_weights_equal_trainer_weights(tiny_hf, tmp_path):
    _need_gpus(1)
    _, hf_dir = tiny_hf("qwen3")
    (res,) = _launch("train", hf_dir, tmp_path / "out", 1)
    m = res["metrics"]
    assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0
    assert res["pushed"].keys() == res["own"].keys()
    for name, t in res["own"].items():
        assert torch.equal(res["pushed"][name], t), name


def test_tp2_matches_tp1_loss_grad_norm_and_weights(tiny_hf, tmp_path):
    _need_gpus(2)
    _, hf_dir = tiny_hf("qwen3")
    (tp1,) = _launch("tp", hf_dir, tmp_path / "tp1", 1)
    tp2 = _launch("tp", hf_dir, tmp_path / "tp2", 2)
    for rank in tp2:
        # bf16 with different reduction orders: 2% relative.
        assert rank["metrics"]["train/loss"] == pytest.approx(tp1["metrics"]["train/loss"], rel=2e-2, abs=1e-3)
        assert rank["metrics"]["train/grad_norm"] == pytest.approx(tp1["metrics"]["train/grad_norm"], rel=2e-2)
        for a, b in zip(rank["log_probs"], tp1["log_probs"], strict=True):
            torch.testing.assert_close(a, b, atol=5e-2, rtol=0)
        assert rank["pushed"].keys() == tp1["pushed"].keys()
        for name, t in tp1["pushed"].items():
            torch.testing.assert_close(rank["pushed"][name], t, atol=2e-2, rtol=2e-2, msg=name)
    # Both TP ranks push identical full tensors.
    for name in tp2[0]["pushed"]:
        assert torch.equal(tp2[0]["pushed"][name], tp2[1]["pushed"][name]), name


def test_packed_varlen_attention_matches_dense_mask_path(tiny_hf, tmp_path):
    """The default packed attention (flash varlen on CUDA) vs megatron-core's DotProductAttention with a dense
    block mask (`--attention-backend local`), same bf16 GRPO step: log-probs, loss, grad norm, gradients."""
    _need_gpus(1)
    _, hf_dir = tiny_hf("qwen3")
    (packed,) = _launch("attn_auto", hf_dir, tmp_path / "packed", 1)
    (dense,) = _launch("attn_local", hf_dir, tmp_path / "dense", 1)
    assert packed["attention"] == "packed" and dense["attention"] == "dense"
    # bf16 with different kernels (flash vs unfused fp32 softmax): log-probs 5e-2, scalars 2 %.
    for a, b in zip(packed["log_probs"], dense["log_probs"], strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=0)
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert packed["metrics"][key] == pytest.approx(dense["metrics"][key], rel=2e-2, abs=1e-3), key
    assert packed["grads"].keys() == dense["grads"].keys()
    for name, g in packed["grads"].items():
        ref = dense["grads"][name]
        # Relative error of each gradient tensor as a whole (bf16 activations): 5 %.
        assert float((g - ref).norm()) <= 5e-2 * float(ref.norm()) + 1e-6, name


def test_speed_switches_keep_the_step(tiny_hf, tmp_path):
    """Issue 26's switches all on (`--log-probs-head fused`, torch's fused AdamW, the foreach grad norm, megatron-core's
    SwiGLU and bias-dropout-add fusions, compiled layers) vs all off: the same bf16 GRPO steps. The fused head's
    logits are fp32 where the default head's are bf16: log-probs 5e-2, scalars 2 %, gradients 5 % (as the attention
    comparison above)."""
    _need_gpus(1)
    _, hf_dir = tiny_hf("qwen3")
    (base,) = _launch("speed_base", hf_dir, tmp_path / "base", 1)
    (fast,) = _launch("speed_all", hf_dir, tmp_path / "all", 1)
    for a, b in zip(fast["log_probs"] + fast["after"], base["log_probs"] + base["after"], strict=True):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=0)
    for step in ("metrics", "metrics_2"):
        for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
            assert fast[step][key] == pytest.approx(base[step][key], rel=2e-2, abs=1e-3), (step, key)
    assert fast["grads"].keys() == base["grads"].keys()
    for name, g in fast["grads"].items():
        ref = base["grads"][name]
        assert float((g - ref).norm()) <= 5e-2 * float(ref.norm()) + 1e-6, name


def test_sleep_frees_memory_and_wake_restores(tmp_path):
    _need_gpus(1)
    import transformers

    # ~110M parameters: the freed storages span whole allocator segments, so the driver sees them go.
    config = transformers.Qwen3Config(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
        num_key_value_heads=8, head_dim=64, vocab_size=32000, tie_word_embeddings=False,
    )  # fmt: skip
    hf_dir = tmp_path / "hf"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(hf_dir)
    (res,) = _launch("sleep", hf_dir, tmp_path / "out", 1)
    # bf16 weights + fp32 grad buffer at least; the driver gets (nearly) all of it back.
    assert res["offloaded"] >= 3 * res["param_bytes"] > 0
    assert res["freed"] >= 0.9 * res["offloaded"], (res["freed"], res["offloaded"])
    for a, b in zip(res["before"], res["after"], strict=True):
        assert torch.equal(a, b)


def test_full_recompute_keeps_the_step(tiny_hf, tmp_path):
    """`--recompute-granularity full --recompute-method uniform --recompute-num-layers 1` on the GPU: megatron-core's
    checkpoint saves and restores the CUDA RNG states (replaced on CPU in test_backend_cpu.py) around the compiled
    layers, and the step is the one without recompute. Same kernels, another order of saves: log-probs 1e-2,
    scalars 1 %, gradients 2 % (bf16)."""
    _need_gpus(1)
    _, hf_dir = tiny_hf("qwen3")
    (base,) = _launch("train", hf_dir, tmp_path / "base", 1)
    (again,) = _launch("recompute", hf_dir, tmp_path / "recompute", 1)
    for a, b in zip(again["log_probs"], base["log_probs"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-2, rtol=0)
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert again["metrics"][key] == pytest.approx(base["metrics"][key], rel=1e-2, abs=1e-4), key
    assert again["grads"].keys() == base["grads"].keys()
    for name, g in again["grads"].items():
        ref = base["grads"][name]
        assert float((g - ref).norm()) <= 2e-2 * float(ref.norm()) + 1e-6, name


def test_pinned_sleep_reuses_its_host_buffers_and_wakes_with_the_trained_weights(tiny_hf, tmp_path):
    """`--offload-train-pin-memory` through the real `offload_to_cpu`/`reload_from_cpu` (the CPU test,
    test_sleep_buffers.py, replaces both): the second sleep copies into the first sleep's pinned buffers, and the
    wake-up after it restores the weights of the step trained in between, bit for bit (the same kernels on the same
    inputs)."""
    _need_gpus(1)
    _, hf_dir = tiny_hf("qwen3")
    (res,) = _launch("sleep_pinned", hf_dir, tmp_path / "out", 1)
    assert res["reused"] and res["pinned"]
    for a, b in zip(res["before"], res["after"], strict=True):
        assert torch.equal(a, b)


def test_critic_tp2_with_sequence_parallel_matches_tp1(tiny_hf, tmp_path):
    """The value head under TP=2 + sequence parallelism (values gathered over TP, head grads all-reduced) gives
    TP=1's values, value loss and grad norm (bf16: 2 % relative, 5e-2 absolute on values)."""
    _need_gpus(2)
    _, hf_dir = tiny_hf("qwen3")
    (tp1,) = _launch("critic", hf_dir, tmp_path / "tp1", 1)
    tp2 = _launch("critic", hf_dir, tmp_path / "tp2", 2)
    for rank in tp2:
        for key in ("train/critic-value_loss", "train/critic-grad_norm"):
            for got, want in zip(rank["metrics"], tp1["metrics"], strict=True):
                assert got[key] == pytest.approx(want[key], rel=2e-2, abs=1e-3), key
        for a, b in zip(rank["values"] + rank["after"], tp1["values"] + tp1["after"], strict=True):
            torch.testing.assert_close(a, b, atol=5e-2, rtol=0)
    assert tp1["metrics"][1]["train/critic-value_loss"] < tp1["metrics"][0]["train/critic-value_loss"]
