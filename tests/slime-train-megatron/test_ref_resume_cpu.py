"""Megatron resume with `--ref-update-interval`: the KL reference comes back as the actor of its last update.

Issue 27 (pass 27): the resumed backend rebuilt the reference from `--ref-load` / `--hf-checkpoint`, so the KL term
ran against the initial weights until the next update, where an uninterrupted run had the actor's. The checkpoint
now keeps the reference (`iter_XXXXXXX/ref`, torch_dist). CPU stand-ins as in test_backend_cpu.py.
"""

import logging

import pytest

from slime_core.config import SlimeArgs

pytest.importorskip("megatron.core")


def _differ(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def test_the_reference_that_follows_the_actor_resumes_with_it(
    cpu_backend_env, tiny_hf, tmp_path, caplog, two_sample_batch
):
    _, hf_dir = tiny_hf("qwen3")
    megatron_args = ["--fp32", "--transformer-impl", "local", "--no-use-distributed-optimizer", "--lr", "1e-3"]
    args = SlimeArgs.from_dict({
        "rollout_batch_size": 1, "num_rollout": 3, "train_backend": "megatron", "hf_checkpoint": str(hf_dir),
        "megatron_args": megatron_args, "save": str(tmp_path / "save"), "advantage_estimator": "grpo",
        "use_kl_loss": True, "kl_loss_coef": 0.01, "ref_update_interval": 2,
    })  # fmt: skip
    backend = cpu_backend_env.MegatronTrainBackend()
    backend.init(args, with_ref=True)
    batch = two_sample_batch
    initial = backend.compute_log_probs(batch)
    for rollout_id in range(3):  # the reference becomes the actor after rollout 1, then the actor moves on
        backend.train(rollout_id, batch)
    reference, actor = backend.compute_log_probs(batch, model="ref"), backend.compute_log_probs(batch)
    backend.save(2)

    def resume(folder=tmp_path / "save"):
        load = args.model_copy(update={"megatron_args": [*megatron_args, "--load", str(folder)],
                                       "save": None})  # fmt: skip
        resumed = cpu_backend_env.MegatronTrainBackend()
        assert resumed.init(load, with_ref=True) == 3
        return resumed

    resumed = resume()
    assert _differ(resumed.compute_log_probs(batch, model="ref"), reference) == 0.0  # was the initial weights
    assert _differ(resumed.compute_log_probs(batch), actor) == 0.0
    assert _differ(reference, initial) > 1e-4
    assert (tmp_path / "save" / "iter_0000002" / "ref" / ".metadata").is_file()
    # --load naming the iteration folder itself (as the actor's load accepts): the reference was looked for in
    # iter_0000002/iter_0000002/ref, so the run warned and kept the initial weights.
    resumed = resume(tmp_path / "save" / "iter_0000002")
    assert _differ(resumed.compute_log_probs(batch, model="ref"), reference) == 0.0

    import shutil

    shutil.rmtree(tmp_path / "save" / "iter_0000002" / "ref")  # a checkpoint written before the reference was kept
    with caplog.at_level(logging.WARNING, logger="slime_train_megatron.backend"):
        resumed = resume()
    assert _differ(resumed.compute_log_probs(batch, model="ref"), initial) == 0.0
    assert f"--load {tmp_path / 'save'}: iter_0000002 holds no reference model" in caplog.text
