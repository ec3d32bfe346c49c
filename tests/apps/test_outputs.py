"""Where the run writes (`slime_app.outputs`): unwritable folders fail in one line before anything starts.

Found by fault injection: with `--save` on a read-only mount the demo failed only at its first save, after the
engines started and a rollout trained.
"""

import errno
import os
import pathlib
import re

import pytest

from slime_app.outputs import check_creatable, check_writable, output_dirs, pseudo_filesystem
from slime_core.config import SlimeArgs

BASE = {"rollout_batch_size": 1, "num_rollout": 1}


def _cfg(tmp_path, **fields) -> SlimeArgs:
    return SlimeArgs.from_dict({**BASE, "output_dir": str(tmp_path / "out"), **fields})


def test_every_output_folder_is_created_and_probed(tmp_path):
    cfg = _cfg(tmp_path, save=str(tmp_path / "ckpt"), save_hf=str(tmp_path / "hf" / "iter_{rollout_id}"))
    assert [(flag, str(path)) for flag, path in output_dirs(cfg)] == [
        ("--output-dir", str(tmp_path / "out")),
        ("--save", str(tmp_path / "ckpt")),
        ("--output-dir (its tensorboard folder)", str(tmp_path / "out" / "tensorboard")),
        ("--save-hf", str(tmp_path / "hf")),
    ]
    check_writable(cfg)
    for folder in ("out/tensorboard", "ckpt", "hf"):
        assert os.listdir(tmp_path / folder) == []  # created, and the probe file removed
    assert os.listdir(tmp_path / "out") == ["tensorboard"]


def test_a_file_where_the_tensorboard_folder_goes_is_named_before_the_run(tmp_path):
    # The run ended in tensorboard's FileExistsError traceback when it opened its SummaryWriter.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tensorboard").write_text("not a folder")
    with pytest.raises(OSError, match=r"^--output-dir \(its tensorboard folder\) .*out/tensorboard is not writable"):
        check_writable(_cfg(tmp_path))
    with pytest.raises(OSError, match=r"out/tensorboard is not writable: it is a file, not a folder$"):
        check_creatable(_cfg(tmp_path))
    named = _cfg(tmp_path, tb_project_name="proj", tb_experiment_name="exp")
    assert list(output_dirs(named))[-1] == ("--tb-project-name", tmp_path / "out" / "proj" / "exp")
    assert list(output_dirs(_cfg(tmp_path, use_tensorboard=False))) == [("--output-dir", tmp_path / "out")]


def test_a_folder_under_a_file_names_its_flag(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OSError, match=rf"^--save {re.escape(str(tmp_path / 'a-file' / 'ckpt'))} is not writable: "):
        check_writable(_cfg(tmp_path, save=str(tmp_path / "a-file" / "ckpt")))


def test_an_unwritable_wandb_dir_names_its_flag_before_the_run(tmp_path):
    # Tracker's os.makedirs(--wandb-dir) raised FileExistsError/PermissionError as a traceback once the run started.
    (tmp_path / "a-file").write_text("x")
    wandb_dir = tmp_path / "a-file" / "wandb"
    with pytest.raises(OSError, match=rf"^--wandb-dir {re.escape(str(wandb_dir))} is not writable: "):
        check_writable(_cfg(tmp_path, use_wandb=True, wandb_dir=str(wandb_dir)))
    assert ("--wandb-dir", wandb_dir) not in list(output_dirs(_cfg(tmp_path, wandb_dir=str(wandb_dir))))  # no W&B


def test_a_read_only_folder_names_its_flag(tmp_path, monkeypatch):
    # Root ignores file modes; the probe's open failing as on a read-only mount stands in for one.
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("tempfile.NamedTemporaryFile", read_only)
    hf = tmp_path / "hf" / "{rollout_id}"
    with pytest.raises(OSError, match=r"^--output-dir .* is not writable: Read-only file system$"):
        check_writable(_cfg(tmp_path, save_hf=str(hf)))


