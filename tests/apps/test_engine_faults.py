"""The rollout manager's side of fault tolerance: the restore handshake of a restarted engine with the driver."""

import asyncio
import types

import pytest

from slime_app.engine_faults import EngineSupervisor


class _Monitor:
    def __init__(self):
        self.recovers = []

    def recover(self, index, reason):
        self.recovers.append((index, reason))


def _supervisor(urls):
    supervisor = EngineSupervisor.__new__(EngineSupervisor)  # no health monitor thread, no engines
    supervisor._awaiting, supervisor.monitor = {}, _Monitor()
    slots = [types.SimpleNamespace(index=i, url=u) for i, u in enumerate(urls)]
    supervisor.client = types.SimpleNamespace(pool=types.SimpleNamespace(slots=slots))
    return supervisor


def test_a_restarted_engine_whose_restore_push_failed_ends_its_recovery_failed():
    # Was: the recovery awaited an event only a successful push set; a failed restore push asked the monitor to
    # recover the engine, a no-op while that recovery still waited, so the engine stayed "awaiting weights" for the
    # rest of the run and the driver pushed the whole model to it (a collective walk on every trainer rank) again at
    # every poll, each failing.
    async def go():
        supervisor = _supervisor(["http://e0", "http://e1"])
        restores = [asyncio.ensure_future(supervisor._restore(i, u)) for i, u in ((0, "http://e0"), (1, "http://e1"))]
        await asyncio.sleep(0)
        assert await supervisor._list() == ["http://e0", "http://e1"]
        await supervisor._fail(["http://e1"], "weight push failed: e1 refused")
        await supervisor._release(["http://e0"])
        await asyncio.wait(restores, timeout=5)
        assert restores[0].result() is None  # restored: serves
        with pytest.raises(RuntimeError, match="the current weights could not be pushed to it: weight push failed"):
            restores[1].result()  # HealthMonitor._recover marks it FAILED: the next check restarts it
        assert await supervisor._list() == []  # the driver does not push to it again
        assert supervisor.monitor.recovers == [(1, "weight push failed: e1 refused")]

    asyncio.run(go())
