"""The driver's one-line failures: a save that could not be written, a run ended by an engine failure.

A full disk during a save ended the run in a 60-line traceback whose last line was torch's zip writer
(`unexpected pos 704 vs 598`), naming neither `--save` nor the disk; an engine killed mid-rollout ended it in a
150-line traceback of the rollout manager's task. Both reach the driver wrapped by Ray (and by DCP's per-rank
collection); `root_cause` unwraps them and the messages here say what failed, where, and what to do: for a save,
the underlying error, the free space left there and the last complete checkpoint, which the atomic save
(`slime_core.dir_swap`) left intact.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pathlib
import re
import shutil
import sys
from collections.abc import Iterator

import ray.exceptions

from slime_app.guards import StartRefused
from slime_app.outputs import nearest_existing
from slime_core.checkpoint_dirs import tracker_step
from slime_core.config import SlimeArgs
from slime_core.error_text import first_rank_error
from slime_core.hook_deadline import HookDeadlineExceeded
from slime_rollout.engines.transport import EngineError
from slime_rollout.rewards.checks import RewardFunctionError
from slime_rollout.runtime.deadlines import DeadlineExceeded
from slime_rollout.weight_sync.push import WeightPushError

__all__ = [
    "SaveFailed",
    "actor_failure",
    "deadline_failure",
    "engine_failure",
    "interrupted_resume_line",
    "memory_failure",
    "plugin_failure",
    "refused_input",
    "root_cause",
    "save_failed",
    "weight_write_errors",
    "weight_write_failed",
]


logger = logging.getLogger(__name__)


class SaveFailed(RuntimeError):
    """A checkpoint or HF export could not be written; the message is the one line to show."""


def root_cause(error: BaseException) -> BaseException:
    """The error underneath Ray's task wrapper, DCP's per-rank collection and explicit `raise ... from` chains."""
    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, BaseException):
            error = error.cause
            continue
        rank_error = first_rank_error(error)  # torch.distributed.checkpoint's CheckpointException
        if rank_error is not error:
            error = rank_error
            continue
        if error.__cause__ is not None:
            error = error.__cause__
            continue
        break
    return error


def _free_space(path: pathlib.Path) -> str:
    """`"12.3 GiB free there"` for the filesystem holding `path` (its nearest existing ancestor)."""
    try:
        free = float(shutil.disk_usage(nearest_existing(path)).free)
    except OSError:
        return "free space unknown"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while free >= 1024 and i < len(units) - 1:
        free /= 1024
        i += 1
    return f"{free:.0f} B free there" if i == 0 else f"{free:.1f} {units[i]} free there"


def _last_checkpoint(save: pathlib.Path) -> str:
    step = tracker_step(save)
    if step is None:
        return "no complete checkpoint there yet"
    return f"the last complete checkpoint there (iteration {step}) is intact: resume with --load {save}"


def interrupted_resume_line(save: str | os.PathLike[str] | None) -> str | None:
    """What a resume of an interrupted run loads, read after its teardown: `--save /ckpt: the last complete ...`.

    A run stopped by SIGTERM or Ctrl-C (possibly in the middle of a save) said only that it was interrupted; which
    checkpoint a `--load` would resume, if any, was left to guess. The tracker commits a save, so the one it names
    is complete.

    Returns:
        The line, or None without `--save`.
    """
    if not save:
        return None
    return f"--save {save}: {_last_checkpoint(pathlib.Path(save))}"


@contextlib.contextmanager
def refused_input(what: str) -> Iterator[None]:
    """Bad input met while starting (a damaged `--load` checkpoint or data cursor) is `StartRefused`: one line.

    A Ray actor's `ValueError`/`FileNotFoundError` reaches the driver wrapped in Ray's task error, which would end the
    run in a traceback; the root cause's message is the line (`what` goes to the debug log with the traceback).
    """
    try:
        yield
    except Exception as e:
        cause = root_cause(e)
        if isinstance(cause, (ValueError, FileNotFoundError)):
            logger.debug("%s", what, exc_info=True)
            raise StartRefused(" ".join(str(cause).split())) from e
        raise


def save_failed(what: str, flag: str, path: str | os.PathLike[str], error: BaseException) -> SaveFailed:
    """The one-line error of a failed save.

    Args:
        what: what was being saved, e.g. `"the checkpoint of rollout 3"`.
        flag: `--save` or `--save-hf`.
        path: where it was going.
        error: what the save raised (a Ray task error wrapping the rank's error, possibly DCP's collection).

    Returns:
        `SaveFailed`, e.g. `saving the checkpoint of rollout 0 to --save /ckpt failed: RuntimeError: [enforce fail
        at inline_container.cc:672] . unexpected pos 704 vs 598 (0 B free there); no complete checkpoint there yet`.
    """
    cause = root_cause(error)
    text = " ".join(str(cause).split()) or "(no message)"
    folder = pathlib.Path(path)
    line = f"saving {what} to {flag} {folder} failed: {type(cause).__name__}: {text[:300]} ({_free_space(folder)})"
    if flag == "--save":
        line += f"; {_last_checkpoint(folder)}"
    return SaveFailed(line)


def weight_write_failed(error: BaseException, cfg: SlimeArgs, weight_version: int) -> SaveFailed | None:
    """The one-line `SaveFailed` of a weight push that could not write its files, or None for other errors.

    A disk push (`--weight-sync disk`) writes the weights into `--update-weight-disk-dir` (delta mode also patches
    `--update-weight-local-checkpoint-dir`) before any engine reads them; a full disk or a read-only folder there
    ended the run in a traceback of the trainer rank's task naming neither flag. The engines kept the weights they
    had (the write is atomic: `slime_core.dir_swap`).

    Args:
        error: what the driver caught (Ray's task error around rank 0's `OSError`).
        cfg: reads `weight_sync`, `update_weight_disk_dir`, `update_weight_local_checkpoint_dir`.
        weight_version: the version being pushed.
    """
    cause = root_cause(error)
    if cfg.weight_sync != "disk" or not isinstance(cause, OSError) or not cfg.update_weight_disk_dir:
        return None
    flag, path = "--update-weight-disk-dir", cfg.update_weight_disk_dir
    local = cfg.update_weight_local_checkpoint_dir
    if local and cause.filename and pathlib.Path(str(cause.filename)).is_relative_to(local):
        flag, path = "--update-weight-local-checkpoint-dir", local
    return save_failed(f"the weights of version {weight_version}", flag, path, error)


@contextlib.contextmanager
def weight_write_errors(cfg: SlimeArgs, weight_version: int) -> Iterator[None]:
    """Raises `weight_write_failed`'s `SaveFailed` for an error of the block it applies to; others as they are."""
    try:
        yield
    except Exception as e:
        failed = weight_write_failed(e, cfg, weight_version)
        if failed is None:
            raise
        logger.debug("the weight push of version %d failed", weight_version, exc_info=True)
        raise failed from e