def test_the_cli_refuses_an_unwritable_save_before_ray_starts(tmp_path, cli_without_ray):
    (tmp_path / "a-file").write_text("x")
    from slime_app.demo import default_demo_argv

    argv = [*default_demo_argv(tmp_path / "run"), "--save", str(tmp_path / "a-file" / "ckpt")]
    out = cli_without_ray(argv)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1] == (
        f"slime: error: --save {tmp_path / 'a-file' / 'ckpt'} is not writable: Not a directory"
    )
    assert "Traceback" not in out.stderr


def test_templates_give_the_folder_no_field_changes(tmp_path):
    cfg = _cfg(
        tmp_path,
        save_hf="exports/{rollout_id}",
        save_debug_rollout_data=str(tmp_path / "dumps_{rollout_id}" / "rollout.pt"),
        tensorboard_dir=str(tmp_path / "tb"),
    )
    assert dict(output_dirs(cfg)) == {
        "--output-dir": tmp_path / "out",
        "--tensorboard-dir": tmp_path / "tb",
        "--save-hf": pathlib.Path("exports"),
        "--save-debug-rollout-data": tmp_path,
    }


def test_the_dry_run_refuses_a_save_into_a_file_and_creates_nothing(tmp_path, capsys):
    # `--save <a file>` and `--output-dir <a file>` passed --dry-run ("the configuration is valid"); the run then
    # stopped at its writability check.
    from slime_app.cli import main
    from slime_app.demo import default_demo_argv

    (tmp_path / "a-file").write_text("x")
    argv = ["--dry-run", *default_demo_argv(tmp_path / "run")]
    assert main([*argv, "--save", str(tmp_path / "a-file")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"slime: error: --save {tmp_path / 'a-file'} is not writable: it is a file, not a folder"
    )
    assert main([*argv, "--save", str(tmp_path / "a-file" / "ckpt")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"slime: error: --save {tmp_path / 'a-file' / 'ckpt'} is not writable: it would be under "
        f"{tmp_path / 'a-file'}, which is a file, not a folder"
    )
    assert main([*argv, "--save", str(tmp_path / "new" / "ckpt")]) == 0
    assert "output folders: each is a folder, or can be made in one" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path)) == ["a-file"]  # nothing created


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"save": "model/ckpt"}, "--save {t}/model/ckpt is inside --hf-checkpoint {t}/model"),
        ({"save": "model"}, "--save {t}/model is --hf-checkpoint {t}/model"),
        ({"output_dir": "model/runs"}, "--output-dir {t}/model/runs is inside --hf-checkpoint {t}/model"),
        ({"save": "link/ckpt"}, "--save {t}/link/ckpt is inside --hf-checkpoint {t}/model"),
        ({"save": "ref", "ref_load": "ref"}, "--save {t}/ref is --ref-load {t}/ref"),
        ({"save": "other/sub", "load": "other"}, "--save {t}/other/sub is inside --load {t}/other"),
    ],
)
def test_an_output_inside_a_folder_the_run_reads_weights_from_is_refused(tmp_path, fields, message):
    (tmp_path / "model").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "model")  # resolved: the link is the model folder
    # (--save-hf inside --hf-checkpoint is refused by the config already: slime_core.config.save_hf.)
    cfg = _cfg(tmp_path, hf_checkpoint=str(tmp_path / "model"), **{k: str(tmp_path / v) for k, v in fields.items()})
    expected = message.format(t=tmp_path) + ": the run would write into the folder it reads weights from; give --"
    for check in (check_writable, check_creatable):
        with pytest.raises(ValueError, match="^" + re.escape(expected)):
            check(cfg)
    assert not (tmp_path / "model" / "ckpt").exists()  # refused before anything was created


