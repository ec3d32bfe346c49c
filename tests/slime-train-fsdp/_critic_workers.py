"""Per-rank scenarios of the FSDP PPO-critic and OPD-teacher tests (`run`): RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT are set.

Each rank writes its results to `OUT/rank{RANK}.pt`; `test_critic_backend.py` and `test_opd_teacher.py` assert
on them.
"""

from __future__ import annotations

import pathlib
import shutil

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModel, AutoModelForCausalLM

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.critic import critic_config
from slime_core.protocols import CriticBackend
from slime_train_fsdp import FSDPCriticBackend, FSDPTrainBackend


def make_cfg(ckpt: str, **overrides) -> SlimeArgs:
    """The critic's config of a PPO run over 8 samples in 2 optimizer steps of 4."""
    base = dict(
        hf_checkpoint=ckpt, train_backend="fsdp", advantage_estimator="ppo", rollout_batch_size=4,
        n_samples_per_prompt=2, global_batch_size=4, num_rollout=40, lr=1e-6, critic_lr=3e-3,
        attn_implementation="sdpa", seed=1234, rollout_temperature=0.7,  # values must ignore it
    )  # fmt: skip
    base.update(overrides)
    return critic_config(SlimeArgs.from_dict(base))


def make_batch(dp_rank: int, dp_size: int) -> RolloutBatch:
    """8 samples (vocab 64) in 2 steps of 4; rank r takes a contiguous slice of each step; rewards ±1."""
    g = torch.Generator().manual_seed(0)
    tokens, resp, masks = [], [], []
    for i in range(8):
        prompt, response = 3 + i % 4, 2 + (i * 3) % 5
        tokens.append(torch.randint(0, 64, (prompt + response,), generator=g))
        mask = torch.ones(response)
        if i % 3 == 0:
            mask[0] = 0.0
        resp.append(response)
        masks.append(mask)
    rewards = [1.0 if i % 2 == 0 else -1.0 for i in range(8)]
    per_rank = 4 // dp_size
    ids = [4 * s + per_rank * dp_rank + j for s in range(2) for j in range(per_rank)]
    micro = [[list(range(s * per_rank, (s + 1) * per_rank))] for s in range(2)]
    return RolloutBatch(
        tokens=[tokens[i] for i in ids],
        response_lengths=[resp[i] for i in ids],
        loss_masks=[masks[i] for i in ids],
        rewards=[rewards[i] for i in ids],
        raw_rewards=[rewards[i] for i in ids],
        loss_denominators=[max(float(masks[i].sum()), 1.0) for i in ids],
        micro_batches=micro,
        sample_indices=ids,
        step_sample_counts=[4, 4],
        step_token_counts=[float(sum(masks[i].sum() for i in range(4 * s, 4 * s + 4))) for s in range(2)],
    )


def full_params(backend: FSDPCriticBackend) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
        for n, p in backend.model.named_parameters()
    }


def reference_values(ckpt: str, head: dict[str, torch.Tensor], batch: RolloutBatch) -> list[torch.Tensor]:
    """Plain transformers backbone, one sequence at a time (eager attention), times the value head."""
    model = AutoModel.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    out = []
    with torch.no_grad():
        for tok, r in zip(batch.tokens, batch.response_lengths, strict=True):
            hidden = model(tok[None]).last_hidden_state[0, -r - 1 : -1]
            out.append(hidden @ head["value_head.weight"][0] + head["value_head.bias"][0])
    return out


