"""The driver's one-line failures (`slime_app.failures`): a failed save, an engine that died mid-rollout.

Found by fault injection: a demo run with `--save` on a 2 MiB tmpfs ended after its first rollout in a 60-line
traceback whose last line was `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598`
(exit 1); an engine killed with SIGKILL during rollout 3 ended it in a 150-line traceback of the rollout manager.
"""

import errno
import os
import re
import subprocess
import sys
import types

import pytest
import ray.exceptions
from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from slime_app import loop
from slime_app.demo import MODEL_DIR
from slime_app.failures import SaveFailed, engine_failure, root_cause, save_failed
from slime_core.config import SlimeArgs
from slime_rollout.engines.transport import EngineError

BASE = {"rollout_batch_size": 1, "num_rollout": 1}


def _cfg(tmp_path, **fields) -> SlimeArgs:
    return SlimeArgs.from_dict({**BASE, "output_dir": str(tmp_path / "out"), **fields})


def _disk_full_from_rank_0() -> BaseException:
    """What the driver gets when rank 0's DCP write meets a full disk: Ray's task error around DCP's collection."""
    full = OSError(errno.ENOSPC, "No space left on device")
    collected = CheckpointException("write", {0: _wrap_exception(full)})
    return ray.exceptions.RayTaskError("TrainActor.save", "Traceback ...", collected).as_instanceof_cause()


def test_root_cause_sees_through_ray_and_dcp():
    cause = root_cause(_disk_full_from_rank_0())
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    plain = ValueError("x")
    assert root_cause(plain) is plain


def test_a_failed_save_is_one_line_naming_the_flag_the_cause_and_the_last_checkpoint(tmp_path):
    save = tmp_path / "ckpt"
    save.mkdir()
    (save / "latest_checkpointed_iteration.txt").write_text("3\n")
    line = str(save_failed("the checkpoint of rollout 4", "--save", save, _disk_full_from_rank_0()))
    assert re.fullmatch(
        rf"saving the checkpoint of rollout 4 to --save {re.escape(str(save))} failed: OSError: \[Errno 28\] No space "
        rf"left on device \([0-9.]+ (B|KiB|MiB|GiB|TiB) free there\); the last complete checkpoint there \(iteration "
        rf"3\) is intact: resume with --load {re.escape(str(save))}",
        line,
    ), line
    fresh = save_failed("the checkpoint of rollout 0", "--save", tmp_path / "new" / "ckpt", RuntimeError("boom"))
    assert re.search(r"failed: RuntimeError: boom \([0-9.]+ \w+ free there\); no complete checkpoint there yet$",
                     str(fresh))  # fmt: skip
    (save / "latest_checkpointed_iteration.txt").write_text("")  # emptied by a crash: it names no iteration
    assert str(save_failed("the checkpoint of rollout 4", "--save", save, RuntimeError("boom"))).endswith(
        "; no complete checkpoint there yet"
    )  # it said "the last complete checkpoint there (iteration ) is intact"
    hf = save_failed("the HF export of rollout 2", "--save-hf", tmp_path / "hf" / "2", RuntimeError("boom"))
    assert "checkpoint there" not in str(hf) and str(hf).startswith("saving the HF export of rollout 2 to --save-hf ")


def test_run_save_raises_save_failed_from_the_trainers_error(tmp_path, monkeypatch):
    save = tmp_path / "ckpt"

    class Trainer:
        def save(self, rollout_id, commit=True):
            raise _disk_full_from_rank_0()

    manager = types.SimpleNamespace(save=types.SimpleNamespace(remote=lambda rollout_id: ("cursor", rollout_id)))
    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg, run.manager, run.trainer = _cfg(tmp_path, save=str(save)), manager, Trainer()
    monkeypatch.setattr(loop.ray, "get", lambda ref, timeout=None: ref)
    with pytest.raises(SaveFailed, match=r"^saving the checkpoint of rollout 7 to --save .* No space left on device"):
        loop.Run.save(run, 7)


def test_the_save_failure_reaches_the_cli_as_exit_5(tmp_path):
    # The real CLI with a Run whose save fails as a full disk makes it: one line, exit 5, no traceback.
    script = f"""
import sys
from slime_app import failures, loop
class Run:
    def __init__(self, cfg):
        self.cfg = cfg
    def run(self):
        raise failures.save_failed("the checkpoint of rollout 0", "--save", {str(tmp_path / "ckpt")!r},
                                  OSError(28, "No space left on device"))
    def close(self):
        print("closed", flush=True)
loop.Run = Run
from slime_app.cli import main
sys.exit(main(sys.argv[1:]))
"""
    argv = ["--hf-checkpoint", str(MODEL_DIR), "--rollout-batch-size", "1", "--num-rollout", "1",
            "--rollout-max-response-len", "8", "--output-dir", str(tmp_path / "out"), "--rollout-engine", "reference",
            "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1"]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    assert out.returncode == 5, out.stderr[-3000:]
    assert out.stdout == "closed\n"
    assert out.stderr.splitlines()[-1].startswith(
        f"slime: error: saving the checkpoint of rollout 0 to --save {tmp_path / 'ckpt'} failed: OSError: [Errno 28] "
    )
    assert "Traceback" not in out.stderr