def engine_failure(error: BaseException, cfg: SlimeArgs) -> str | None:
    """The one line for a run ended by an engine that died or stopped answering, or None for other errors.

    An engine killed mid-rollout (without `--use-fault-tolerance`) ended the run in a 150-line traceback of the
    rollout manager's task; what the user needs is which engine, what the client saw, and what to do.

    Args:
        error: what the driver caught (Ray's task error around the rollout manager's `EngineError`, or around a trainer
            rank's `WeightPushError`).
        cfg: reads `use_fault_tolerance` and `save`, for the advice.
    """
    cause = root_cause(error)
    if not isinstance(cause, EngineError | WeightPushError):  # a push's failure crosses Ray without its cause
        return None
    # Not twice: a frozen engine's error already says what --use-fault-tolerance would have done.
    advised = cfg.use_fault_tolerance or "--use-fault-tolerance" in str(cause)
    advice = [] if advised else ["--use-fault-tolerance restarts an engine that dies"]
    if cfg.save:
        advice.append(f"resume from the last checkpoint with --load {cfg.save}")
    return f"{cause}" + (f" ({'; '.join(advice)})" if advice else "")


def deadline_failure(error: BaseException) -> str | None:
    """The one line for a run ended by user code past its deadline (rollout or trainer side), or None for others.

    The error already names the plugin, the sample or rollout and the flag; Ray's wrapping added a 30-line traceback
    of the actor around it.
    """
    cause = root_cause(error)
    if isinstance(cause, DeadlineExceeded | HookDeadlineExceeded):
        return f"{cause}"
    return None