def scenario_single(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    batch = make_batch(0, 1)
    critic = FSDPCriticBackend()
    cfg = make_cfg(ckpt, save=str(work / "run"))
    res: dict = {"protocol": isinstance(critic, CriticBackend), "start": critic.init(cfg)}
    params = full_params(critic)
    res["head_std"] = float(params["value_head.weight"].std())
    res["head_bias"] = float(params["value_head.bias"].abs().max())
    values = critic.compute_values(batch)
    ref = reference_values(ckpt, params, batch)
    res["value_diff"] = max(float((a - b).abs().max()) for a, b in zip(values, ref, strict=True))
    history = []
    for rid in range(25):
        metrics, pre = critic.train_critic(rid, batch)
        history.append(metrics)
        if rid == 0:
            res["first_values_diff"] = max(float((a - b).abs().max()) for a, b in zip(pre, values, strict=True))
    res["history"] = history
    critic.save(24)
    res["saved_values"] = critic.compute_values(batch)
    res["saved_dir"] = sorted(p.name for p in (work / "run" / "critic").iterdir())
    resumed = FSDPCriticBackend()
    res["resumed_start"] = resumed.init(make_cfg(ckpt, load=str(work / "run")))
    res["resumed_values"] = resumed.compute_values(batch)
    try:
        FSDPCriticBackend().init(make_cfg(ckpt, critic_load=str(work)))
    except ValueError as exc:
        res["bad_load_error"] = str(exc)
    # An actor's checkpoint given as the critic's: by --critic-load, and as <--load>/critic.
    actor = FSDPTrainBackend()
    actor.init(SlimeArgs.from_dict({**_actor_fields(ckpt), "save": str(work / "actor_run")}), with_ref=False)
    actor.save(0)
    shutil.copytree(work / "actor_run", work / "actor_as_load" / "critic")
    for key, flags in (("critic_load", {"critic_load": str(work / "actor_run")}),
                       ("load", {"load": str(work / "actor_as_load")})):  # fmt: skip
        try:
            FSDPCriticBackend().init(make_cfg(ckpt, **flags))
        except ValueError as exc:
            res[f"actor_ckpt_error_{key}"] = str(exc)
    return res


def scenario_dp(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    critic = FSDPCriticBackend()
    critic.init(make_cfg(ckpt))
    metrics, values = critic.train_critic(0, make_batch(rank, world))
    return {"metrics": metrics, "values": values, "params": full_params(critic)}


def reference_log_probs(path: str, batch: RolloutBatch, temperature: float) -> list[torch.Tensor]:
    """Plain transformers causal LM, one sequence at a time, log-probs of the response tokens at `temperature`."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    out = []
    with torch.no_grad():
        for tok, r in zip(batch.tokens, batch.response_lengths, strict=True):
            logits = model(tok[None]).logits[0, -r - 1 : -1].float() / temperature
            out.append(torch.log_softmax(logits, -1).gather(-1, tok[-r:, None])[:, 0])
    return out


def scenario_teacher(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """The actor holds the OPD teacher of --opd-teacher-load (an HF directory, then an FSDP checkpoint)."""
    teacher_dir = str(work / "teacher_hf")
    batch = make_batch(0, 1)
    opd = dict(advantage_estimator="grpo", lr=1e-3, use_opd=True, opd_type="fsdp", opd_kl_coef=0.5)
    actor = FSDPTrainBackend()
    actor.init(SlimeArgs.from_dict({**_actor_fields(ckpt), **opd, "opd_teacher_load": teacher_dir}), with_ref=False)
    res: dict = {"has_teacher": actor.has_teacher}
    student = actor.compute_log_probs(batch)
    teacher = actor.compute_log_probs(batch, model="teacher")
    diff = lambda a, b: max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))  # noqa: E731
    res["teacher_diff"] = diff(teacher, reference_log_probs(teacher_dir, batch, 0.7))
    res["student_diff"] = diff(student, reference_log_probs(ckpt, batch, 0.7))
    res["student_after_teacher_diff"] = diff(actor.compute_log_probs(batch), student)  # swapped back
    res["metrics"] = actor.train(0, batch)
    res["student"], res["teacher"] = student, teacher
    actor.cfg = actor.cfg.model_copy(update={"save": str(work / "student_ckpt")})
    actor.save(0)
    trained = actor.compute_log_probs(batch)
    from_ckpt = FSDPTrainBackend()
    fields = {**_actor_fields(ckpt), **opd, "opd_teacher_load": str(work / "student_ckpt")}
    from_ckpt.init(SlimeArgs.from_dict(fields), with_ref=False)
    res["ckpt_teacher_diff"] = diff(from_ckpt.compute_log_probs(batch, model="teacher"), trained)
    return res


def _actor_fields(ckpt: str) -> dict:
    return dict(hf_checkpoint=ckpt, train_backend="fsdp", rollout_batch_size=4, n_samples_per_prompt=2,
                global_batch_size=4, num_rollout=4, attn_implementation="sdpa", rollout_temperature=0.7)  # fmt: skip


def scenario_gpu(ckpt: str, out: pathlib.Path, work: pathlib.Path) -> dict:
    """CUDA/NCCL: bf16 values near the fp32 reference, training, sleep frees memory, resume, the OPD teacher."""
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = make_batch(rank, world)
    critic = FSDPCriticBackend()
    critic.init(make_cfg(ckpt, save=str(work / "gpu_run")))
    params = full_params(critic)
    ref = reference_values(ckpt, {k: v.float() for k, v in params.items()}, batch)
    values = critic.compute_values(batch)
    res: dict = {"value_diff": max(float((a - b).abs().max()) for a, b in zip(values, ref, strict=True))}
    res["metrics"] = [critic.train_critic(rid, batch)[0] for rid in range(3)]
    before = torch.cuda.memory_allocated()
    critic.sleep()
    res["mem_before_after_sleep"] = (before, torch.cuda.memory_allocated())
    critic.wake_up()
    critic.save(2)
    saved = critic.compute_values(batch)
    resumed = FSDPCriticBackend()
    res["start"] = resumed.init(make_cfg(ckpt, load=str(work / "gpu_run")))
    res["resume_max_diff"] = max(
        float((a - b).abs().max()) for a, b in zip(saved, resumed.compute_values(batch), strict=True)
    )
    actor = FSDPTrainBackend()
    opd = dict(advantage_estimator="grpo", use_opd=True, opd_type="fsdp", opd_teacher_load=ckpt)
    actor.init(SlimeArgs.from_dict({**_actor_fields(ckpt), **opd}), with_ref=False)
    res["teacher_student_diff"] = max(
        float((a - b).abs().max())
        for a, b in zip(actor.compute_log_probs(batch, model="teacher"), actor.compute_log_probs(batch), strict=True)
    )  # the same weights: the same log-probs
    res["opd_metrics"] = actor.train(0, batch)
    return res


SCENARIOS = {"single": scenario_single, "dp": scenario_dp, "teacher": scenario_teacher, "gpu": scenario_gpu}


def run(scenario: str, out: pathlib.Path, ckpt: str) -> None:
    """Joins the gloo group, runs one scenario, writes `rank{RANK}.pt`."""
    dist.init_process_group("nccl" if scenario == "gpu" else "gloo")
    try:
        torch.manual_seed(0)
        res = SCENARIOS[scenario](ckpt, out, out.parent)
        torch.save(res, out / f"rank{dist.get_rank()}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    import sys

    run(sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3])