def test_a_save_cut_by_a_full_disk_leaves_no_partial_copy_and_the_same_command_starts_afresh(tmp_path):
    # Issue 27 (s22), on a 30 MB tmpfs: the failed first save left its 30 MB iter_0000001.tmp (the disk stayed full)
    # and the same command again (--save X --load X) was refused as "an unknown checkpoint".
    save = tmp_path / "ckpt"
    script = f"""
import pathlib, sys
from slime_app import failures, loop
class Run:
    def __init__(self, cfg):
        pass
    def run(self):
        staging = pathlib.Path({str(save)!r}) / "iter_0000001.tmp"
        staging.mkdir()
        (staging / ".slime_export").write_text("")
        (staging / "__0_0.distcp").write_bytes(bytes(1000))
        (staging.parent / "rollout").mkdir()
        (staging.parent / "rollout" / "data_source_0.json").write_text("{{}}")
        raise failures.save_failed("the checkpoint of rollout 0", "--save", {str(save)!r},
                                  OSError(28, "No space left on device"))
    def close(self):
        pass
loop.Run = Run
from slime_app.cli import main
sys.exit(main(sys.argv[1:]))
"""
    argv = ["--hf-checkpoint", str(MODEL_DIR), "--rollout-batch-size", "1", "--num-rollout", "1",
            "--rollout-max-response-len", "8", "--output-dir", str(tmp_path / "out"), "--rollout-engine", "reference",
            "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1",
            "--save", str(save), "--load", str(save)]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    assert out.returncode == 5, out.stderr[-3000:]
    assert out.stderr.splitlines()[-2:] == [
        f"slime: error: saving the checkpoint of rollout 0 to --save {save} failed: OSError: [Errno 28] No space left "
        f"on device ({out.stderr.split('device (')[1].split(')')[0]}); no complete checkpoint there yet",
        f"slime: removed {save / 'iter_0000001.tmp'}: a save cut short, never a checkpoint",
    ]
    assert not (save / "iter_0000001.tmp").exists()
    from slime_app.checkpoints import check_checkpoints
    from slime_core.config import parse_args

    assert f"--load {save}: no checkpoint yet, the run starts at rollout 0" in check_checkpoints(parse_args(argv))


def test_an_interrupted_run_names_the_checkpoint_a_resume_loads(tmp_path):
    # Issue 27 pass 27: SIGTERM (or Ctrl-C) in the middle of a save said only "interrupted"; which checkpoint a
    # --load would resume was left to guess. The line comes after the teardown, where the cut save is settled.
    save = tmp_path / "ckpt"
    script = f"""
import os, pathlib, signal, sys
from slime_app import loop
class Run:
    def __init__(self, cfg):
        self.cfg = cfg
    def run(self):
        os.kill(os.getpid(), signal.SIGTERM)  # during a save: the tracker still names iteration 3
    def close(self):
        pathlib.Path({str(save)!r}, "latest_checkpointed_iteration.txt").write_text("4")  # the save committed
        print("closed", flush=True)
loop.Run = Run
from slime_app.cli import main
sys.exit(main(sys.argv[1:]))
"""
    (save / "iter_0000003").mkdir(parents=True)
    (save / "iter_0000003" / "meta.json").write_text("{}")
    (save / "latest_checkpointed_iteration.txt").write_text("3")
    argv = ["--hf-checkpoint", str(MODEL_DIR), "--rollout-batch-size", "1", "--num-rollout", "9", "--output-dir",
            str(tmp_path / "out"), "--save",
            str(save), "--load", str(save), "--no-load-optim", "--rollout-engine", "reference", "--train-backend",
            "fsdp", "--actor-num-gpus-per-node", "1", "--rollout-max-response-len", "8"]  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RAY_ADDRESS": ""})  # fmt: skip
    assert out.returncode == 143, out.stderr[-3000:]
    assert out.stdout == "closed\n"
    assert out.stderr.splitlines()[-2:] == [
        "slime: interrupted by SIGTERM, shutting down",
        f"slime: --save {save}: the last complete checkpoint there (iteration 4) is intact: resume with --load {save}",
    ]