# What runs in each actor's process, for the line that says one died.
_ACTORS = {
    "RolloutManager": "the rollout manager (where reward, generate and data-source plugins run)",
    "TrainActor": "a trainer rank",
    "EngineHost": "an engine host",
}


def actor_failure(error: BaseException) -> str | None:
    """The one line for a run ended by one of its processes dying, or None for other errors.

    A reward plugin that called `os._exit`, a crash in native code (a segfault) or the OOM killer ended the run in
    three chained tracebacks (118 lines) of Ray's `ActorDiedError`, with no `slime: error:` line: what the user needs
    is which process died, how, and where to look.

    Args:
        error: what the driver caught.
    """
    cause = root_cause(error)
    if not isinstance(cause, ray.exceptions.ActorDiedError) or cause.actor_init_failed:
        return None  # an error in an actor's __init__ carries its own traceback and message
    text = str(cause)
    name = re.search(r"class_name: (\w+)", text)
    pid = re.search(r"\bpid: (\d+)", text)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    who = _ACTORS.get(name.group(1), f"actor {name.group(1)}") if name else "an actor"
    return (
        f"the process of {who}{f' (pid {pid.group(1)})' if pid else ''} died"
        f"{f' ({exit_type.group(1)})' if exit_type else ''}: a plugin that calls os._exit, a crash in native code or "
        "the OOM killer (see `dmesg`) ends a process this way; its last log lines are above"
    )


# The head of a task's traceback in Ray's error text: `ray::TrainActor.train() (pid=4242, ip=10.0.0.7` (colour codes
# between the two when the driver's output is a terminal).
_TASK_LINE = re.compile(r"ray::([\w.]+)\(\)(?:\x1b\[\d+m)? \(pid=(\d+), ip=([^,)\s]+)")


