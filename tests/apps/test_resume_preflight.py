"""Resume checks before a run starts (`slime_app.checkpoints.check_checkpoints`, `--load`): another learning rate,
LoRA flags or base weights, a damaged schedule file, missing optimizer state, a rollout-only run's checkpoint."""

import json
import pathlib

import pytest
from safetensors.torch import save_file

from slime_app.checkpoints import check_checkpoints
from slime_core.config import parse_args


@pytest.fixture
def model(qwen3_4b_stub):
    return qwen3_4b_stub


def _fsdp_checkpoint(fsdp: pathlib.Path, iteration: int, meta: dict | None = None) -> None:
    """An FSDP `--save` folder whose latest iteration `iteration` holds `meta.json` (`{}` by default), no weights."""
    (fsdp / f"iter_{iteration:07d}").mkdir(parents=True)
    (fsdp / f"iter_{iteration:07d}" / "meta.json").write_text(json.dumps(meta or {}))
    (fsdp / "latest_checkpointed_iteration.txt").write_text(str(iteration))


def test_a_resume_with_another_lr_is_refused_before_the_run(model, tmp_path):
    # The trainer refuses it when it loads the checkpoint (slime_train_fsdp.lr_schedule), after Ray and the engines
    # started; the driver's check says it in one line first. Before, the run went on at the checkpoint's --lr.
    import torch

    from slime_train_fsdp.lr_schedule import build_lr_scheduler

    def cfg(*extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "4", "--hf-checkpoint", str(model),
                           "--train-backend", "fsdp", "--lr", "1e-6", "--load", str(fsdp), *extra])  # fmt: skip

    fsdp = tmp_path / "fsdp"
    _fsdp_checkpoint(fsdp, 3)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-6)
    torch.save(build_lr_scheduler(optimizer, cfg()).state_dict(), fsdp / "iter_0000003" / "scheduler.pt")
    assert check_checkpoints(cfg()) == [f"--load {fsdp}: fsdp checkpoint, the run resumes from it"]
    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg("--lr", "2e-6"))
    assert str(e.value).startswith(
        f"--load {fsdp}: the checkpoint's learning-rate schedule differs from this run's flags (--lr 2e-06 here vs "
        "1e-06 saved); a resumed run continues"
    )
    assert check_checkpoints(cfg("--lr", "2e-6", "--no-load-optim"))  # the schedule starts afresh: fine
    # Issue 27 (pass 55): the AdamW flags too (the optimizer state would carry the saved ones).
    with pytest.raises(
        ValueError, match=r"optimizer settings differ from this run's flags \(--weight-decay 0.1 here vs 0"
    ):
        check_checkpoints(cfg("--weight-decay", "0.1"))


def test_a_wsd_checkpoint_resumes_and_another_anneal_is_refused_before_the_run(model, tmp_path):
    # --lr-decay-style WSD was refused at parse time (no --lr-wsd-decay-iters); now the preflight rebuilds the WSD
    # schedule and compares its anneal flags with the checkpoint's, as it does the others.
    import torch

    from slime_train_fsdp.lr_schedule import build_lr_scheduler

    def cfg(*extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "8", "--hf-checkpoint", str(model),
                           "--train-backend", "fsdp", "--lr", "1e-6", "--lr-decay-style", "WSD",
                           "--lr-wsd-decay-iters", "4", "--load", str(fsdp), *extra])  # fmt: skip

    fsdp = tmp_path / "fsdp"
    _fsdp_checkpoint(fsdp, 5)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-6)
    scheduler = build_lr_scheduler(optimizer, cfg())
    for _ in range(6):  # two steps into the anneal of the last 4 of 8 steps
        optimizer.step()
        scheduler.step()
    torch.save(scheduler.state_dict(), fsdp / "iter_0000005" / "scheduler.pt")
    assert check_checkpoints(cfg()) == [f"--load {fsdp}: fsdp checkpoint, the run resumes from it"]
    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg("--lr-wsd-decay-style", "minus_sqrt"))
    assert str(e.value).startswith(
        f"--load {fsdp}: the checkpoint's learning-rate schedule differs from this run's flags (--lr-wsd-decay-style "
        "minus_sqrt here vs exponential saved); a resumed run continues"
    )


def test_a_truncated_scheduler_file_is_one_error_naming_load_and_the_iteration_to_resume_from(model, tmp_path):
    # Issue 27 (pass 55): torch's RuntimeError ("PytorchStreamReader failed reading zip archive") escaped the
    # preflight as a traceback; the trainer's own load calls the same file damaged in one line.
    import torch

    from slime_train_fsdp.lr_schedule import build_lr_scheduler

    fsdp = tmp_path / "fsdp"
    cfg = parse_args(["--rollout-batch-size", "1", "--num-rollout", "4", "--hf-checkpoint", str(model),
                      "--train-backend", "fsdp", "--lr", "1e-6", "--load", str(fsdp)])  # fmt: skip
    for step in (2, 3):
        (fsdp / f"iter_000000{step}").mkdir(parents=True)
        (fsdp / f"iter_000000{step}" / "meta.json").write_text("{}")
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-6)
        torch.save(build_lr_scheduler(optimizer, cfg).state_dict(), fsdp / f"iter_000000{step}" / "scheduler.pt")
    (fsdp / "latest_checkpointed_iteration.txt").write_text("3")
    saved = fsdp / "iter_0000003" / "scheduler.pt"
    saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg)
    assert str(e.value).startswith(f"--load {fsdp}: iter_0000003/scheduler.pt cannot be read (RuntimeError: ")
    assert str(e.value).endswith("complete checkpoints there: iterations 2; resume from one with --ckpt-step 2")
    assert "\n" not in str(e.value)


