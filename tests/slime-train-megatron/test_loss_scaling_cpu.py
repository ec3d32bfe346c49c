"""How the Megatron backend's gradient adds up over micro-batches, on CPU (world of 1, local spec, fp32).

megatron-core's own forward/backward steps run (the `cpu_backend_env` schedule), so their loss and MoE aux-loss
scaling is what is tested. A step's gradient is the original's: the main loss a mean over the step's samples, the MoE
router's load-balancing loss a mean over micro-batches (and DP ranks). Duplicating a sample, in a second
micro-batch or packed into the same one, therefore leaves the gradient unchanged: the samples' mean is the same, and
the switch load-balancing loss of a micro-batch (E·Σ_e f_e·P_e, both fractions of its tokens) is the same for
[A] and [A, A]. Tolerance: 1e-6 relative to the largest gradient entry (fp32, different summation orders).
"""

import pytest
import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")

_SAMPLE = torch.tensor([5, 17, 33, 2, 9, 41, 7, 12])  # prompt of 4, response of 4


def _copies(n: int, *, packed: bool) -> RolloutBatch:
    """One optimizer step of `n` copies of one sample: one micro-batch holding all, or one micro-batch each."""
    return RolloutBatch(
        tokens=[_SAMPLE.clone() for _ in range(n)], response_lengths=[4] * n, loss_masks=[torch.ones(4)] * n,
        rewards=[1.0] * n, raw_rewards=[1.0] * n, loss_denominators=[4.0] * n,
        micro_batches=[[list(range(n))] if packed else [[i] for i in range(n)]], step_sample_counts=[n],
        step_token_counts=[4.0 * n],
    )  # fmt: skip


def _step_gradient(backend_module, args: SlimeArgs, batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """The gradient the optimizer steps with (DDP's `main_grad`), by parameter name."""
    backend = backend_module.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    step, seen = backend.optimizer_step, {}

    def capture():
        seen.update({n: p.main_grad.detach().clone() for n, p in backend.module.named_parameters()})
        return step()

    backend.optimizer_step = capture
    backend.train(0, batch)
    return seen


@pytest.mark.parametrize("aux_coeff", ["0", "0.1"])
def test_duplicated_samples_leave_the_step_gradient_unchanged(cpu_backend_env, tiny_hf, aux_coeff):
    _, hf_dir = tiny_hf("qwen3_moe")
    flags = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3",
             "--moe-token-dispatcher-type", "allgather", "--moe-aux-loss-coeff", aux_coeff]  # fmt: skip
    run = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "advantage_estimator": "grpo"}
    args = SlimeArgs.from_dict({**run, "hf_checkpoint": str(hf_dir), "megatron_args": flags})
    one = _step_gradient(cpu_backend_env, args, _copies(1, packed=True))
    scale = max(float(g.abs().max()) for g in one.values())
    assert any(float(g.abs().max()) > 0 for n, g in one.items() if "router" in n)
    for packed in (False, True):
        two = _step_gradient(cpu_backend_env, args, _copies(2, packed=packed))
        for name, g in one.items():
            assert float((two[name] - g).abs().max()) <= 1e-6 * scale, (packed, name)


def test_step_gradient_is_the_mean_over_the_steps_samples_by_hand(cpu_backend_env, tiny_hf):
    """Two samples in two micro-batches, GRPO on-policy (ratio 1): the output layer's gradient (no router loss reaches
    it) is `-(1/2) Σ_i A_i/D_i Σ_t ∇ log p_it`, computed here with the HF model."""
    hf_model, hf_dir = tiny_hf("qwen3_moe")
    flags = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3",
             "--moe-token-dispatcher-type", "allgather"]  # fmt: skip
    run = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "advantage_estimator": "grpo"}
    args = SlimeArgs.from_dict({**run, "hf_checkpoint": str(hf_dir), "megatron_args": flags})
    tokens = [_SAMPLE.clone(), torch.tensor([3, 8, 1, 22, 19, 4])]
    masks = [torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 1.0])]
    rewards = [1.0, -0.5]
    batch = RolloutBatch(
        tokens=tokens, response_lengths=[4, 3], loss_masks=masks, rewards=rewards, raw_rewards=rewards,
        loss_denominators=[3.0, 3.0], micro_batches=[[[0], [1]]], step_sample_counts=[2], step_token_counts=[6.0],
    )  # fmt: skip
    got = _step_gradient(cpu_backend_env, args, batch)["output_layer.weight"]

    hf_model.zero_grad(set_to_none=True)
    loss = 0.0
    for t, m, a in zip(tokens, masks, rewards, strict=True):
        r = m.numel()
        logp = torch.log_softmax(hf_model(t[None]).logits[0, -r - 1 : -1], -1).gather(1, t[-r:, None])[:, 0]
        loss = loss - a * (logp * m).sum() / m.sum() / len(tokens)
    loss.backward()
    want = hf_model.lm_head.weight.grad
    torch.testing.assert_close(got[: want.shape[0]], want, atol=1e-6 * float(want.abs().max()), rtol=0)
