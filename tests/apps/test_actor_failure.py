"""A run ended by one of its processes dying (`slime_app.failures.actor_failure`): one line, not Ray's tracebacks."""

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import ray
import ray.exceptions

from slime_app.demo import MODEL_DIR
from slime_app.failures import actor_failure, memory_failure

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


def _cli_with_a_failing_run(tmp_path, imports: str, run_body: str) -> subprocess.CompletedProcess:
    """`slime_app.cli.main` on the demo flags with `loop.Run` replaced by one whose `run()` executes `run_body`.

    Args:
        imports: the script's import line(s) (what `run_body` uses).
        run_body: the statements of `Run.run`, unindented.
    """
    body = textwrap.indent(textwrap.dedent(run_body).strip(), " " * 8)
    script = (
        f"import sys\n{imports}\nfrom slime_app import loop\n"
        "class Run:\n    def __init__(self, cfg):\n        self.tracker = None\n"
        f"    def run(self):\n{body}\n"
        "    def close(self):\n        pass\n"
        "loop.Run = Run\nfrom slime_app.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, "--hf-checkpoint", str(MODEL_DIR),
         "--rollout-batch-size", "1", "--num-rollout", "1",
         "--rollout-max-response-len", "8", "--output-dir",
         str(tmp_path), "--rollout-engine", "reference", "--train-backend", "fsdp", "--actor-num-gpus-per-node", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip


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
    out = _cli_with_a_failing_run(
        tmp_path,
        "import ray.exceptions",
        f"""
        error = ray.exceptions.ActorDiedError()
        ray.exceptions.RayActorError.__init__(error, "6ab0f91e", {DIED.encode().decode("unicode_escape")!r})
        raise error
        """,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("slime: error:")]
    assert errors == ["slime: error: " + actor_failure(_died())], out.stderr[-3000:]
    assert "Traceback" not in out.stderr


# ---- a process that raised out of memory (`slime_app.failures.memory_failure`) -------------------------------------

CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is "
    "free. Of the allocated memory 75.31 GiB is allocated by PyTorch"
)


class TrainActor:  # named as slime's trainer rank: the line names the process by its class
    def train(self, rollout_id):
        import torch

        raise torch.OutOfMemoryError(CUDA_OOM)


def test_a_trainer_rank_out_of_memory_is_one_line_naming_the_rank_and_the_flags(monkeypatch):
    # Issue 27: a rank's CUDA OOM mid-step ended the run in Ray's traceback of the task (slime's and torch's frames,
    # the allocator's message in the middle) with no `slime: error:` line. Real Ray: the wrapper it builds.
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # workers run in this venv (as `slime_app.cluster` sets)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(num_cpus=1, include_dashboard=False)
    try:
        actor = ray.remote(num_cpus=0)(TrainActor).remote()
        pid, ip = ray.get(actor.__ray_call__.remote(lambda self: (os.getpid(), ray.util.get_node_ip_address())))
        try:
            ray.get(actor.train.remote(3))
        except Exception as e:  # noqa: BLE001 - what the driver catches
            error = e
    finally:
        ray.shutdown()
    cfg = SimpleNamespace(save="/ckpt")
    line = memory_failure(error, cfg)
    assert line == (
        f"out of memory in TrainActor.train of a trainer rank (pid {pid}, {ip}): OutOfMemoryError: {CUDA_OOM} "
        "(lower the memory of a step: --max-tokens-per-gpu (with --use-dynamic-batch-size) or --micro-batch-size, "
        "--log-probs-max-tokens-per-gpu, --gradient-checkpointing (FSDP) or --recompute-granularity (Megatron); "
        "resume from the last checkpoint with --load /ckpt)"
    )
    assert memory_failure(ValueError("x"), cfg) is None
    assert memory_failure(MemoryError(), SimpleNamespace(save=None)) == (
        "out of memory: MemoryError: no message (lower the memory of a step: --max-tokens-per-gpu (with "
        "--use-dynamic-batch-size) or --micro-batch-size, --log-probs-max-tokens-per-gpu, --gradient-checkpointing "
        "(FSDP) or --recompute-granularity (Megatron))"
    )


def test_the_cli_ends_in_one_line_with_exit_1_when_a_rank_runs_out_of_memory(tmp_path):
    out = _cli_with_a_failing_run(
        tmp_path,
        "import ray.exceptions, torch",
        f"""
        cause = torch.OutOfMemoryError({CUDA_OOM!r})
        raise ray.exceptions.RayTaskError(
            "TrainActor.train", "Traceback (most recent call last): ...", cause, "ray::TrainActor.train",
            pid=4242, ip="10.0.0.7",
        ).as_instanceof_cause()
        """,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("slime: error:")]
    assert errors == [
        f"slime: error: out of memory in TrainActor.train of a trainer rank (pid 4242, 10.0.0.7): OutOfMemoryError: "
        f"{CUDA_OOM} (lower the memory of a step: --max-tokens-per-gpu (with --use-dynamic-batch-size) or "
        "--micro-batch-size, --log-probs-max-tokens-per-gpu, --gradient-checkpointing (FSDP) or "
        "--recompute-granularity (Megatron))"
    ], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