def test_a_resume_with_other_lora_flags_is_refused_before_the_run(model, tmp_path):
    # A LoRA checkpoint resumed without --lora-rank failed after the engines started, as a checkpoint "damaged after
    # it was written" (DCP's "Missing key in checkpoint state_dict").
    fsdp = tmp_path / "fsdp"
    meta = {"next_rollout_id": 1, "model_flags": {"--lora-rank": 4, "--lora-target-modules": ["q_proj", "v_proj"]}}
    _fsdp_checkpoint(fsdp, 1, meta)

    def cfg(*extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "2", "--hf-checkpoint", str(model),
                           "--train-backend", "fsdp", "--load", str(fsdp), *extra])  # fmt: skip

    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg())
    assert str(e.value) == (
        f"--load {fsdp}: iter_0000001 was saved by a run whose model had other parameters (--lora-rank 4 saved vs 0 "
        "here); resume with the saved run's flags"
    )
    with pytest.raises(ValueError, match=r"\(--lora-target-modules \['q_proj', 'v_proj'\] saved vs \['q_proj'\] here"):
        check_checkpoints(cfg("--lora-rank", "4", "--lora-target-modules", "q_proj"))
    # This stub has no optimizer state (no scheduler.pt): a resume of it needs --no-load-optim.
    assert check_checkpoints(cfg("--lora-rank", "4", "--lora-target-modules", "v_proj", "q_proj", "--no-load-optim"))


def test_a_resume_with_another_lora_alpha_is_refused_before_the_run(model, tmp_path):
    # alpha / r scales the saved adapter: resumed under another --lora-alpha the run went on silently with another
    # model (trainer and engines agreeing on it), its first step's ratios against log-probs of a policy never trained.
    from slime_train_fsdp.checkpoint import model_flags_of

    def cfg(*extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "2", "--hf-checkpoint", str(model),
                           "--train-backend", "fsdp", "--load", str(fsdp), "--lora-rank", "4", "--no-load-optim",
                           *extra])  # fmt: skip

    fsdp = tmp_path / "fsdp"
    (fsdp / "iter_0000001").mkdir(parents=True)
    (fsdp / "latest_checkpointed_iteration.txt").write_text("1")
    meta = {"next_rollout_id": 1, "model_flags": model_flags_of(cfg("--lora-alpha", "32"))}
    (fsdp / "iter_0000001" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg("--lora-alpha", "16"))
    assert str(e.value) == (
        f"--load {fsdp}: iter_0000001 was saved by a run whose model had other parameters (--lora-alpha 32.0 saved vs "
        "16.0 here); resume with the saved run's flags"
    )
    assert check_checkpoints(cfg("--lora-alpha", "32"))
    # A checkpoint of a version that did not record alpha resumes as before.
    del meta["model_flags"]["--lora-alpha"]
    (fsdp / "iter_0000001" / "meta.json").write_text(json.dumps(meta))
    assert check_checkpoints(cfg("--lora-alpha", "16"))


def test_a_lora_resume_on_other_base_weights_is_refused_naming_both(model, tmp_path):
    # Pass 48: a LoRA checkpoint holds the adapters only; resumed with an --hf-checkpoint of other weights (same
    # names and shapes) they loaded without a word and trained on a base they were never fitted to.
    import shutil

    import torch

    from slime_train_fsdp.checkpoint import model_flags_of

    def cfg(base, *extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "2", "--hf-checkpoint", str(base),
                           "--train-backend", "fsdp", "--load", str(fsdp), "--lora-rank", "4", "--no-load-optim",
                           *extra])  # fmt: skip

    fsdp = tmp_path / "fsdp"
    (fsdp / "iter_0000001").mkdir(parents=True)
    (fsdp / "latest_checkpointed_iteration.txt").write_text("1")
    meta = {"next_rollout_id": 1, "model_flags": model_flags_of(cfg(model))}
    (fsdp / "iter_0000001" / "meta.json").write_text(json.dumps(meta))
    other = tmp_path / "other-base"
    shutil.copytree(model, other)
    save_file({"stub.weight": torch.full((4,), 2.0)}, str(other / "model.safetensors"))  # same names, other weights
    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg(other))
    assert str(e.value) == (
        f"--load {fsdp}: iter_0000001 was saved by a run whose model had other parameters (--hf-checkpoint {model} "
        f"saved vs {other} here: the LoRA adapters were trained on other base weights); resume with the saved run's "
        "flags"
    )
    copied = tmp_path / "copied-base"
    shutil.copytree(model, copied)
    assert check_checkpoints(cfg(copied))  # the same weights at another path resume
    # A checkpoint of a version that did not record its base resumes as before.
    del meta["model_flags"]["--hf-checkpoint"]
    (fsdp / "iter_0000001" / "meta.json").write_text(json.dumps(meta))
    assert check_checkpoints(cfg(other))


