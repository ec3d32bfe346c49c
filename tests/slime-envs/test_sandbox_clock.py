"""The sandbox's two clocks: its start-up (bubblewrap, the runner, the preload imports) is bounded by
`STARTUP_TIMEOUT_S`; the code's `timeout_s` starts when the code does. Counted in `timeout_s`, a start-up slowed
by a loaded host ate a short limit and `print(...)` came back "timed out" (the episode test with `timeout_s=2`
failed so under CI load). The start-up is slowed here on purpose, by delaying the sandbox's release."""

import asyncio
import logging

from slime_envs import sandbox
from slime_envs.sandbox import SandboxConfig, run_python


def _slow_start(monkeypatch, delay_s: float) -> None:
    release = sandbox._release

    async def slow_release(*args, **kwargs):
        await asyncio.sleep(delay_s)  # the host is busy before the runner even starts
        return await release(*args, **kwargs)

    monkeypatch.setattr(sandbox, "_release", slow_release)


async def test_a_slow_start_up_does_not_count_against_the_codes_wall_clock(monkeypatch):
    _slow_start(monkeypatch, 3.5)  # past the code's 3 s: the whole run took longer than `timeout_s`
    r = await run_python("print(6 * 7)", SandboxConfig(timeout_s=3.0))
    assert not r.timed_out and r.ok and r.stdout == "42\n", r.stderr


async def test_the_codes_wall_clock_still_stops_it_after_a_slow_start_up(monkeypatch):
    _slow_start(monkeypatch, 1.5)
    r = await run_python("print('started', flush=True)\nwhile True:\n    pass", SandboxConfig(timeout_s=1.0))
    assert r.timed_out and r.stdout == "started\n"  # it ran, then the code's own clock ran out


async def test_a_start_up_past_its_bound_is_killed_and_reported_timed_out(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "STARTUP_TIMEOUT_S", 0.5)
    _slow_start(monkeypatch, 30.0)
    with caplog.at_level(logging.WARNING, logger="slime_envs.sandbox"):
        r = await run_python("print(1)", SandboxConfig(timeout_s=60.0))
    assert r.timed_out and r.stdout == ""
    assert "a sandbox did not start within 0.5 s (an overloaded host?); killed" in caplog.text