def _out_of_memory(error: BaseException) -> bool:
    """Whether it is torch's `OutOfMemoryError` (CUDA), `MemoryError` (host), or an allocator's text for them."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    return "CUDA out of memory" in str(error)[:500]


def memory_failure(error: BaseException, cfg: SlimeArgs) -> str | None:
    """The one line for a run ended by a process that ran out of memory (raised, not killed), or None for others.

    A trainer rank whose step allocated past the GPU's memory ended the run in Ray's traceback of the rank's task
    (40 lines of slime's and torch's frames, the allocator's message in the middle), with no `slime: error:` line.
    The line names the process and its call (Ray's wrapper has both), the allocator's message, and the flags that
    lower a step's memory. (A process the OOM killer ended is `actor_failure`'s.)

    Args:
        error: what the driver caught.
        cfg: reads `save`, for the advice.
    """
    chain = _chain(error)
    oom = next((e for e in chain if not isinstance(e, ray.exceptions.RayTaskError) and _out_of_memory(e)), None)
    if oom is None:
        return None
    # Ray's wrapper (an instance of the cause's class too) keeps the failing call only in its text.
    texts = (str(e) for e in chain if isinstance(e, ray.exceptions.RayTaskError))
    task = next((m for text in texts if (m := _TASK_LINE.search(text))), None)
    where = ""
    if task is not None:
        call, pid, ip = task.groups()
        cls = call.split(".")[0]
        who = _ACTORS.get(cls, f"actor {cls}") if "." in call else "a task"
        where = f" in {call} of {who} (pid {pid}, {ip})"
    message = " ".join(str(oom).split()) or "no message"
    if len(message) > 300:  # torch's CUDA message goes on about the allocator's settings
        message = message[:300] + " ..."
    advice = (
        "lower the memory of a step: --max-tokens-per-gpu (with --use-dynamic-batch-size) or --micro-batch-size, "
        "--log-probs-max-tokens-per-gpu, --gradient-checkpointing (FSDP) or --recompute-granularity (Megatron)"
    )
    if cfg.save:
        advice += f"; resume from the last checkpoint with --load {cfg.save}"
    return f"out of memory{where}: {type(oom).__name__}: {message} ({advice})"


# Where slime's own code and the environment's live: frames there are not the user's.
_OWN_PACKAGES = (
    "slime_app",
    "slime_compat",
    "slime_convert",
    "slime_core",
    "slime_envs",
    "slime_rollout",
    "slime_train_fsdp",
    "slime_train_megatron",
    "slime",
)
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')


def _not_user_dirs() -> tuple[str, ...]:
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for name in _OWN_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.add(os.path.realpath(location))
    return tuple(sorted(dirs))


def _user_frames(text: str, skip: tuple[str, ...]) -> list[str]:
    """`path:line in function` of every traceback frame in `text` outside `skip` (`_not_user_dirs`)."""
    frames = []
    for line in text.splitlines():
        match = _FRAME.match(line)
        if not match or match.group(1).startswith("<"):
            continue
        path = os.path.realpath(match.group(1))
        if "site-packages" in path or any(path == d or path.startswith(d + os.sep) for d in skip):
            continue
        frames.append(f"{match.group(1)}:{match.group(2)} in {match.group(3)}")
    return frames


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and everything under it: Ray's task wrapper, `raise ... from` and implicit contexts."""
    out: list[BaseException] = []
    todo: list[BaseException] = [error]
    while todo:
        e = todo.pop()
        if any(e is seen for seen in out):
            continue
        out.append(e)
        if isinstance(e, ray.exceptions.RayTaskError) and isinstance(e.cause, BaseException):
            todo.append(e.cause)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return out


def plugin_failure(error: BaseException) -> str | None:
    """The one line for a run ended by an error in the user's own code, or None for others (their traceback stays).

    A reward function that raised ended the run in a 100-line traceback of slime's rollout internals across Ray, the
    user's one frame in the middle of it. The line is the error that names the plugin and the sample (a
    `RewardFunctionError`, or the error with its `(raised by <plugin>)` note) and where the user's code raised it:
    the innermost frame outside slime, the environment and Python. An error without such a frame is slime's own (or
    a library's) and keeps its traceback, except a `RewardFunctionError` about what a reward function returned.

    Args:
        error: what the driver caught.
    """
    chain = _chain(error)
    # A wrapper's text is the remote traceback (Ray's dual-class wrapper keeps only that text, in str()).
    texts = [str(e) for e in chain if isinstance(e, ray.exceptions.RayTaskError)]
    # A chained traceback prints the root cause first: its innermost user frame is where the user's code raised.
    blocks = [b for text in texts for b in re.split(r"\n(?=The above exception was|During handling of)", text)]
    skip = _not_user_dirs()  # once per error: it looks up every slime package's location
    frames = next((found for b in blocks if (found := _user_frames(b, skip))), [])
    # Ray's wrapper is an instance of its cause's class too (args: its own): the plain cause carries the message.
    plain = [e for e in chain if not isinstance(e, ray.exceptions.RayTaskError)]
    named = next((e for e in plain if isinstance(e, RewardFunctionError)), None)
    if named is None and frames:
        named = next(
            (e for e in plain if any(str(n).startswith("(raised by ") for n in getattr(e, "__notes__", ()))), None
        )
    if named is None or (not frames and not isinstance(named, RewardFunctionError)):
        return None
    message = " ".join(str(named).split()) or type(named).__name__
    if not isinstance(named, RewardFunctionError):
        notes = [str(n) for n in getattr(named, "__notes__", ()) if str(n).startswith("(raised by ")]
        message = f"{type(named).__name__}: {message} {notes[0] if notes else ''}".rstrip()
    where = f" at {frames[-1]}" if frames else ""
    return f"{message}{where} (the full traceback: SLIME_LOG_LEVEL=DEBUG)"
