"""What one sandboxed run returns (`SandboxResult`) and how its captured output is read back.

Split from `slime_envs.sandbox`, which builds and supervises the run; re-exported there.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import IO

__all__ = ["SandboxResult", "read_capped"]


@dataclasses.dataclass(kw_only=True, slots=True)
class SandboxResult:
    """Outcome of one run.

    Attributes:
        stdout: captured standard output, truncated to `max_output_chars`.
        stderr: captured standard error (tracebacks), truncated likewise.
        exit_code: the exit status of the code's process; negative: killed by that signal. Both come from
            the kernel's wait status, read by the sandbox's init (so `sys.exit(137)` is 137, not SIGKILL);
            `-SIGKILL` when the wall clock ran out; 1, with nothing run, for a program larger than the sandbox
            holds (`slime_envs.sandbox.code_too_large`).
        timed_out: the wall-clock limit was hit.
        output_limited: stdout or stderr was truncated: a process tried to write more than `max_output_bytes` to
            it (the write failed with EFBIG, or SIGXFSZ killed a non-Python process); exactly that much is not.
        memory_limited: the memory cgroup's limit was hit and the kernel killed a process.
        enforcement: which mechanism enforced each limit (`isolation`, `network`, `processes`, ...).
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    output_limited: bool = False
    memory_limited: bool = False
    enforcement: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """The code ran to completion with exit code 0."""
        return self.exit_code == 0 and not self.timed_out

    def to_observation(self) -> str:
        """The text shown to the model: output, then errors and which limit was hit."""
        parts = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr:
            parts.append(self.stderr.rstrip("\n"))
        if self.timed_out:
            parts.append("Error: execution timed out (wall-clock limit reached); the process was killed.")
        elif self.memory_limited:
            parts.append("Error: memory limit exceeded; the kernel killed a process.")
        elif self.output_limited:
            parts.append("Error: output limit exceeded; further writes failed.")
        elif self.exit_code < 0:
            parts.append(f"Error: the process was killed by signal {_signal_name(-self.exit_code)}.")
        if not parts:
            parts.append("(no output)" if self.exit_code == 0 else f"(no output, exit code {self.exit_code})")
        return "\n".join(parts)


def _signal_name(number: int) -> str:
    """`SIGKILL` for 9; the bare number for a signal without a name (real-time signals 35..63, anything else)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def read_capped(f: IO[bytes], max_chars: int, *, keep_tail: bool = False) -> str:
    """Reads at most `max_chars` characters: the head (stdout) or the tail (stderr, where the error is)."""
    size = f.seek(0, os.SEEK_END)
    budget = max_chars * 4 + 4  # enough bytes for max_chars UTF-8 characters
    f.seek(size - budget if keep_tail and size > budget else 0)
    data = f.read(budget)
    text = data.decode("utf-8", errors="replace")
    if len(text) <= max_chars and size <= len(data):
        return text
    if keep_tail:
        return f"(output truncated to the last {max_chars} characters) ...\n" + text[-max_chars:]
    return text[:max_chars] + f"\n... (output truncated to {max_chars} characters)"