def _engine_died() -> BaseException:
    died = EngineError("http://10.0.0.5:15000", "/generate", "unreachable after 9 attempts: ClientConnectorError: "
                       "Cannot connect to host 10.0.0.5:15000", unreachable=True)  # fmt: skip
    return ray.exceptions.RayTaskError("RolloutManager.generate", "Traceback ...", died).as_instanceof_cause()


def test_an_engine_failure_is_one_line_with_what_to_do(tmp_path):
    line = engine_failure(_engine_died(), _cfg(tmp_path, save=str(tmp_path / "ckpt")))
    assert line == (
        "engine http://10.0.0.5:15000/generate failed: unreachable after 9 attempts: ClientConnectorError: Cannot "
        f"connect to host 10.0.0.5:15000 (--use-fault-tolerance restarts an engine that dies; resume from the last "
        f"checkpoint with --load {tmp_path / 'ckpt'})"
    )
    assert engine_failure(_engine_died(), _cfg(tmp_path, use_fault_tolerance=True)).endswith(":15000")
    assert engine_failure(ValueError("a bug"), _cfg(tmp_path)) is None  # other errors keep their traceback


def test_a_frozen_engines_line_gives_the_fault_tolerance_advice_once(tmp_path):
    # Issue 27: an engine frozen with SIGSTOP ended the run with "... the engine is frozen (--use-fault-tolerance
    # restarts such engines) (--use-fault-tolerance restarts an engine that dies; resume ...)".
    frozen = EngineError("http://10.0.0.5:15000", "/generate", "no reply after 60 s, and /health_generate gave no 200 "
                         "within 30 s (--rollout-health-check-timeout): the engine is frozen (--use-fault-tolerance "
                         "restarts such engines)", unreachable=True)  # fmt: skip
    wrapped = ray.exceptions.RayTaskError("RolloutManager.generate", "Traceback ...", frozen).as_instanceof_cause()
    line = engine_failure(wrapped, _cfg(tmp_path, save=str(tmp_path / "ckpt")))
    assert line.count("--use-fault-tolerance") == 1, line
    assert line.endswith(f"restarts such engines) (resume from the last checkpoint with --load {tmp_path / 'ckpt'})")


def test_a_failed_weight_push_is_one_line_with_what_to_do(tmp_path):
    # A refused distributed push became a WeightPushError (so the restorer handles it); without
    # --use-fault-tolerance it must still end the run in one line, as the EngineError it was did.
    from slime_rollout.weight_sync.push import WeightPushError

    error = WeightPushError({"http://10.0.0.5:15000": "update_weights_from_distributed: refused"}, "3")
    wrapped = ray.exceptions.RayTaskError("TrainActor.update_weights", "Traceback ...", error).as_instanceof_cause()
    assert engine_failure(wrapped, _cfg(tmp_path)) == (
        "weight push '3' failed on 1 engine(s): http://10.0.0.5:15000: update_weights_from_distributed: refused "
        "(--use-fault-tolerance restarts an engine that dies)"
    )


def test_user_code_past_its_deadline_is_one_line(tmp_path):
    # A trainer-side hook stopped at --plugin-timeout-secs ended the run in Ray's 30-line actor traceback.
    from slime_app.failures import deadline_failure
    from slime_core.hook_deadline import HookDeadlineExceeded
    from slime_rollout.runtime.deadlines import DeadlineExceeded

    hook = HookDeadlineExceeded("--custom-loss-function-path m.loss did not finish within 5 s (--plugin-timeout-secs)")
    wrapped = ray.exceptions.RayTaskError("TrainActor.train", "Traceback ...", hook).as_instanceof_cause()
    assert deadline_failure(wrapped) == str(hook)
    rollout = DeadlineExceeded("generate function m.gen on sample 3 did not finish within 5 s (--plugin-timeout-secs)")
    assert deadline_failure(rollout) == str(rollout)
    assert deadline_failure(ValueError("a bug")) is None  # other errors keep their traceback


