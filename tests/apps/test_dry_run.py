"""`apps/train --dry-run`: checks what needs no hardware, prints the resolved config, starts nothing."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from safetensors.torch import save_file

from slime_app.checkpoint_kinds import checkpoint_kind
from slime_app.checkpoints import check_checkpoints
from slime_app.cli import main
from slime_app.preflight import preflight
from slime_app.resolve import resolve_config
from slime_core.config import SlimeArgs, parse_args

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture
def model(qwen3_4b_stub):
    return qwen3_4b_stub


@pytest.fixture
def data(tmp_path):
    out = tmp_path / "d.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"{i} + 1 = ?"}], "label": str(i + 1)} for i in range(10)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _flags(model, data, *extra):
    return ["--train-backend", "fsdp", "--hf-checkpoint", str(model), "--prompt-data", str(data), "--input-key",
            "prompt", "--label-key", "label", "--apply-chat-template", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16", "--actor-num-gpus-per-node", "2",
            *extra]  # fmt: skip


def test_dry_run_reports_and_starts_nothing(model, data, tmp_path):
    code = (
        "import sys\nfrom slime_app.cli import main\n"
        f"rc = main({['--dry-run', *_flags(model, data, '--num-epoch', '3', '--num-layers', '36')]!r})\n"
        # The backend's capability record (slime_train_fsdp.spec) is read; the trainer module is not imported.
        "print('IMPORTED', sorted(m for m in ('ray', 'slime_app.loop', 'slime_train_fsdp.backend')\n"
        "                        if m in sys.modules))\n"
        "sys.exit(rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SLIME_LOG_LEVEL": "WARNING"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = out.stdout
    assert report.startswith("slime --dry-run: the configuration is valid; nothing was started")
    # Grouped like --help, with the derived values.
    assert "DataArgs (Prompt data and batch sizes.)" in report
    assert "  --num-rollout                              6" in report  # 3 epochs × (10 // 4)
    assert "  --global-batch-size                        8" in report
    assert "rollout: 4 prompts × 2 samples = 8 samples = 1 optimizer step(s) × --global-batch-size 8" in report
    assert "trainer: 2 rank(s) (1 node(s) × 2), data-parallel 2" in report
    assert "--num-epoch 3: 10 prompts // --rollout-batch-size 4 = 2 rollouts per epoch, --num-rollout 6" in report
    assert "1 Megatron architecture flags agree with config.json" in report
    assert re.search(r"tokenizer of --hf-checkpoint: first prompt \d+ tokens \(chat template applied\)", report)
    assert "IMPORTED []" in report  # no Ray, no training loop, no trainer
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--num-layers", "28"], r"Megatron architecture flags disagree with its config.json .*--num-layers 28: "
         "config.json says 36"),
        (["--ref-load", "/nonexistent/ckpt"], r"--ref-load /nonexistent/ckpt: no checkpoint there \(missing\)"),
        (["--custom-rm-path", "nowhere_pkg.reward"], r"--custom-rm-path: module 'nowhere_pkg' not found"),
        (["--input-key", "question"], r"d\.jsonl line 1: no --input-key 'question'"),
        (["--num-epoch", "1", "--rollout-batch-size", "16"], r"--prompt-data has 10 prompts, fewer than one "
         r"--rollout-batch-size \(16\)"),
        (["--num-rollout", "2", "--save-interval", "1"], r"--save-interval requires --save"),
    ],
)  # fmt: skip
def test_dry_run_errors_are_one_line(model, data, extra, message, capsys):
    length = [] if {"--num-epoch", "--num-rollout"} & set(extra) else ["--num-rollout", "2"]
    assert main(["--dry-run", *_flags(model, data, *length), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert re.search(message, err[0]), err[0]


def test_dry_run_refuses_use_wandb_without_the_package(model, data, capsys, monkeypatch):
    # The run's tracker imports wandb before Ray starts and fails there; --dry-run said everything was fine.
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, installed or not
    flags = _flags(model, data, "--num-rollout", "2", "--use-wandb", "--wandb-mode", "offline")
    assert main(["--dry-run", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--use-wandb: the `wandb` package is not installed" in err[0], err


def test_wandb_flags_without_use_wandb_are_named_as_having_no_effect(model, data, capsys):
    # The original's scripts list --wandb-* with --use-wandb commented out: nothing goes to W&B, say so.
    flags = _flags(model, data, "--num-rollout", "2", "--wandb-project", "p", "--wandb-group", "g")
    assert main(["--dry-run", *flags, "--wandb-always-use-train-step"]) == 0
    out = capsys.readouterr().out
    assert "--wandb-group, --wandb-project: no effect without --use-wandb (nothing goes to W&B)" in out
    assert main(["--dry-run", *_flags(model, data, "--num-rollout", "2")]) == 0
    assert "without --use-wandb" not in capsys.readouterr().out


def test_checkpoint_kinds_and_backend_rules(model, tmp_path):
    (tmp_path / "empty").mkdir()
    torch_dist = tmp_path / "td"
    (torch_dist / "iter_0000020").mkdir(parents=True)
    (torch_dist / "iter_0000020" / ".metadata").write_bytes(b"")
    (torch_dist / "latest_checkpointed_iteration.txt").write_text("20")
    fsdp = tmp_path / "fsdp"
    (fsdp / "iter_0000003").mkdir(parents=True)
    (fsdp / "iter_0000003" / "meta.json").write_text("{}")
    (fsdp / "latest_checkpointed_iteration.txt").write_text("3")
    save_file({}, str(model / "model.safetensors"))  # a header, no tensor
    kinds = [checkpoint_kind(p) for p in (tmp_path / "nope", tmp_path / "empty", torch_dist, fsdp, model)]
    assert kinds == ["missing", "empty", "torch_dist", "fsdp", "hf"]

    def cfg(*extra):
        return parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--hf-checkpoint", str(model), *extra])

    # The stub holds no optimizer state (no scheduler.pt): --no-load-optim.
    assert check_checkpoints(cfg("--train-backend", "fsdp", "--load", str(fsdp), "--no-load-optim")) == [
        f"--load {fsdp}: fsdp checkpoint, the run resumes from it"
    ]
    with pytest.raises(ValueError, match=r"a torch_dist checkpoint; --train-backend fsdp resumes its own fsdp .*"
                       r"slime-convert mcore-to-hf"):  # fmt: skip
        check_checkpoints(cfg("--train-backend", "fsdp", "--load", str(torch_dist)))
    with pytest.raises(ValueError, match=r": an fsdp checkpoint; --train-backend megatron resumes its own torch_dist"):
        check_checkpoints(cfg("--train-backend", "megatron", "--load", str(fsdp)))
    other_hf = tmp_path / "other-hf"
    other_hf.mkdir()
    (other_hf / "config.json").write_text("{}")
    save_file({}, str(other_hf / "model.safetensors"))
    with pytest.raises(ValueError, match=r"--ref-load .*: an hf checkpoint; the Megatron backend reads --ref-load as "
                       "torch_dist"):  # fmt: skip
        check_checkpoints(cfg("--train-backend", "megatron", "--ref-load", str(other_hf)))
    unknown = tmp_path / "unknown-ckpt"
    unknown.mkdir()
    (unknown / "notes.txt").write_text("not weights")
    with pytest.raises(ValueError, match=r"--load .*: an unknown checkpoint; --train-backend fsdp resumes its own"):
        check_checkpoints(cfg("--train-backend", "fsdp", "--load", str(unknown)))
    # The reference model of a KL run reads a torch_dist --ref-load through its HF conversion (FSDP).
    kl = cfg("--train-backend", "fsdp", "--ref-load", str(torch_dist), "--use-kl-loss", "--kl-loss-coef", "0.01",
             "--output-dir", str(tmp_path / "out"))  # fmt: skip
    resolved, _ = resolve_config(kl, convert=False)
    assert resolved.ref_load == str(tmp_path / "out" / "ref_load_hf")


def test_a_machine_without_gpus_refuses_eight_trainer_ranks(model, data, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = parse_args([*_flags(model, data, "--num-rollout", "1"), "--actor-num-gpus-per-node", "8"])
    with pytest.raises(ValueError, match=r"no CUDA GPU here: --actor-num-nodes 1 × --actor-num-gpus-per-node 8 would "
                       r"start 8 CPU trainer ranks on one machine with \d+ cores"):  # fmt: skip
        preflight(cfg)
    preflight(cfg, hardware=False)  # --dry-run leaves the hardware to the run


def test_dry_run_on_cpu_prints_the_gpu_plan(model, data, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flags = _flags(model, data, "--num-rollout", "1", "--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2")
    assert main(["--dry-run", *flags]) == 0
    report = capsys.readouterr().out
    assert (
        "engines: 2 × 2 GPU(s) = 4 rollout GPU(s) (sglang), on their own GPUs; weights via distributed (planned for "
        "GPUs; this machine has no CUDA, so a run here uses --rollout-engine reference and --weight-sync disk)"
    ) in report
    assert "  --rollout-engine                           sglang" in report
    assert "--update-weight-disk-dir" not in report  # set only by the CPU fallback's disk sync
    # What the user gave is what the GPU run uses too.
    assert main(["--dry-run", *flags, "--rollout-engine", "reference", "--weight-sync", "disk"]) == 0
    assert "(reference), on their own GPUs; weights via disk\n" in capsys.readouterr().out


def test_dry_run_plans_outside_engines_and_refuses_zero_rollout_gpus_without_them(model, data, capsys):
    # --rollout-num-gpus 0 was "the router only" in --help, "1 × 1 GPU(s)" in the plan, and one started engine.
    flags = ["--dry-run", *_flags(model, data, "--num-rollout", "1", "--rollout-num-gpus", "0")]
    assert main(flags) == 2
    assert "--rollout-num-gpus 0 starts no engine" in capsys.readouterr().err
    assert main([*flags, "--rollout-engine-urls", "http://h:1", "http://h:2"]) == 0
    assert "  engines: 2 outside engine(s) (--rollout-engine-urls), none started\n" in capsys.readouterr().out


def test_dry_run_plans_colocated_and_rollout_only_gpus_as_the_placement_does(model, data, capsys):
    # The placement makes max(1, 3) bundles: engine 0 shares the trainer's GPU, engines 1 and 2 have their own.
    flags = _flags(model, data, "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1")
    assert main(["--dry-run", *flags, "--rollout-num-gpus", "3"]) == 0
    assert "= 3 rollout GPU(s) (sglang), 1 colocated with the trainer, 2 rollout-only; " in capsys.readouterr().out
    assert main(["--dry-run", *flags]) == 0
    assert "= 1 rollout GPU(s) (sglang), colocated with the trainer; " in capsys.readouterr().out


def test_dry_run_on_cpu_plans_debug_rollout_only_colocate_as_the_gpu_run(model, data, monkeypatch, capsys):
    # Issue 27 pass 87: the GPU run (and the original) gives the engines the colocated run's 4 actor GPUs; the dry
    # run on a CPU machine printed "1 × 1 GPU(s) = 1 rollout GPU(s)" (the reference engine's default).
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flags = _flags(model, data, "--num-rollout", "1", "--debug-rollout-only", "--colocate")
    assert main(["--dry-run", *flags, "--actor-num-gpus-per-node", "4"]) == 0
    assert "  engines: 4 × 1 GPU(s) = 4 rollout GPU(s) (sglang), on their own GPUs; " in capsys.readouterr().out
    # The GPU run refuses 6 GPUs in engines of 4; the dry run said the configuration was valid.
    assert main(["--dry-run", *flags, "--actor-num-gpus-per-node", "6", "--rollout-num-gpus-per-engine", "4"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(
        "--rollout-num-gpus 6 is not a multiple of --rollout-num-gpus-per-engine 4: 1 engine(s) of 4 GPUs would "
        "leave 2 GPU(s) idle"
    ), line


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (
            ["--rollout-num-gpus", "2", "--advantage-estimator", "ppo", "--critic-num-nodes", "1"],
            "placement: 6 GPU(s) = --actor-num-nodes 1 × --actor-num-gpus-per-node 2 + as many for the critic "
            "(--critic-num-nodes) + --rollout-num-gpus 2 (not colocated), the critic's 2 of its own",
        ),
        (
            ["--colocate", "--rollout-num-gpus", "4", "--advantage-estimator", "ppo"],
            "placement: 4 GPU(s) = max(--actor-num-nodes 1 × --actor-num-gpus-per-node 2, --rollout-num-gpus 4) "
            "(--colocate), the critic on the actor's",
        ),
        (["--debug-rollout-only", "--colocate"], "placement: 2 GPU(s) = --rollout-num-gpus 2 (--debug-rollout-only)"),
    ],
)
def test_dry_run_prints_the_placement_groups_gpu_count(model, data, monkeypatch, capsys, extra, line):
    # Issue 27 pass 87: the dry run named no GPU total; a PPO critic with --critic-num-nodes takes the actor's count
    # again (6 GPUs here, 4 in the original, whose critic always shares the actor's), which it did not show.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--dry-run", *_flags(model, data, "--num-rollout", "1", *extra)]) == 0
    assert f"  {line}\n" in capsys.readouterr().out


def test_gpu_plan_keeps_colocated_tensor_sync_and_cuda_machines_unchanged(model, data):
    from slime_app.dry_run import gpu_plan

    colocated = parse_args(_flags(model, data, "--num-rollout", "1", "--colocate"))
    assert gpu_plan(colocated, cuda=False)[:2] == ("sglang", "tensor")
    cfg = parse_args(_flags(model, data, "--num-rollout", "1", "--rollout-engine", "reference"))
    assert gpu_plan(cfg, cuda=True) == (cfg.rollout_engine, cfg.weight_sync, "")


def test_dry_run_refuses_an_engine_larger_than_the_rollout_gpus(model, data, capsys):
    flags = _flags(model, data, "--num-rollout", "1", "--rollout-num-gpus", "1", "--rollout-num-gpus-per-engine", "2")
    assert main(["--dry-run", *flags]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--rollout-num-gpus 1 is not a multiple of --rollout-num-gpus-per-engine 2" in line


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "3"], "--rollout-num-gpus-per-engine 3: "),
        (["--context-parallel-size", "3", "--actor-num-gpus-per-node", "3"], "--context-parallel-size 3: "),
    ],
)
def test_dry_run_refuses_heads_that_do_not_split(model, data, extra, fragment, capsys):
    # Fifth hostile pass on issue 27 (item 8): both passed the dry run (32 heads, 8 KV heads on 3 ranks), and
    # the run then failed in SGLang's start-up or at the first Ulysses all-to-all.
    assert main(["--dry-run", *_flags(model, data, "--num-rollout", "1", *extra)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "the attention heads do not split: " + fragment in line and "not divisible by 3" in line


def test_dry_run_measures_the_prompts_against_the_length_limit(model, data, capsys):
    # All prompts over --rollout-max-prompt-len passed the dry run ("first prompt 14 tokens"); the run then stopped
    # at start-up with "no prompts left after filtering".
    flags = ["--dry-run", *_flags(model, data, "--num-rollout", "2")]
    assert main(flags) == 0
    assert "  prompt length: 10 of 10 prompts within 40959 tokens (0 longer are dropped)" in capsys.readouterr().out
    assert main([*flags, "--rollout-max-prompt-len", "14"]) == 0
    out = capsys.readouterr().out
    assert "first prompt 14 tokens" in out  # every prompt here has 14 tokens
    assert "  prompt length: 10 of 10 prompts within 14 tokens (0 longer are dropped)" in out
    assert main([*flags, "--rollout-max-prompt-len", "13"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"slime: error: --prompt-data {data}: no prompts left: all 10 are longer than --rollout-max-prompt-len=13 "
        "tokens"
    )


def test_dry_run_alone_checks_the_demo(capsys, monkeypatch, tmp_path):
    # `uv run apps/train --dry-run` said "--rollout-batch-size is required": the demo runs with no flags, so
    # `--dry-run` alone checks the demo's flags.
    monkeypatch.chdir(tmp_path)  # the demo's outputs are relative to the working directory (none is written)
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("slime: no flags given, checking the embedded demo")
    assert "slime --dry-run: the configuration is valid; nothing was started" in out
    assert not any(tmp_path.iterdir())


def test_help_says_that_no_flags_run_the_demo_and_where_its_flags_change(capsys):
    """`apps/train --help` named every flag but not that no flags at all run the embedded demo, nor the module that
    runs it with changed flags."""
    from slime_core.config import build_parser

    for flag in ("--help", "-h"):
        assert main([flag]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert out.startswith("usage: slime [--config RUN.yaml] [FLAG VALUE ...]")
        assert (
            "With no flags at all, `uv run apps/train` runs the embedded demo (GRPO on a tiny model, CPU); to run it "
            "with some flags changed: `uv run python -m slime_app.demo FLAGS`."
        ) in out
        assert "--rollout-batch-size ROLLOUT_BATCH_SIZE" in out
    assert "demo" not in build_parser().description  # slime_core's parser, shared, is left as it was


def test_demo_flags_without_a_model_point_to_the_demo_module(model, data, capsys, monkeypatch, tmp_path):
    # Issue 27: after `uv run apps/train`, a newcomer tries `uv run apps/train --num-rollout 3` and got only
    # "--rollout-batch-size is required", with no word that the demo's flags are not applied to it.
    monkeypatch.chdir(tmp_path)
    assert main(["--num-rollout", "3"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "slime: error: --rollout-batch-size is required (flags without --hf-checkpoint: the embedded demo runs only"
        " with no flags at all; to run it with changed flags: uv run python -m slime_app.demo FLAGS)"
    )
    # The module it names takes those flags.
    from slime_app.demo.__main__ import demo_argv

    assert main([*demo_argv(["--num-rollout", "3"]), "--dry-run"]) == 0
    assert "  --num-rollout                              3\n" in capsys.readouterr().out
    # A run of one's own (a model given) gets the bare error.
    assert main(["--dry-run", *_flags(model, data, "--num-rollout", "0")]) == 2
    assert "slime_app.demo" not in capsys.readouterr().err


def test_num_epoch_on_the_demo_replaces_its_num_rollout(capsys, monkeypatch, tmp_path):
    # Issue 27: `--num-epoch 1` on the demo was dropped ("ignored: --num-rollout 80 is given", the demo's own).
    from slime_app.demo.__main__ import demo_argv

    monkeypatch.chdir(tmp_path)
    assert main([*demo_argv(["--num-epoch", "1"]), "--dry-run"]) == 0
    assert "  run: 31 rollouts, 31 optimizer steps\n" in capsys.readouterr().out  # 2000 prompts // 64 a rollout
    assert main([*demo_argv(["--num-epoch", "1", "--num-rollout", "5"]), "--dry-run"]) == 0
    assert "  run: 5 rollouts, 5 optimizer steps\n" in capsys.readouterr().out  # the user's own --num-rollout wins


def test_dry_run_reads_the_prompt_file_once_for_the_first_prompt_and_the_length_filter(model, data, capsys,
                                                                                      monkeypatch):  # fmt: skip
    # The first prompt, the prompt count and the data source each read --prompt-data again (four reads in all with
    # the package's row check); now the dry run reads it once and passes the rows down.
    import slime_rollout.data.prompt_rows as prompt_rows

    reads = []
    real = prompt_rows.iter_jsonl
    monkeypatch.setattr(
        prompt_rows, "iter_jsonl", lambda path, *a, **kw: (reads.append(str(path)), real(path, *a, **kw))[1]
    )
    assert main(["--dry-run", *_flags(model, data, "--num-rollout", "2")]) == 0
    out = capsys.readouterr().out
    assert "  prompt length: 10 of 10 prompts within 40959 tokens (0 longer are dropped)" in out
    assert "first prompt" in out
    # One read is the rollout package's own row check (its `slime.preflight` hook), one the dry run's.
    assert reads == [str(data), str(data)]


def test_the_listing_redacts_by_the_same_rule_as_the_public_config(monkeypatch):
    # The --dry-run listing tested the SECRET_FIELDS tuple, to_public_dict is_secret_name (which also covers
    # `*api_key`): a field the rule names (here one made secret for the test) was printed in the clear.
    from slime_app.dry_run import render_config
    from slime_core import secrets

    monkeypatch.setattr(secrets, "SECRET_FIELDS", (*secrets.SECRET_FIELDS, "wandb_project"))
    fields = {"rollout_batch_size": 1, "num_rollout": 1, "wandb_project": "hidden-project", "wandb_key": "wk"}
    cfg = SlimeArgs.from_dict(fields)
    listing = "\n".join(render_config(cfg))
    assert "hidden-project" not in listing and " wk" not in listing
    assert "--wandb-project" in listing and secrets.REDACTED in listing


def test_dry_run_on_cpu_says_that_a_run_here_is_refused_for_its_hardware(model, data, monkeypatch, capsys):
    # Issue 27 (s22): the original qwen3-4B script (Megatron, 8 GPUs) checked on a CPU machine said only "the
    # configuration is valid"; the same flags without --dry-run were then refused at once on that machine.
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    flags = _flags(model, data, "--num-rollout", "1", "--actor-num-gpus-per-node", "1")
    assert main(["--dry-run", *flags, "--train-backend", "megatron"]) == 0
    assert (
        "  this machine: a run here is refused (--train-backend megatron needs CUDA GPUs; on this machine use "
        "--train-backend fsdp); the plan above is for GPU machines\n"
    ) in capsys.readouterr().out
    assert main(["--dry-run", *flags]) == 0  # FSDP with one rank runs here: nothing said
    assert "this machine:" not in capsys.readouterr().out
