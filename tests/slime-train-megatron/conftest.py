"""Fixtures for the Megatron backend tests: tiny HF models and a one-rank gloo world for megatron-core."""

from __future__ import annotations

import contextlib
import socket

import pytest
import torch

TINY = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=300, max_position_embeddings=256, rms_norm_eps=1e-6,
)  # fmt: skip
FAMILIES = {
    "qwen3": dict(head_dim=32, tie_word_embeddings=False),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3_moe": dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    # Llama 3.1: RoPE frequencies scaled by 'llama3' (written by transformers 5 as rope_parameters).
    "llama": dict(
        head_dim=32,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),  # fmt: skip
    # GLM-4-0414: q/k/v biases, interleaved RoPE on half of each head, sandwich norms, fused gate_up_proj.
    "glm4": dict(
        head_dim=16,
        attention_bias=True,
        partial_rotary_factor=0.5,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    """Factory: `tiny_hf(model_type) -> (fp32 HF model, dir)`; norms/biases randomized."""
    pytest.importorskip("transformers")
    import transformers

    cache: dict[str, tuple] = {}

    def make(model_type: str):
        if model_type not in cache:
            out = tmp_path_factory.mktemp(f"hf-{model_type}")
            config = transformers.AutoConfig.for_model(model_type, **TINY, **FAMILIES[model_type])
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "norm" in name or "bias" in name:
                        p.normal_(1.0 if "norm" in name else 0.0, 0.1)
            model.save_pretrained(out)
            cache[model_type] = (model, out)
        return cache[model_type]

    return make


@pytest.fixture()
def megatron_cpu_world(monkeypatch):
    """torch.distributed (gloo, world 1) + megatron parallel_state, with CPU shims for CUDA-only calls."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    created = not dist.is_initialized()
    if created:
        # monkeypatch: restored after the test, so later subprocesses (benchmarks) do not inherit a stale port
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    # RoPE moves its buffer to torch.cuda.current_device(); attention dropout forks the CUDA RNG. On CPU: "cpu", a
    # no-op fork. (The MoE router's GEMM runs as in a run: `slime_train_megatron.model._router_gemm_without_te`.)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(get_cuda_rng_tracker(), "fork", lambda *a, **k: contextlib.nullcontext())
    yield
    parallel_state.destroy_model_parallel()
    if created:
        dist.destroy_process_group()


class _CpuAdam:
    """megatron-core's optimizer interface as the backend uses it, over torch Adam on the DDP `main_grad`s."""

    def __init__(self, config, models):
        self.params = [p for m in models for p in m.parameters() if p.requires_grad]  # as megatron-core's
        self.opt = torch.optim.Adam(self.params, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2))
        self.param_groups, self.clip = self.opt.param_groups, config.clip_grad

    def scale_loss(self, loss):
        return loss

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def reload_model_params(self):
        pass

    def step(self):
        for p in self.params:  # megatron DDP accumulates into main_grad
            p.grad = p.main_grad.to(p.dtype)
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        return True, float(norm), None

    def sharded_state_dict(self, model_sd, is_loading=False):
        return {}

    def load_state_dict(self, sd):
        pass


def _cpu_schedule(  # megatron-core's `forward_backward_no_pipelining`, minus its CUDA token counter
    *, forward_step_func, data_iterator, model, num_microbatches, seq_length, micro_batch_size, forward_only
):
    # megatron-core's own forward/backward steps: they divide each loss by the micro-batch count and set the MoE
    # router's aux-loss scale, as on the GPU.
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import schedules

    config = model[0].config
    store: list = []
    for i in range(num_microbatches):
        output, _ = schedules.forward_step(forward_step_func, data_iterator, model[0], num_microbatches, None, store,
                                           config, 1, current_microbatch=i, is_first_microbatch=i == 0)  # fmt: skip
        if not forward_only:
            schedules.backward_step(None, output, None, ModelType.encoder_or_decoder, config)
    if not forward_only:
        config.finalize_model_grads_func(model)


@pytest.fixture()
def cpu_backend_env(monkeypatch, megatron_cpu_world):
    """The backend module with CPU stand-ins for megatron-core's CUDA-only optimizer and schedule."""
    from slime_train_megatron import backend, pipeline, trainer_parts

    # Where the actor and the critic get them (both are built from trainer_parts and run through pipeline).
    monkeypatch.setattr(trainer_parts, "get_megatron_optimizer", _CpuAdam)
    monkeypatch.setattr(pipeline, "get_forward_backward_func", lambda: _cpu_schedule)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    return backend


@pytest.fixture()
def two_sample_batch():
    """One optimizer step of two packed samples (5 and 4 tokens, 2 response tokens each), rewards 1 and -1."""
    import torch

    from slime_core.batch import RolloutBatch

    tokens = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8, 9])]
    return RolloutBatch(
        tokens=tokens, response_lengths=[2, 2], loss_masks=[torch.ones(2), torch.ones(2)], rewards=[1.0, -1.0],
        raw_rewards=[1.0, 0.0], loss_denominators=[2.0, 2.0], micro_batches=[[[0, 1]]], step_sample_counts=[2],
        step_token_counts=[4.0],
    )  # fmt: skip