def _raised_in_user_code(tmp_path, body: str, wrap):
    """Runs `reward_func` of a module written under `tmp_path` (user code) through `wrap`, as Ray reports it."""
    import importlib.util
    import traceback

    path = tmp_path / "myrm.py"
    path.write_text(f"def reward_func(sample):\n    {body}\n")
    spec = importlib.util.spec_from_file_location("myrm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        wrap(module.reward_func)
    except Exception as e:  # what the actor's task raised, and the text Ray sends with it
        return ray.exceptions.RayTaskError("RolloutManager.generate", traceback.format_exc(), e).as_instanceof_cause()
    raise AssertionError("nothing raised")


def test_an_error_in_the_users_reward_function_is_one_line_at_its_frame(tmp_path):
    # Found by running the demo with a --custom-rm-path that divides by zero on one sample: 100 lines of slime's
    # rollout internals across Ray, the user's one frame in the middle, no `slime: error:` line.
    from slime_app.failures import plugin_failure
    from slime_rollout.rewards.checks import RewardFunctionError

    def rollout(fn):  # slime's side: the plugin call wrapped as call_reward_plugin does
        try:
            fn(3)
        except ZeroDivisionError as e:
            raise RewardFunctionError("--custom-rm-path myrm.reward_func raised ZeroDivisionError on sample 3") from e

    line = plugin_failure(_raised_in_user_code(tmp_path, "return 1 / 0", rollout))
    assert line == (
        f"--custom-rm-path myrm.reward_func raised ZeroDivisionError on sample 3 at {tmp_path / 'myrm.py'}:2 in "
        "reward_func (the full traceback: SLIME_LOG_LEVEL=DEBUG)"
    )


def test_a_plugin_error_note_names_the_plugin_and_slimes_own_bugs_keep_their_traceback(tmp_path):
    from slime_app.failures import plugin_failure
    from slime_core.hook_deadline import note_raised_by
    from slime_rollout.rewards.checks import RewardFunctionError

    def generate(fn):
        try:
            fn(0)
        except KeyError as e:
            note_raised_by(e, "--custom-generate-function-path myrm.reward_func")
            raise

    line = plugin_failure(_raised_in_user_code(tmp_path, "return {}['answer']", generate))
    assert line.startswith("KeyError: 'answer' (raised by --custom-generate-function-path myrm.reward_func) at ")
    assert f"{tmp_path / 'myrm.py'}:2 in reward_func" in line
    # No user frame in the remote traceback: slime's own error keeps its traceback, unless it is about what a reward
    # function returned.
    own = ray.exceptions.RayTaskError("RolloutManager.generate", "Traceback ...", ValueError("a bug"))
    assert plugin_failure(own.as_instanceof_cause()) is None
    returned = RewardFunctionError("--custom-rm-path m.f returned nan for sample 2")
    wrapped = ray.exceptions.RayTaskError("RolloutManager.generate", "Traceback ...", returned).as_instanceof_cause()
    assert plugin_failure(wrapped) == f"{returned} (the full traceback: SLIME_LOG_LEVEL=DEBUG)"


def _disk_full_writing(path) -> BaseException:
    """What the driver gets when rank 0's disk weight push meets a full disk: Ray's task error around the OSError."""
    full = OSError(errno.ENOSPC, "No space left on device", str(path))
    return ray.exceptions.RayTaskError("TrainActor.update_weights", "Traceback ...", full).as_instanceof_cause()


def _run_pushing(cfg, error):
    def push(weight_version):
        raise error

    run = loop.Run.__new__(loop.Run)  # no Ray, no placement
    run.cfg = cfg  # not colocated: no engine or trainer memory swaps around the push
    run.restorer = types.SimpleNamespace(push=push)
    return run


def test_a_disk_weight_push_that_cannot_write_its_files_is_one_line_naming_the_flag(tmp_path):
    # It was Ray's task traceback ending in the bare OSError, naming neither flag (exit 1).
    push = tmp_path / "push"
    cfg = _cfg(tmp_path, weight_sync="disk", update_weight_disk_dir=str(push))
    shard = push / ".weight_v000003.tmp-1" / "model-00001.safetensors"
    with pytest.raises(SaveFailed) as caught:
        loop.Run._sync_weights(_run_pushing(cfg, _disk_full_writing(shard)), 3)
    assert re.fullmatch(
        rf"saving the weights of version 3 to --update-weight-disk-dir {re.escape(str(push))} failed: OSError: "
        rf"\[Errno 28\] No space left on device: '{re.escape(str(shard))}' \([0-9.]+ (B|KiB|MiB|GiB|TiB) free there\)",
        str(caught.value),
    ), caught.value

    # Delta mode patches the local checkpoint: a failure there names that flag.
    delta = _cfg(tmp_path, weight_sync="disk", update_weight_mode="delta", update_weight_disk_dir=str(push))
    local = delta.update_weight_local_checkpoint_dir
    with pytest.raises(SaveFailed, match=r"^saving the weights of version 4 to --update-weight-local-checkpoint-dir "):
        loop.Run._sync_weights(_run_pushing(delta, _disk_full_writing(f"{local}/model-00001.safetensors")), 4)

    # Other transports write no files of the run: their OSError (shared memory, a socket) stays as it is.
    tensor = _cfg(tmp_path, weight_sync="tensor")
    with pytest.raises(OSError) as other:
        loop.Run._sync_weights(_run_pushing(tensor, _disk_full_writing("/dev/shm/torch_1")), 5)
    assert not isinstance(other.value, SaveFailed) and root_cause(other.value).errno == errno.ENOSPC
