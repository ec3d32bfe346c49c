"""Megatron `--no-save-optim`: the checkpoint holds no optimizer state, and its resume needs `--no-load-optim`.

As the original (Megatron-LM leaves the optimizer out and stops a resume that asks for it). Before, the flag was
ignored: every checkpoint carried the optimizer's state. CPU stand-ins as in test_backend_cpu.py.
"""

import pytest
import torch

from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")


def _common_state(iteration_dir):
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load_common_state_dict(str(iteration_dir))


@pytest.mark.parametrize("no_save_optim", [True, False])
def test_no_save_optim_leaves_the_optimizer_out_and_its_resume_needs_no_load_optim(
    cpu_backend_env, tiny_hf, tmp_path, no_save_optim, two_sample_batch
):
    _, hf_dir = tiny_hf("qwen3")
    megatron_args = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]
    args = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": megatron_args, "save": str(tmp_path / "save"), "advantage_estimator": "grpo",
        "no_save_optim": no_save_optim,
    })  # fmt: skip
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    backend.train(0, two_sample_batch)
    backend.save(0)
    # The stand-in optimizer shards nothing; the scheduler's state (common state) shows what was left out.
    common = _common_state(tmp_path / "save" / "iter_0000000")
    assert common["rollout_id"] == 0 and common["optimizer_saved"] is not no_save_optim
    assert ("opt_param_scheduler" in common) is not no_save_optim  # was: always saved

    def resume(*extra):
        load = args.model_copy(update={"megatron_args": [*megatron_args, "--load", str(tmp_path / "save"), *extra],
                                       "save": None})  # fmt: skip
        return cpu_backend_env.MegatronTrainBackend().init(load, with_ref=False)

    if no_save_optim:
        with pytest.raises(ValueError) as e:
            resume()
        assert str(e.value) == (
            f"--load {tmp_path / 'save'}: iter_0000000 holds no optimizer state (saved with --no-save-optim); "
            "resume it with --no-load-optim to start the optimizer and its learning-rate schedule afresh"
        )
        assert resume("--no-load-optim") == 1
    else:
        assert resume() == 1


def _trained_and_saved_at_rollout_0(cpu_backend_env, tiny_hf, tmp_path, batch):
    """A one-rank fp32 Megatron backend on the tiny qwen3, trained one step and saved in `tmp_path/save` as rollout 0.

    Returns:
        `(backend, its args, {parameter name: its trained value})`.
    """
    _, hf_dir = tiny_hf("qwen3")
    megatron_args = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]
    args = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": megatron_args, "save": str(tmp_path / "save"), "advantage_estimator": "grpo",
    })  # fmt: skip
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    backend.train(0, batch)
    backend.save(0)
    return backend, args, {n: p.detach().clone() for n, p in backend.module.named_parameters()}


def test_a_checkpoint_saved_by_another_number_of_ranks_resumes_without_its_rng_states(
    cpu_backend_env, tiny_hf, tmp_path, monkeypatch, caplog, two_sample_batch
):
    # Issue 27, hostile pass 31: the RNG states are one shard per rank (`rng_state/shard_<rank>_<world>`), so a
    # checkpoint saved by 1 rank and resumed by 2 (another DP, TP or PP size) stopped every rank in megatron's load
    # with "Missing key in checkpoint state_dict: rng_state/shard_0_2" unless --no-load-rng was given. Megatron-LM
    # resumes such a checkpoint and leaves the RNG states out. Here rank 0 of a 2-rank world is what
    # load_checkpoint is told (the load itself runs in this one-rank world, which holds every shard).
    import types

    from slime_train_megatron import checkpoint

    backend, args, trained = _trained_and_saved_at_rollout_0(cpu_backend_env, tiny_hf, tmp_path, two_sample_batch)
    saved_rng = torch.get_rng_state()

    torch.manual_seed(7)  # this run's own RNG state, which a restore would replace
    with torch.no_grad():
        for p in backend.module.parameters():
            p.zero_()
    own_rng = torch.get_rng_state()
    two_ranks = types.SimpleNamespace(get_rank=lambda: 0, get_world_size=lambda: 2)
    with monkeypatch.context() as patch, caplog.at_level("WARNING", logger=checkpoint.__name__):
        patch.setattr(checkpoint, "dist", two_ranks)
        assert checkpoint.load_checkpoint(str(tmp_path / "save"), backend.module, None, None) == 0
    for name, p in backend.module.named_parameters():
        assert torch.equal(p.detach(), trained[name]), name
    assert torch.equal(torch.get_rng_state(), own_rng)
    assert "saved by 1 ranks, loaded by 2: the RNG states are not restored" in caplog.text

    # The rank count it was saved with: the RNG states come back.
    assert checkpoint.load_checkpoint(str(tmp_path / "save"), backend.module, None, None) == 0
    assert torch.equal(torch.get_rng_state(), saved_rng)