def test_a_resume_into_its_own_checkpoint_folder_stays_allowed(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    cfg = SlimeArgs.from_dict({**BASE, "output_dir": str(tmp_path / "ckpt" / "logs"), "load": ckpt, "save": ckpt,
                               "hf_checkpoint": str(tmp_path / "model")})  # fmt: skip
    check_writable(cfg)
    assert check_creatable(cfg)


@pytest.mark.parametrize("place", ["/proc/slime-save", "/sys/slime-save", "/dev/slime-save"])
def test_a_pseudo_filesystem_is_refused_before_anything_is_created(tmp_path, place):
    # As root the probe passed for /dev (devtmpfs takes files, in memory); /proc and /sys failed with an errno only.
    cfg = _cfg(tmp_path, save=place)
    for check in (check_writable, check_creatable):
        with pytest.raises(ValueError, match=rf"^--save {place} is on a pseudo-filesystem \(\w+\), not storage"):
            check(cfg)
    assert not os.path.exists(place)


def test_shared_memory_and_disks_are_not_pseudo_filesystems(tmp_path):
    assert pseudo_filesystem(tmp_path / "a" / "b") is None
    assert pseudo_filesystem(pathlib.Path("/dev/shm/slime-x")) is None
    assert pseudo_filesystem(pathlib.Path("/dev/slime-x")) in {"devtmpfs", "/dev"}


def test_on_a_cluster_the_overlap_is_still_refused_but_not_this_hosts_mounts(tmp_path):
    # The cli and the dry run call it with filesystems=False when --ray-address names a cluster (other hosts write).
    from slime_app.outputs import check_places

    check_places(_cfg(tmp_path, save="/dev/slime-save"), filesystems=False)  # another host's /dev: not judged here
    into_model = _cfg(tmp_path, hf_checkpoint=str(tmp_path / "model"), save=str(tmp_path / "model" / "ckpt"))
    with pytest.raises(ValueError, match=r"^--save .*/model/ckpt is inside --hf-checkpoint "):
        check_places(into_model, filesystems=False)


@pytest.mark.parametrize("flag", ["--hf-checkpoint", "--ref-load", "--load", "--critic-load", "--opd-teacher-load"])
def test_each_weight_input_is_read_from_its_own_field(tmp_path, flag):
    # One table (`outputs._INPUTS`) names the inputs; the field is the flag's. model_copy skips the critic/OPD
    # checks that refuse --critic-load and --opd-teacher-load alone: only the folder overlap is under test here.
    field = flag.removeprefix("--").replace("-", "_")
    cfg = _cfg(tmp_path).model_copy(update={field: str(tmp_path), "save": str(tmp_path / "ckpt")})
    expected = f"--output-dir {tmp_path}/out is inside {flag} {tmp_path}: the run would write into the folder"
    with pytest.raises(ValueError, match="^" + re.escape(expected)):
        check_creatable(cfg)


def test_a_save_folder_holding_checkpoints_this_run_does_not_resume_is_warned_about(tmp_path):
    # Issue 27 pass 27: a fresh run into the --save of an earlier one wrote over it without a word; killed before its
    # first save, a --load of that folder then resumed the earlier run's latest checkpoint as if it were this run's.
    from slime_app.outputs import reused_save_warning

    save = tmp_path / "ckpt"
    assert reused_save_warning(_cfg(tmp_path, save=str(save))) is None
    for step in (3, 4):
        (save / f"iter_{step:07d}").mkdir(parents=True)
        (save / f"iter_{step:07d}" / "meta.json").write_text("{}")
    (save / "latest_checkpointed_iteration.txt").write_text("4")
    assert reused_save_warning(_cfg(tmp_path, save=str(save))) == (
        f"--save {save} holds checkpoints this run does not resume (iterations 3-4; its tracker names 4; --load is not "
        "given): this run starts at rollout 0 and replaces them as it saves, and until its first save a --load of this "
        "folder resumes the earlier run's; give a new --save to keep them apart"
    )
    assert reused_save_warning(_cfg(tmp_path, save=str(save), load=str(save))) is None  # a resume
    other = str(tmp_path / "other")
    assert f"--load is {other}" in reused_save_warning(_cfg(tmp_path, save=str(save), load=other))
    assert "this run starts at rollout 0 and" in reused_save_warning(_cfg(tmp_path, save=str(save), load=other))
    # Megatron's --load of one iteration folder of this --save resumes it: no warning (it said "starts at rollout 0").
    assert reused_save_warning(_cfg(tmp_path, save=str(save), load=str(save / "iter_0000003"))) is None
    # Another run's checkpoint as --load: the run goes on from it, not from rollout 0.
    (tmp_path / "other" / "iter_0000007").mkdir(parents=True)
    (tmp_path / "other" / "latest_checkpointed_iteration.txt").write_text("7")
    said = reused_save_warning(_cfg(tmp_path, save=str(save), load=other))
    assert "this run goes on from the checkpoint in --load and replaces them" in said


def test_a_resume_from_an_older_ckpt_step_names_the_later_iterations_it_branches_off(tmp_path):
    # Issue 27 pass 75: `--load X --save X --ckpt-step 1` over iterations 1-3 (tracker 3) continues from iteration 1
    # and writes iterations 2, 3, ... over the earlier branch as it saves (as the original). Until its first save, and
    # for good past its last rollout, the later ones stay: a kill meanwhile and a plain `--load X` resumed iteration 3
    # of the abandoned branch, with no word at start (the warning above is for another run's folder only).
    from slime_app.outputs import later_iterations_warning

    save = tmp_path / "ckpt"
    for step in (1, 2, 3):
        (save / f"iter_{step:07d}").mkdir(parents=True)
        (save / f"iter_{step:07d}" / "meta.json").write_text("{}")
    (save / "latest_checkpointed_iteration.txt").write_text("3")
    said = later_iterations_warning(_cfg(tmp_path, save=str(save), load=str(save), ckpt_step=1))
    assert said == (
        f"--ckpt-step 1: --save {save} also holds the later iterations 2-3 this run branches off from (its tracker "
        "names 3): this run replaces them as it saves, and until its first save a --load of this folder without "
        "--ckpt-step resumes iteration 3; those past its last save stay from the earlier branch; give a new --save "
        "to keep them apart"
    )
    assert "iterations 3-3" not in later_iterations_warning(_cfg(tmp_path, save=str(save), load=str(save), ckpt_step=2))
    assert "the later iteration 3 this run" in later_iterations_warning(
        _cfg(tmp_path, save=str(save), load=str(save), ckpt_step=2)
    )
    # The latest one, no --ckpt-step, another --save, or no --load: nothing to say here.
    assert later_iterations_warning(_cfg(tmp_path, save=str(save), load=str(save), ckpt_step=3)) is None
    assert later_iterations_warning(_cfg(tmp_path, save=str(save), load=str(save))) is None
    assert later_iterations_warning(_cfg(tmp_path, save=str(tmp_path / "new"), load=str(save), ckpt_step=1)) is None
    assert later_iterations_warning(_cfg(tmp_path, save=str(save))) is None


def test_iteration_names_in_save_that_slime_did_not_write_are_named_at_start(tmp_path):
    # Issue 27 pass 27: a stray iter_XXXXXXX.tmp without slime's marker (a crash of a version before it, a copy by
    # hand) stopped the run at the save that reached it, exit 5, after that rollout had trained.
    from slime_app.outputs import foreign_iteration_warning
    from slime_core import dir_swap

    save = tmp_path / "ckpt"
    (save / "iter_0000003.tmp").mkdir(parents=True)
    (save / "iter_0000003.tmp" / "model_and_optim").mkdir()
    (save / "iter_0000001").mkdir()  # slime's: marked
    dir_swap.mark(save / "iter_0000001")
    (save / "iter_0000002").mkdir()  # empty: replaceable
    (save / "notes").mkdir()
    (save / "notes" / "x").write_text("mine")  # not an iteration name: never touched
    assert foreign_iteration_warning(_cfg(tmp_path, save=str(save))) == (
        f"--save {save}: iter_0000003.tmp is a non-empty folder that slime did not write (no .slime_export file in "
        "it): a save of that iteration stops the run rather than replace it; move it out of --save"
    )
    with pytest.raises(dir_swap.ReplaceRefused):  # what that save meets
        dir_swap.prepare_staging(save / "iter_0000003", flag="--save")
    dir_swap.mark(save / "iter_0000003.tmp")
    assert foreign_iteration_warning(_cfg(tmp_path, save=str(save))) is None
    # Each is named with its own reason: the warning said "no marker" for a file or a link too.
    (save / "iter_0000004").write_text("not a folder")
    (save / "iter_0000005.old").symlink_to(save / "notes")
    assert foreign_iteration_warning(_cfg(tmp_path, save=str(save))) == (
        f"--save {save}: iter_0000004 exists and is not a directory; iter_0000005.old is a symbolic link: a save of "
        "those iterations stops the run rather than replace them; move them out of --save"
    )
    assert foreign_iteration_warning(_cfg(tmp_path)) is None
