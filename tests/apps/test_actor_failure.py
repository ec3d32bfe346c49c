"""A run ended by one of its processes dying (`slime_app.failures.actor_failure`): one line, not Ray's tracebacks."""

import os
import subprocess
import sys
import textwrap

import ray.exceptions

from slime_app.demo import MODEL_DIR
from slime_app.failures import actor_failure

# What Ray 2.60 said when the rollout manager's process ended in a reward plugin's os._exit(3) (measured).
DIED = (
    "The actor died unexpectedly before finishing this task.\\n\\tclass_name: RolloutManager\\n\\tactor_id: "
    "6ab0f91e8df9b82591a4634701000000\\n\\tpid: 2755\\n\\tnamespace: 176be000\\n\\tip: 192.0.2.2\\nThe actor is dead "
    "because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly "
    "exits with a connection error code 2. End of file. Some common causes include: (1) the process was killed by "
    "the OOM killer due to high memory usage, (2) ray stop --force was called"
)


def _died(message: str = DIED, init_failed: bool = False) -> ray.exceptions.ActorDiedError:
    error = ray.exceptions.ActorDiedError()
    # Ray's own constructor takes a protobuf context; these are the fields it fills from it.
    ray.exceptions.RayActorError.__init__(error, "6ab0f91e", message.encode().decode("unicode_escape"), init_failed)
    return error


def test_the_line_names_the_process_how_it_died_and_where_to_look():
    assert actor_failure(_died()) == (
        "the process of the rollout manager (where reward, generate and data-source plugins run) (pid 2755) died "
        "(SYSTEM_ERROR): a plugin that calls os._exit, a crash in native code or the OOM killer (see `dmesg`) ends a "
        "process this way; its last log lines are above"
    )
    trainer = DIED.replace("RolloutManager", "TrainActor")
    assert actor_failure(_died(trainer)).startswith("the process of a trainer rank (pid 2755) died (SYSTEM_ERROR)")
    assert actor_failure(_died(init_failed=True)) is None  # an __init__ error carries its own message
    assert actor_failure(ValueError("x")) is None


def test_the_cli_ends_in_one_line_when_a_process_of_the_run_dies(tmp_path):
    # Before: three chained tracebacks (118 lines) of ActorDiedError and no `slime: error:` line.
    script = textwrap.dedent(
        f"""
        import sys
        import ray.exceptions
        from slime_app import loop
        class Run:
            def __init__(self, cfg):
                self.tracker = None
            def run(self):
                error = ray.exceptions.ActorDiedError()
                ray.exceptions.RayActorError.__init__(error, "6ab0f91e", {DIED.encode().decode("unicode_escape")!r})
                raise error
            def close(self):
                pass
        loop.Run = Run
        from slime_app.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, "--hf-checkpoint", str(MODEL_DIR),
         "--rollout-batch-size", "1", "--num-rollout", "1",
         "--rollout-max-response-len", "8", "--output-dir",
         str(tmp_path), "--rollout-engine", "reference", "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("slime: error:")]
    assert errors == ["slime: error: " + actor_failure(_died())], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
