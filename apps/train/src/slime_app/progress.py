"""What the run is doing now: its start-up phases, then the phase of every step, shown from launch.

Phases, in the order a run meets them: `ray` (the local node and the placement group), `engines` (engine
processes up and healthy), `model load` (trainer ranks built, weights read), `weight sync` (a push into the engines),
then per step `rollout`, `train` (`compile+train` for the first step when the trainer compiled the decoder
layers, which compile at their first forward: `--fsdp-compile-layers` / `--megatron-compile-layers`, as its `init`
reported; with PPO, the critic's first step, the run's first, and the actor's, after `--num-critic-only-steps`, each
as its own `init` reported), `save`, `weight sync`, and `eval`.

In a terminal, one rich line shows the current phase with its own timer next to the rollout bar (m/n, elapsed,
remaining), live from the first phase on. Without a terminal (a log file, CI, `ray job submit`) nothing is redrawn:
each phase logs one plain line when it starts and one with its seconds when it ends ("done in X s", or "failed after
X s: <exception type>" when it raised), and while it runs, "still running after X s" lines at 1, 3, 7 and 15 minutes,
then every 10 (the innermost phase only), so a slow start-up or a long rollout does not look like a hang. Either
way every start and end is recorded as a `PhaseEvent` (tests read them; the newest `EVENTS_KEPT` or more are kept).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

__all__ = ["PhaseEvent", "RunProgress"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True, slots=True)
class PhaseEvent:
    """One phase starting or ending.

    Attributes:
        kind: "start" or "end".
        name: the phase (`ray`, `engines`, `model load`, `rollout`, `train`, `eval`, ...).
        rollout_id: the step it belongs to (None for start-up phases).
        seconds: wall seconds the phase took ("end" only; 0.0 for "start").
        error: the type name of the exception the phase raised ("end" only; "" when it completed).

    Example:
        >>> PhaseEvent(kind="end", name="eval", rollout_id=0, seconds=112.0)
        PhaseEvent(kind='end', name='eval', rollout_id=0, seconds=112.0)
    """

    kind: str
    name: str
    rollout_id: int | None
    seconds: float = 0.0
    error: str = ""


# Seconds between a plain-log phase's "still running" lines: the first after HEARTBEAT_FIRST_S, each next one twice as
# late, at most HEARTBEAT_MAX_S apart (a 30-minute rollout logs 5 of them: at 1, 3, 7, 15 and 25 minutes).
HEARTBEAT_FIRST_S = 60.0
HEARTBEAT_MAX_S = 600.0
# Phase events `RunProgress.events` keeps (the newest): a step records about 10, and a run of thousands of rollouts
# kept every one.
EVENTS_KEPT = 1000


def heartbeat_delays(first_s: float = HEARTBEAT_FIRST_S, max_s: float = HEARTBEAT_MAX_S) -> Iterator[float]:
    """Seconds to wait before each "still running" line of one phase: first_s, 2·first_s, 4·first_s, ... ≤ max_s."""
    delay = first_s
    while True:
        yield delay
        delay = min(delay * 2, max_s)


def _label(name: str, rollout_id: int | None, detail: str) -> str:
    text = name if rollout_id is None else f"{name} {rollout_id}"
    return f"{text} ({detail})" if detail else text


class _PhaseColumn(ProgressColumn):
    """The current phase and how long it has run, e.g. `eval 0 1:52`."""

    def __init__(self, clock: Callable[[], float]):
        super().__init__()
        self.clock = clock

    def render(self, task: Task) -> Text:
        started = task.fields.get("phase_started")
        if started is None:
            return Text(task.fields.get("phase", ""))
        seconds = int(self.clock() - started)
        return Text.assemble((task.fields.get("phase", ""), "bold"), f" {seconds // 60}:{seconds % 60:02d}")


class RunProgress:
    """The live phase line and rollout bar in a terminal; plain log lines elsewhere.

    Args:
        console: where to draw (default: stdout); `console.is_terminal` decides live or plain.
        live: force live drawing on or off (default: whether `console` is a terminal).
        clock: monotonic seconds (tests pass a fake).
        heartbeat_s: seconds before a plain-log phase's first "still running" line (`heartbeat_delays`).

    Attributes:
        events: the newest phase starts and ends, oldest first: at least the last `EVENTS_KEPT`, at most twice that.
        live: whether the bar is drawn (a terminal) or phases are logged.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.perf_counter,
        heartbeat_s: float = HEARTBEAT_FIRST_S,
    ):
        self.console = console or Console(soft_wrap=True)
        self.live = self.console.is_terminal if live is None else live
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.events: list[PhaseEvent] = []
        self._open: list[str] = []  # labels of the phases running now, outermost first
        self._progress = Progress(
            _PhaseColumn(clock),
            TextColumn("[bold]rollout"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task("run", total=None, phase="starting", phase_started=None)
        self._started = False

    def start(self) -> None:
        """Starts drawing (terminal only); safe to call twice."""
        if self.live and not self._started:
            self._progress.start()
            self._started = True

    def set_rollouts(self, done: int, total: int) -> None:
        """The rollout bar: `done` of `total` rollouts (a resumed run starts past 0)."""
        self._progress.update(self._task, completed=done, total=total)

    def advance(self) -> None:
        """One more rollout done."""
        self._progress.update(self._task, advance=1)

    @contextlib.contextmanager
    def phase(self, name: str, rollout_id: int | None = None, detail: str = "") -> Iterator[None]:
        """Marks a phase for the duration of the `with` block (nested phases show the inner one, then the outer).

        Args:
            name: the phase (see the module docstring).
            rollout_id: the step it belongs to (None during start-up).
            detail: a short note logged with it (e.g. "first step compiles the decoder layers"); the live line
                shows the name only.
        """
        label = _label(name, rollout_id, detail)
        previous = self._progress.tasks[0].fields.get("phase"), self._progress.tasks[0].fields.get("phase_started")
        started = self.clock()
        self._record(PhaseEvent(kind="start", name=name, rollout_id=rollout_id))
        # The live line stays short (an 80-column terminal clips it); the log lines carry the detail.
        self._progress.update(self._task, phase=_label(name, rollout_id, ""), phase_started=started)
        stop = threading.Event()
        if not self.live:
            logger.info("%s: started", label)
            self._open.append(label)
            beat = (label, started, len(self._open), stop)
            threading.Thread(target=self._heartbeat, args=beat, name="phase-heartbeat", daemon=True).start()
        error = ""
        try:
            yield
        except BaseException as e:  # recorded and logged, then re-raised as it is
            error = type(e).__name__
            raise
        finally:
            stop.set()
            if not self.live:
                self._open.pop()
            seconds = self.clock() - started
            self._record(PhaseEvent(kind="end", name=name, rollout_id=rollout_id, seconds=seconds, error=error))
            self._progress.update(self._task, phase=previous[0], phase_started=previous[1])
            if not self.live:
                if error:
                    logger.info("%s: failed after %.1f s: %s", label, seconds, error)
                else:
                    logger.info("%s: done in %.1f s", label, seconds)

    def _record(self, event: PhaseEvent) -> None:
        self.events.append(event)
        if len(self.events) > 2 * EVENTS_KEPT:  # trimmed in chunks: a `del` of the head copies the list
            del self.events[:-EVENTS_KEPT]

    def _heartbeat(self, label: str, started: float, depth: int, stop: threading.Event) -> None:
        """Logs "<phase>: still running after X s" on `heartbeat_delays` until `stop` is set (innermost phase only)."""
        for delay in heartbeat_delays(self.heartbeat_s, max(self.heartbeat_s, HEARTBEAT_MAX_S)):
            if stop.wait(delay):
                return
            if len(self._open) == depth:  # a nested phase running now reports for both
                logger.info("%s: still running after %.0f s", label, self.clock() - started)

    def print(self, line: str) -> None:
        """Prints a line above the live display (or plainly without a terminal), as it is.

        The text is not read as rich markup: brackets in data (`[/tmp/a]`, `[x=1]`) print verbatim instead of
        styling the line or raising `rich.errors.MarkupError`.
        """
        self.console.print(line, markup=False)

    def stop(self) -> None:
        """Stops drawing, leaving the last state on screen."""
        if self._started:
            self._progress.stop()
            self._started = False