def test_a_training_checkpoint_of_the_original_slime_is_not_taken_for_weights_at_rollout_0(
    cpu_backend_env, tiny_hf, tmp_path, two_sample_batch
):
    # Issue 27, hostile pass 31: an `iter_0000005` the original slime wrote (Megatron-LM's save_checkpoint: its common
    # state has `iteration` and `args`, no `rollout_id`) resumed as weights only at rollout 0: the LR warm-up, the
    # prompts and --num-rollout started over, and nothing said so. Megatron-LM's optimizer, schedule and RNG layout are
    # not read here, so the resume asks for --no-load-optim (continue at rollout 6) or --finetune (rollout 0).
    backend, args, trained = _trained_and_saved_at_rollout_0(cpu_backend_env, tiny_hf, tmp_path, two_sample_batch)
    # Rewrite it into the original's layout: iter_0000005, the tracker saying 5, Megatron-LM's common state.
    save = tmp_path / "save"
    (save / "iter_0000000").rename(save / "iter_0000005")
    (save / "latest_checkpointed_iteration.txt").write_text("5")
    common_file = save / "iter_0000005" / "common.pt"
    common = torch.load(common_file, weights_only=False)
    for key in ("rollout_id", "optimizer_saved", "opt_param_scheduler"):
        common.pop(key, None)
    common.update(iteration=5, args={"num_layers": 2})
    torch.save(common, common_file)

    def resume(*extra):
        load = args.model_copy(
            update={"megatron_args": [*args.megatron_args, "--load", str(save), *extra], "save": None}
        )
        resumed = cpu_backend_env.MegatronTrainBackend()
        start = resumed.init(load, with_ref=False)
        for name, p in resumed.module.named_parameters():
            assert torch.equal(p.detach(), trained[name]), name
        return start

    with pytest.raises(ValueError) as e:
        resume()  # was: 0, the weights loaded and the run started over
    assert str(e.value) == (
        f"--load {save}: iter_0000005 is a checkpoint of the original slime (Megatron-LM, iteration 5): its "
        "optimizer, schedule and RNG states are not read here; give --no-load-optim to continue at rollout 6 from "
        "its weights with a fresh optimizer, or --finetune to start from its weights at rollout 0"
    )
    assert resume("--no-load-optim") == 6
    assert resume("--finetune") == 0


def test_a_wsd_run_resumes_mid_anneal_and_another_anneal_is_refused(cpu_backend_env, tiny_hf, tmp_path,
                                                                     two_sample_batch):  # fmt: skip
    # --lr-decay-style WSD was refused; megatron-core's saved schedule leaves the anneal out, so a resume with another
    # --lr-wsd-decay-iters went on with it unannounced. Here: a 3-step anneal from step 0, saved after one step.
    import math

    _, hf_dir = tiny_hf("qwen3")
    megatron_args = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]
    wsd = {"lr": 1e-3, "lr_decay_style": "WSD", "lr_decay_iters": 3, "lr_wsd_decay_iters": 3,
           "lr_wsd_decay_style": "cosine", "min_lr": 1e-4}  # fmt: skip
    args = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 1, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": megatron_args, "save": str(tmp_path / "save"), "advantage_estimator": "grpo", **wsd,
    })  # fmt: skip
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=False)
    backend.train(0, two_sample_batch)
    backend.save(0)
    after_one_step = 1e-4 + (1e-3 - 1e-4) * 0.5 * (math.cos(math.pi / 3) + 1)
    rates = [g["lr"] for g in backend.optimizer.param_groups]
    assert rates == pytest.approx([after_one_step] * len(rates), rel=1e-12)

    def resume(**changed):
        load = args.model_copy(update={"megatron_args": [*megatron_args, "--load", str(tmp_path / "save")],
                                       "save": None, **changed})  # fmt: skip
        resumed = cpu_backend_env.MegatronTrainBackend()
        assert resumed.init(load, with_ref=False) == 1
        return resumed

    resumed = resume()
    assert resumed.scheduler.num_steps == 1
    assert [g["lr"] for g in resumed.optimizer.param_groups] == pytest.approx(rates, rel=1e-12)
    with pytest.raises(ValueError) as e:
        resume(lr_wsd_decay_iters=2)
    assert str(e.value).startswith(f"--load {tmp_path / 'save' / 'iter_0000000'}: the checkpoint's learning-rate ")
    assert "class input value 2 and checkpointvalue 3 for --lr-wsd-decay-iters do not match" in str(e.value)