def test_a_checkpoint_saved_without_optimizer_state_needs_no_load_optim(model, tmp_path):
    # Issue 27: a --no-save-optim checkpoint resumed without --no-load-optim went on silently with a fresh Adam and
    # a learning-rate schedule restarting its warm-up; the original stops on it.
    fsdp = tmp_path / "fsdp"
    _fsdp_checkpoint(fsdp, 2, {"next_rollout_id": 2, "save_optim": False})

    def cfg(*extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "4", "--hf-checkpoint", str(model),
                           "--train-backend", "fsdp", "--load", str(fsdp), *extra])  # fmt: skip

    with pytest.raises(ValueError) as e:
        check_checkpoints(cfg())
    assert str(e.value) == (
        f"--load {fsdp}: iter_0000002 holds no optimizer state (saved with --no-save-optim); resume it with "
        "--no-load-optim to start the optimizer and its learning-rate schedule afresh"
    )
    assert check_checkpoints(cfg("--no-load-optim")) == [f"--load {fsdp}: fsdp checkpoint, the run resumes from it"]


def test_an_hf_load_of_the_trainers_start_weights_starts_there_at_rollout_0(model, tmp_path):
    """The original's `--hf-checkpoint M --load M` (examples/geo3k_vlm/run_geo3k_qwen35.sh): start from M's weights.

    It was refused as "an hf checkpoint ... (give it as --hf-checkpoint)", which it already was. Another HF folder
    than the one the trainer starts from is refused naming that folder's flag.
    """

    def cfg(*extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--hf-checkpoint", str(model), *extra])

    for backend in ("fsdp", "megatron"):
        notes = check_checkpoints(cfg("--train-backend", backend, "--load", str(model)))
        assert (
            f"--load {model}: HF weights, the ones the trainer starts from (--hf-checkpoint): the run starts "
            "from them at rollout 0 with a fresh optimizer, as the original's --load of an HF directory" in notes
        )
    other = tmp_path / "other-hf"
    other.mkdir()
    for path in model.iterdir():
        (other / path.name).write_bytes(path.read_bytes())
    with pytest.raises(ValueError, match=rf"^--load {other}: an HF checkpoint other than the weights the trainer "
                       rf"starts from \(--hf-checkpoint {model}\);.*give this folder as --hf-checkpoint"):  # fmt: skip
        check_checkpoints(cfg("--train-backend", "fsdp", "--load", str(other)))
    # Megatron starts from a torch_dist --ref-load: an HF --load is then not the start weights.
    torch_dist = tmp_path / "td"
    (torch_dist / "iter_0000020").mkdir(parents=True)
    (torch_dist / "iter_0000020" / ".metadata").write_bytes(b"")
    (torch_dist / "latest_checkpointed_iteration.txt").write_text("20")
    with pytest.raises(ValueError, match=rf"starts from \(--ref-load {torch_dist}\);.*as --ref-load, or leave out"):
        check_checkpoints(cfg("--train-backend", "megatron", "--load", str(model), "--ref-load", str(torch_dist)))


def test_a_checkpoint_as_load_of_a_rollout_only_run_is_said_to_be_unread(model, tmp_path, caplog):
    # --debug-rollout-only runs no trainer: its --load checkpoint is never loaded (as the original: rollout 0, the
    # engines serve --hf-checkpoint). The trainer's checks refused it instead (its learning-rate schedule differs
    # from flags no optimizer uses), or, with the saved flags, it passed with no word that the weights are not it.
    fsdp = tmp_path / "fsdp"
    _fsdp_checkpoint(fsdp, 3)  # no scheduler.pt: the trainer's check refuses it
    cfg = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--hf-checkpoint", str(model),
                      "--train-backend", "fsdp", "--debug-rollout-only", "--load", str(fsdp)])  # fmt: skip
    with caplog.at_level("WARNING", logger="slime_app.checkpoints"):
        check_checkpoints(cfg)
    assert caplog.messages == [
        f"--load {fsdp}: --debug-rollout-only runs no trainer, so the weights of an fsdp checkpoint there are not "
        f"loaded: the engines serve --hf-checkpoint {model}, from rollout 0; to roll out the checkpoint's weights, "
        "export them (--save-hf, or slime-convert mcore-to-hf) and give that folder as --hf-checkpoint"
    ]
    with pytest.raises(ValueError, match="holds no optimizer state"):  # the same folder for a training run
        check_checkpoints(cfg.model_copy(update={"debug_rollout_only": False}))
