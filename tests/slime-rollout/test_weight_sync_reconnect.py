"""A distributed weight push after a failed one: a fresh broadcast group, the failed one torn down on both ends.

The reference engine runs in its own process (`reference_engine`), so both ends of the gloo group are real.
"""

import asyncio
import threading

import pytest
import torch
from safetensors.torch import load_file
from slime_rollout_fakes import join_weights_group_in_child

from slime_core.config import SlimeArgs
from slime_rollout.engines.client import EngineClient, RolloutClient
from slime_rollout.engines.process import find_free_port
from slime_rollout.engines.transport import EngineError
from slime_rollout.engines.weight_checksum import tensor_checksum
from slime_rollout.weight_sync.updaters import DistributedWeightUpdater, WeightPushError

NAME = "model.norm.weight"


def _cfg():
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "rollout_num_gpus_per_engine": 1})


def _engine_checksum(url: str) -> str:
    async def go():
        engine = EngineClient(url, timeout=60.0)
        try:
            return await engine.request("POST", "/weights_checker", {"action": "checksum"})
        finally:
            await engine.aclose()

    return asyncio.run(go())["ranks"][0]["checksums"][NAME]


def _in_thread(fn, timeout_s=120):
    """Runs `fn()` in a daemon thread: a push waiting on a group that never forms must fail the test, not hang it."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=timeout_s)
    assert not thread.is_alive(), "the push still waits (its broadcast group never formed)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_a_push_after_a_refused_one_runs_on_a_fresh_group_and_the_old_one_is_gone(reference_engine, tiny_qwen3_dir):
    # Was: the refused push dropped its group without destroying it (trainer and engine kept it, its TCP store kept
    # the port), and the next push rejoined under the same name and port: "The specified group name has already
    # been used" / "address already in use" instead of a push.
    url = reference_engine.urls[0]
    first_port = find_free_port(start=29800)
    updater = DistributedWeightUpdater(
        _cfg(), RolloutClient([url]), master_address="127.0.0.1", master_port=first_port, backend="gloo",
        group_name="slime-reconnect",  # its own: c10d names are per process, other tests make "slime-pp_0"
    )  # fmt: skip
    norm = load_file(str(tiny_qwen3_dir / "model.safetensors"))[NAME].float()
    try:
        with pytest.raises(WeightPushError, match="unknown parameter 'nope'") as e:
            # The engine receives the broadcast, then refuses the bucket (400): the group itself is sound.
            _in_thread(lambda: updater.update(iter([[("nope", torch.ones(3))]]), "1"))
        # Was: an EngineError, which the driver's restorer (it handles WeightPushError) let end a fault-tolerant run.
        assert list(e.value.failed) == [url] and isinstance(e.value.__cause__, EngineError)
        # The refusal landed nothing (an HTTP error reply): the engine keeps its label and is left paused.
        assert asyncio.run(RolloutClient([url]).get_weight_versions()) == ["default"]
        first = ("slime-reconnect", first_port)
        assert updater._group is None

        new_norm = norm + 0.25
        _in_thread(lambda: updater.update(iter([[(NAME, new_norm)]]), "2"))
        assert (updater.group_name, updater.master_port) != first  # a fresh name and port
        assert updater.group_name.startswith("slime-reconnect") and updater.master_port != first_port
        assert asyncio.run(RolloutClient([url]).get_weight_versions()) == ["2"]
        assert _engine_checksum(url) == tensor_checksum(new_norm)

        # The refused push's group is gone from the engine: destroying it again finds nothing.
        async def destroy_old():
            engine = EngineClient(url, timeout=30.0)
            try:
                await engine.destroy_weights_update_group(group_name="slime-reconnect")
            finally:
                await engine.aclose()

        # SGLang's reply for a group it does not hold (`ModelRunner.destroy_weights_update_group`).
        with pytest.raises(EngineError, match=r"\(HTTP 400\): .*The group to be destroyed does not exist\."):
            asyncio.run(destroy_old())
        # ... and from this process (c10d would refuse to register the name again).
        assert "slime-reconnect" not in torch.distributed.distributed_c10d._world.pg_names.values()
    finally:
        asyncio.run(updater.adisconnect())
        restore = RolloutClient([url]).broadcast(
            "update_weights_from_disk", model_path=str(tiny_qwen3_dir), weight_version="default"
        )
        asyncio.run(restore)


def test_a_connect_after_a_refused_one_rendezvouses_on_a_fresh_port_and_name(threaded_http_server):
    # Was: the refused connect's rendezvous thread is abandoned with its TCP store still listening on the port, and
    # the retry bound that port again ("address already in use"); the engine's teardown was never asked for.
    from aiohttp import web

    inits, destroyed, children = [], [], []

    def join(body):
        children.append(join_weights_group_in_child(body))

    async def handler(request):
        body = await request.json() if request.can_read_body else {}
        if request.path == "/init_weights_update_group":
            inits.append(body)
            if len(inits) == 1:
                message = "Failed to initialize custom process group: refused by the test engine."
                return web.json_response({"success": False, "message": message}, status=400)
            await asyncio.to_thread(join, body)
        if request.path == "/destroy_weights_update_group":
            destroyed.append(body["group_name"])
        return web.json_response({"success": True, "message": "ok"})

    url = threaded_http_server(handler)
    first_port = find_free_port(start=29900)
    updater = DistributedWeightUpdater(
        _cfg(), RolloutClient([url]), master_address="127.0.0.1", master_port=first_port, backend="gloo",
        group_name="slime-refused-init",
    )  # fmt: skip
    try:
        with pytest.raises(EngineError, match="refused by the test engine"):
            _in_thread(lambda: asyncio.run(updater.aconnect()))
        assert destroyed == ["slime-refused-init"]  # the engine is asked to drop whatever it joined
        _in_thread(lambda: asyncio.run(updater.aconnect()))
        assert updater._group is not None
        assert [(b["group_name"], b["master_port"]) for b in inits] == [
            ("slime-refused-init", first_port),
            ("slime-refused-init-1", updater.master_port),
        ]
        assert updater.master_port > first_port
        asyncio.run(updater.adisconnect())
        # The updater that replaces it (the app builds a new one per engine set) asks for the same name: a new one.
        replacement = DistributedWeightUpdater(
            _cfg(), RolloutClient([url]), master_address="127.0.0.1", master_port=find_free_port(start=29950),
            backend="gloo", group_name="slime-refused-init",
        )  # fmt: skip
        _in_thread(lambda: asyncio.run(replacement.aconnect()))
        assert inits[-1]["group_name"] == replacement.group_name == "slime-refused-init-2"
        asyncio.run(replacement.adisconnect())
    finally:
        asyncio.run(updater.adisconnect())
        for child in children:
            child.kill()
            child.wait()
    assert destroyed == ["slime-refused-init", "slime-refused-init-1", "slime-refused-init-2"]
