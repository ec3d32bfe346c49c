"""One run per output folder (`slime_app.run_lock`): a second run on the folders of a live one stops in one line."""

import os
import socket

import pytest

from slime_app.demo import default_demo_argv
from slime_app.run_lock import LOCK_NAME, RunLocked, lock_run_folders, release_run_folders
from slime_core.config import parse_args


@pytest.fixture
def release():
    yield
    release_run_folders()


def test_a_second_run_on_the_folders_of_a_live_run_stops_before_ray(tmp_path, release, cli_without_ray):
    # Issue 27: a relaunch while the first run still ran wrote checkpoints, data cursors and TensorBoard events into
    # the same folders as it, interleaved.
    argv = [*default_demo_argv(tmp_path / "run"), "--save", str(tmp_path / "ckpt")]
    lock_run_folders(parse_args(argv))  # the live run (this process)
    holder = (tmp_path / "run" / LOCK_NAME).read_text()
    assert holder.startswith(f"pid {os.getpid()} on host {socket.gethostname()}, since ")
    out = cli_without_ray(argv)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1] == (
        f"slime: error: --output-dir {tmp_path / 'run'}: another slime run writes there ({holder.strip()}); stop it "
        "or wait for it to end, or give this run another --output-dir"
    )
    assert "Traceback" not in out.stderr


def test_the_lock_names_save_and_goes_with_its_holder(tmp_path, release):
    first = parse_args([*default_demo_argv(tmp_path / "a"), "--save", str(tmp_path / "ckpt")])
    second = parse_args([*default_demo_argv(tmp_path / "b"), "--save", str(tmp_path / "ckpt")])
    lock_run_folders(first)
    with pytest.raises(RunLocked, match=rf"^--save {tmp_path / 'ckpt'}: another slime run writes there \(pid "):
        lock_run_folders(second)  # its --output-dir is free: that lock is not kept
    release_run_folders()  # the first run ended (a driver's exit, kill -9 included, closes the descriptors)
    lock_run_folders(second)
    lock_run_folders(parse_args(default_demo_argv(tmp_path / "a")))  # --output-dir a was not kept by the refusal


def test_a_save_folder_holding_only_the_lock_resumes_as_an_empty_one(tmp_path, release):
    # A run that stopped before its first save leaves the lock file in --save: the relaunch with --load on the same
    # folder (the usual --save X --load X) must start afresh, not refuse "an unknown checkpoint".
    from slime_app.checkpoint_kinds import checkpoint_kind
    from slime_app.checkpoints import check_checkpoints

    argv = [*default_demo_argv(tmp_path / "run"), "--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt")]
    lock_run_folders(parse_args(argv))
    release_run_folders()
    assert sorted(os.listdir(tmp_path / "ckpt")) == [LOCK_NAME]
    assert checkpoint_kind(tmp_path / "ckpt") == "empty"
    notes = check_checkpoints(parse_args(argv))
    assert [n for n in notes if n.startswith("--load")] == [
        f"--load {tmp_path / 'ckpt'}: no checkpoint yet, the run starts at rollout 0"
    ], notes


def test_a_critic_save_folder_of_its_own_is_locked_too(tmp_path, release):
    # Two PPO runs with their own --save and one --critic-save interleaved the critic's checkpoints and trackers.
    def ppo(name):
        return parse_args([*default_demo_argv(tmp_path / name), "--save", str(tmp_path / f"ckpt-{name}"),
                           "--advantage-estimator", "ppo", "--critic-save", str(tmp_path / "critic")])  # fmt: skip

    lock_run_folders(ppo("a"))
    with pytest.raises(RunLocked, match=rf"^--critic-save {tmp_path / 'critic'}: another slime run writes there \("):
        lock_run_folders(ppo("b"))


@pytest.mark.parametrize("template", ["{tmp}/models/latest", "{tmp}/models/hf_{{rollout_id}}"])
def test_two_runs_exporting_to_one_save_hf_are_refused(tmp_path, release, template):
    # Issue 27 pass 27: --save-hf was not locked. Two runs with their own --output-dir and --save exporting to one
    # --save-hf deleted each other's staging folder (the export then failed, exit 5) or replaced each other's exports.
    hf = template.format(tmp=tmp_path)
    first = parse_args([*default_demo_argv(tmp_path / "a"), "--save-hf", hf])
    second = parse_args([*default_demo_argv(tmp_path / "b"), "--save-hf", hf])
    lock_run_folders(first)
    with pytest.raises(RunLocked, match=rf"^--save-hf {hf}: another slime run writes there \(pid "):
        lock_run_folders(second)
    # A fixed export folder is replaced whole by each export: its lock lives beside it, not in it.
    assert not (tmp_path / "models" / "latest").exists()
    release_run_folders()
    lock_run_folders(second)


def test_a_save_hf_inside_the_output_dir_takes_no_second_lock_but_still_excludes_another_run(tmp_path, release):
    own = parse_args([*default_demo_argv(tmp_path / "a"), "--save-hf", str(tmp_path / "a" / "hf")])
    lock_run_folders(own)
    other = parse_args([*default_demo_argv(tmp_path / "b"), "--save-hf", str(tmp_path / "a" / "hf")])
    with pytest.raises(RunLocked, match=r"^--save-hf "):
        lock_run_folders(other)
