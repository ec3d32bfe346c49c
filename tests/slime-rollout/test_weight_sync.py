"""Weight updaters against the reference engine, and their building blocks."""

import asyncio
import json

import pytest
import torch
from aiohttp import web
from safetensors.torch import load_file
from slime_rollout_fakes import join_weights_group_in_child
from transformers import AutoModelForCausalLM

from slime_core.config import SlimeArgs
from slime_rollout.engines.client import RolloutClient
from slime_rollout.engines.process import find_free_port
from slime_rollout.weight_sync.updaters import (
    DiskWeightUpdater,
    DistributedWeightUpdater,
    TensorWeightUpdater,
    deserialize_named_tensors,
    write_hf_checkpoint,
)

LOGPROB_ATOL = 1e-5


def _cfg(**fields):
    """The trainer's run config, as weight updaters get it."""
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})


def buckets_of(state, size=5):
    items = list(state.items())
    return iter([items[i : i + size] for i in range(0, len(items), size)])


# ------------------------------------------------------------------------------------ building blocks


def test_write_hf_checkpoint_is_atomic_and_loadable(tmp_path, tiny_qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    state = {k: v + 0.5 for k, v in model.state_dict().items()}
    out = write_hf_checkpoint(buckets_of(state), tmp_path / "weight_v000001", assets_from=tiny_qwen3_dir)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state)
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["weight_v000001"]  # no temp dir left behind
    loaded = {}
    for shard in sorted(set(index["weight_map"].values())):
        loaded.update(load_file(str(out / shard)))
    for k, v in state.items():
        assert torch.equal(loaded[k], v), k
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert torch.equal(reloaded["model.norm.weight"], state["model.norm.weight"])


def test_write_hf_checkpoint_duplicate_name_leaves_nothing(tmp_path):
    t = torch.zeros(2)
    with pytest.raises(ValueError, match="appears twice"):
        write_hf_checkpoint(iter([[("a", t)], [("a", t)]]), tmp_path / "v")
    assert list(tmp_path.iterdir()) == []


def test_write_hf_checkpoint_never_replaces_a_folder_slime_did_not_write(tmp_path):
    from slime_core.dir_swap import ReplaceRefused

    user = tmp_path / "weight_v000001"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(ReplaceRefused, match=f"--update-weight-disk-dir {user}: is a non-empty folder"):
        write_hf_checkpoint(iter([[("a", torch.zeros(2))]]), user)
    assert [p.name for p in tmp_path.iterdir()] == ["weight_v000001"] and (user / "notes.txt").read_text() == "mine"
    out = write_hf_checkpoint(iter([[("a", torch.zeros(2))]]), tmp_path / "weight_v000002")
    write_hf_checkpoint(iter([[("a", torch.ones(2))]]), out)  # its own export is replaced
    assert load_file(str(out / "model-00001.safetensors"))["a"].tolist() == [1.0, 1.0]


async def test_update_sequence_is_pause_flush_send_fence_check_continue(tmp_path, http_server):
    calls = []

    def engine(name):
        async def handler(request):
            calls.append((name, request.path))
            if request.path == "/model_info":
                return web.json_response({"weight_version": "7"})
            if request.path == "/update_weights_from_disk":
                assert (await request.json())["weight_version"] == "7"  # every bucket names its push's version
                return web.json_response({"success": True, "message": "ok"})
            if request.path == "/update_weight_version":
                assert await request.json() == {"new_version": "7", "abort_all_requests": False}
            return web.Response()

        return handler

    client = RolloutClient([await http_server(engine("e0")), await http_server(engine("e1"))])
    args = _cfg(update_weight_disk_dir=str(tmp_path), hf_checkpoint=None)
    await DiskWeightUpdater(args, client).aupdate(iter([[("w", torch.ones(2))]]), "7")
    for name in ("e0", "e1"):
        assert [p for h, p in calls if h == name] == [
            "/pause_generation",
            "/flush_cache",
            "/update_weights_from_disk",
            "/update_weight_version",
            "/model_info",
            "/continue_generation",
        ]
    assert not (tmp_path / "weight_v000007").exists()  # deleted unless --update-weight-disk-keep-files


async def test_version_mismatch_is_a_push_failure_naming_the_engine_left_paused(tmp_path, http_server):
    # Was a RuntimeError (the restorer handles WeightPushError only) after continuing the engine that lacks version 3.
    from slime_rollout.weight_sync.updaters import WeightPushError

    calls = []

    async def handler(request):
        calls.append(request.path)
        if request.path == "/model_info":
            return web.json_response({"weight_version": "old"})
        return web.json_response({"success": True})

    url = await http_server(handler)
    client = RolloutClient([url])
    args = _cfg(update_weight_disk_dir=str(tmp_path), hf_checkpoint=None)
    with pytest.raises(WeightPushError) as e:
        await DiskWeightUpdater(args, client).aupdate(iter([[("w", torch.ones(1))]]), "3")
    assert e.value.failed == {url: "reports weight version 'old' after the push"}
    assert "/continue_generation" not in calls and calls[-1] == "/update_weight_version"  # relabelled incomplete


def test_disk_updater_requires_dir():
    with pytest.raises(ValueError, match="--update-weight-disk-dir"):
        # Validation fills the directory under --output-dir for disk sync; a copy without it is what is tested.
        DiskWeightUpdater(_cfg().model_copy(update={"update_weight_disk_dir": None}), RolloutClient(["http://x:1"]))


# ------------------------------------------------------------------------------ against the engine


@pytest.fixture(scope="module")
def hf_state(tiny_qwen3_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    return model, {k: v.clone() for k, v in model.state_dict().items()}


def perturbed(state, seed):
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.2 * torch.randn(v.shape, generator=g) for k, v in state.items()}


PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]


def engine_logprobs(url):
    async def go():
        client = RolloutClient([url])
        out = await client.generate(
            {
                "input_ids": PROMPT,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True},
                "return_logprob": True,
            }
        )
        await client.aclose()
        return out

    out = asyncio.run(go())
    return out["output_ids"], torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])


def expected_logprobs(model, state, output_ids):
    model.load_state_dict(state)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + output_ids])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits, -1)[torch.arange(len(output_ids)), torch.tensor(output_ids)]


def versions(url):
    return asyncio.run(RolloutClient([url]).get_weight_versions())


def check_engine_holds(url, model, state):
    ids, got = engine_logprobs(url)
    torch.testing.assert_close(got, expected_logprobs(model, state, ids), atol=LOGPROB_ATOL, rtol=0)
    return ids


def test_disk_tensor_and_distributed_updates_change_outputs(reference_engine, hf_state, tmp_path, tiny_qwen3_dir):
    url = reference_engine.urls[0]
    model, original = hf_state
    args = _cfg(update_weight_disk_dir=str(tmp_path), hf_checkpoint=str(tiny_qwen3_dir), rollout_num_gpus_per_engine=1)
    client = RolloutClient([url])
    try:
        before = check_engine_holds(url, model, original)

        new = perturbed(original, 1)
        DiskWeightUpdater(args, client).update(buckets_of(new), "1")
        assert versions(url) == ["1"]
        assert check_engine_holds(url, model, new) != before
        assert list(tmp_path.iterdir()) == []

        TensorWeightUpdater(args, client, load_format=None).update(buckets_of(original), "2")
        assert versions(url) == ["2"]
        assert check_engine_holds(url, model, original) == before

        new3 = perturbed(original, 3)
        dist_updater = DistributedWeightUpdater(
            args, client, master_address="127.0.0.1", master_port=find_free_port(start=29600), backend="gloo"
        )
        dist_updater.update(buckets_of(new3), "3")
        assert versions(url) == ["3"]
        check_engine_holds(url, model, new3)
        dist_updater.update(buckets_of(original, size=100), "4")  # the group is reused
        assert check_engine_holds(url, model, original) == before
        asyncio.run(dist_updater.adisconnect())
    finally:
        restore = RolloutClient([url]).broadcast(
            "update_weights_from_disk", model_path=str(tiny_qwen3_dir), weight_version="default"
        )
        asyncio.run(restore)


def test_bad_tensor_name_is_a_clear_error_and_the_engine_keeps_its_version(reference_engine, hf_state):
    from slime_rollout.weight_sync.updaters import WeightPushError

    url = reference_engine.urls[0]
    client = RolloutClient([url])
    before = asyncio.run(client.get_weight_versions())
    updater = TensorWeightUpdater(_cfg(), client, load_format=None)
    with pytest.raises(WeightPushError, match="unknown parameter 'nope'") as e:
        updater.update(iter([[("nope", torch.zeros(1))]]), "bad")
    assert list(e.value.failed) == [url]
    # A failed push never relabels the engine; it stays paused for the caller to restart (or resume).
    assert asyncio.run(client.get_weight_versions()) == before
    asyncio.run(client.broadcast("continue_generation"))
    ids, _ = engine_logprobs(url)
    assert len(ids) == 4


def _versioned_engine(log, name, *, delay_s=0.0, fail_on_bucket=None):
    """A fake engine keeping a weight version the way SGLang does: set by a call's non-null `weight_version` or
    by /update_weight_version. `log` gets (engine, event) in arrival order; buckets are tagged by their tensor name.
    """
    state = {"version": "0", "buckets": 0}

    async def handler(request):
        path = request.path
        body = await request.json() if request.method == "POST" and request.can_read_body else {}
        if path == "/model_info":
            return web.json_response({"weight_version": state["version"]})
        if path == "/update_weights_from_tensor":
            state["buckets"] += 1
            if fail_on_bucket == state["buckets"]:
                return web.json_response({"success": False, "message": "out of memory"}, status=500)
            await asyncio.sleep(delay_s)
            tag = deserialize_named_tensors(body["serialized_named_tensors"][0], body["load_format"])[0][0]
            log.append((name, f"bucket {tag}", state["version"]))
            if body.get("weight_version") is not None:
                state["version"] = body["weight_version"]
            return web.json_response({"success": True})
        if path == "/update_weight_version":
            state["version"] = body["new_version"]
        log.append((name, path, state["version"]))
        return web.json_response({"success": True})

    return handler


def _tagged_buckets(tag, n):
    return iter([[(f"{tag}{i}", torch.full((2,), float(i)))] for i in range(n)])


async def test_overlapping_pushes_to_one_engine_are_serialized_and_every_bucket_carries_its_version(http_server):
    log = []
    url = await http_server(_versioned_engine(log, "e0", delay_s=0.05))
    cfg = _cfg()

    def push(tag, version):
        # Each push has its own client and updater, as a restore and a regular sync would.
        TensorWeightUpdater(cfg, RolloutClient([url]), load_format=None).update(_tagged_buckets(tag, 4), version)

    await asyncio.gather(asyncio.to_thread(push, "a", "1"), asyncio.to_thread(push, "b", "2"))
    buckets = [(event, version) for _, event, version in log if event.startswith("bucket")]
    tags = "".join(event[-2] for event, _ in buckets)
    assert tags in ("aaaabbbb", "bbbbaaaa"), f"pushes interleaved on the engine: {tags}"
    first, second = ("1", "2") if tags[0] == "a" else ("2", "1")
    # The version the engine reports before each bucket lands: SGLang takes each bucket's weight_version.
    assert [v for _, v in buckets] == ["0"] + [first] * 4 + [second] * 3
    events = [event for _, event, _ in log]
    assert events.count("/pause_generation") == 2 and events[-1] == "/continue_generation"
    final = await RolloutClient([url]).get_weight_versions()
    assert final == [second]


async def test_an_engine_failing_mid_push_is_dropped_and_named_and_the_others_complete(http_server):
    from slime_rollout.weight_sync.updaters import WeightPushError

    log = []
    good = await http_server(_versioned_engine(log, "good"))
    bad = await http_server(_versioned_engine(log, "bad", fail_on_bucket=2))
    updater = TensorWeightUpdater(_cfg(), RolloutClient([good, bad]), load_format=None)
    with pytest.raises(WeightPushError) as e:
        await updater.aupdate(_tagged_buckets("w", 3), "5")
    assert list(e.value.failed) == [bad] and "out of memory" in e.value.failed[bad]
    import pickle

    assert pickle.loads(pickle.dumps(e.value)).failed == e.value.failed  # crosses Ray as itself
    assert [ev for n, ev, _ in log if n == "good"] == [
        "/pause_generation", "/flush_cache", "bucket w0", "bucket w1", "bucket w2", "/update_weight_version",
        "/continue_generation",
    ]  # fmt: skip
    # The failed engine got bucket 0 only (which set its version to "5", as SGLang does), was left paused (it is to
    # be restarted) and relabelled: it never claims version 5 with one bucket of it.
    assert [ev for n, ev, _ in log if n == "bad"] == [
        "/pause_generation", "/flush_cache", "bucket w0", "/update_weight_version",
    ]  # fmt: skip
    assert await RolloutClient([good, bad]).get_weight_versions() == ["5", "5-incomplete"]


def test_interleaved_pushes_from_two_writers_are_refused_by_the_reference_engine(reference_engine, hf_state):
    """Issue 27 #15: two processes pushing to one engine (no shared lock) interleave their buckets; the engine
    refuses the second push's bucket (and a whole-model load of its version) until the first push's fence."""
    from slime_rollout.engines.client import EngineClient
    from slime_rollout.engines.transport import EngineError
    from slime_rollout.engines.wire import serialize_named_tensors

    url = reference_engine.urls[0]
    engine = EngineClient(url)
    name, tensor = next(iter(hf_state[1].items()))
    torch.multiprocessing.set_sharing_strategy("file_system")  # as TensorWeightUpdater does (test order-free)

    async def bucket(version):
        payload = serialize_named_tensors([(name, tensor.clone())])
        return await engine.update_weights_from_tensor([payload], weight_version=version)

    async def interleave():
        before = await engine.get_weight_version()
        assert (await bucket("a1"))["success"] is True  # writer A's first bucket
        with pytest.raises(
            EngineError,
            match=r"HTTP 400.*refused a bucket of weight_version 'b1'.*1 bucket\(s\) of "
            r"weight_version 'a1'.*two weight pushes are interleaved",
        ):
            await bucket("b1")  # writer B's first bucket, before A's fence
        assert await engine.get_weight_version() == "a1"  # SGLang's rule: the last accepted bucket's version
        with pytest.raises(EngineError, match=r"refused a whole-model load of weight_version 'b1'.*interleaved"):
            await engine.update_weights_from_disk("/nonexistent", weight_version="b1")  # nor a whole-model load
        # Issue 28 #13: an untagged load or bucket mid-push is refused too, and leaves the push open (guarded).
        with pytest.raises(EngineError, match=r"refused a whole-model load without weight_version: 1 bucket"):
            await engine.update_weights_from_disk("/nonexistent")
        with pytest.raises(EngineError, match=r"refused a bucket without weight_version: 1 bucket"):
            await bucket(None)
        with pytest.raises(EngineError, match=r"refused a bucket of weight_version 'b1'"):
            await bucket("b1")
        assert (await bucket("a1"))["success"] is True  # A goes on and fences
        await engine.update_weight_version("a1")
        assert (await bucket("b1"))["success"] is True  # after A's fence, B's push is a push of its own
        await engine.update_weight_version("b1")
        await engine.update_weight_version(before)
        await engine.aclose()

    asyncio.run(interleave())


def test_push_guard_rule_open_push_takes_only_its_own_version():
    """While a push is open every update must carry its version (untagged ones included); a whole-model load of
    that version closes it; outside a push anything goes, as on SGLang (issue 28 #13)."""
    from slime_rollout.engines.reference.push_guard import PushGuard

    guard, disk, tensor = PushGuard(), "/update_weights_from_disk", "/update_weights_from_tensor"
    assert [guard.refusal(v, e) for v, e in ((None, disk), (None, tensor), ("7", disk))] == [None, None, None]
    guard.landed("3")
    guard.landed("3")
    assert guard.refusal("3", tensor) is None
    # A disk push is one whole-model load: mid-push it comes from another writer, whatever its version.
    assert guard.refusal("3", disk).startswith(f"{disk}: refused a whole-model load of weight_version '3': 2 bucket")
    assert guard.refusal(None, disk) == (
        "/update_weights_from_disk: refused a whole-model load without weight_version: 2 bucket(s) of weight_version "
        "'3' have landed since the last /update_weight_version, so two weight pushes are interleaved (two writers); "
        "end that push with /update_weight_version first"
    )
    assert guard.refusal(None, tensor).startswith(f"{tensor}: refused a bucket without weight_version: 2 bucket(s)")
    assert guard.refusal(4, tensor).startswith(f"{tensor}: refused a bucket of weight_version '4': 2 bucket(s)")
    guard.landed(None)  # never reached through the server (refused above); untracked either way
    assert (guard.version, guard.num_buckets) == ("3", 2)
    guard.close()  # the fence, or an accepted whole-model load
    assert guard.refusal(None, disk) is None and guard.refusal("4", tensor) is None


def test_a_second_writer_of_the_same_version_is_refused_and_a_retried_bucket_is_not(reference_engine, hf_state):
    """Issue 27 #15: two processes pushing the same version (two runs started on the same engines both push "1")
    interleaved unrefused: the engine served a mix of both under "1". A tensor that already landed in the open push
    with other bytes is refused; the same bytes again (a request retried after a lost reply) are not."""
    from slime_rollout.engines.client import EngineClient
    from slime_rollout.engines.transport import EngineError
    from slime_rollout.engines.weight_checksum import tensor_checksum
    from slime_rollout.engines.wire import serialize_named_tensors
    from slime_rollout.weight_sync.check import engine_checksums

    url = reference_engine.urls[0]
    engine = EngineClient(url)
    model, state = hf_state
    names = ["model.embed_tokens.weight", "model.norm.weight"]  # SGLang's checksum names too
    torch.multiprocessing.set_sharing_strategy("file_system")  # as TensorWeightUpdater does (test order-free)

    async def bucket(values, version="s1"):
        payload = serialize_named_tensors([(n, values[n].clone()) for n in names])
        return await engine.update_weights_from_tensor([payload], weight_version=version)

    async def two_writers():
        a, b = perturbed(state, 31), perturbed(state, 32)
        assert (await bucket(a))["success"] is True  # writer A's first bucket
        with pytest.raises(EngineError, match=rf"HTTP 400.*refused a bucket of weight_version 's1': 2 of its tensors "
                           rf"\({names[0]}, {names[1]}\) already landed in this push with other values"):  # fmt: skip
            await bucket(b)  # writer B's first bucket: same version, other bytes
        with pytest.raises(EngineError, match=r"refused a whole-model load of weight_version 's1'.*interleaved"):
            await engine.update_weights_from_disk("/nonexistent", weight_version="s1")
        assert (await bucket(a))["success"] is True  # A's bucket again (a retry): the same bytes
        await engine.update_weight_version("s1")  # A's fence ends its push
        assert (await bucket(b))["success"] is True  # B after the fence: a push of its own
        await engine.update_weight_version("s1")
        held = (await engine_checksums(engine))[0]  # B's bytes, whole
        assert held[names[1]] == tensor_checksum(b[names[1]]) != tensor_checksum(a[names[1]])
        await bucket(state, "restore")
        await engine.update_weight_version("default")
        await engine.aclose()

    asyncio.run(two_writers())


async def test_two_updaters_interleaving_on_a_guarding_engine_fail_the_second_with_the_refusal(http_server):
    # A fake engine that guards as the reference engine does, and two updaters with separate locks (as two
    # processes would have): the second push's first bucket is refused and its push fails naming the engine.
    from slime_rollout.engines.reference.push_guard import PushGuard
    from slime_rollout.weight_sync.updaters import WeightPushError

    guard, first_bucket_landed, release = PushGuard(), asyncio.Event(), asyncio.Event()
    reported = {"version": "0"}

    async def handler(request):
        body = await request.json() if request.can_read_body else {}
        if request.path == "/model_info":
            return web.json_response({"weight_version": reported["version"]})
        if request.path == "/update_weights_from_tensor":
            refusal = guard.refusal(body["weight_version"], request.path)
            if refusal:
                return web.json_response({"success": False, "message": refusal}, status=400)
            guard.landed(body["weight_version"])
            reported["version"] = body["weight_version"]
            first_bucket_landed.set()
            await release.wait()  # writer A stalls after its first bucket
        if request.path == "/update_weight_version":
            guard.close()
            reported["version"] = body["new_version"]
        return web.json_response({"success": True})

    url = await http_server(handler)
    push_a = asyncio.create_task(
        TensorWeightUpdater(_cfg(), RolloutClient([url]), load_format=None).aupdate(_tagged_buckets("a", 2), "1")
    )
    await first_bucket_landed.wait()
    import slime_rollout.weight_sync.push as weight_push

    weight_push._LOCKS.pop(url, None)  # writer B lives in another process: it does not share A's lock
    with pytest.raises(WeightPushError, match=r"refused a bucket of weight_version '2'.*interleaved"):
        await TensorWeightUpdater(_cfg(), RolloutClient([url]), load_format=None).aupdate(_tagged_buckets("b", 2), "2")
    release.set()
    await push_a  # writer A completes: its buckets only, under its version
    assert await RolloutClient([url]).get_weight_versions() == ["1"]


# ------------------------------------------------------------------ a distributed push the engine refuses


def _refusing_engine(refused_route, joined):
    """A fake engine that answers `refused_route` with SGLang's refusal (HTTP 400, success false) and does its part
    of everything else: a child process joins the trainer's gloo group for real (c10d keeps one group of a name
    per process, and the trainer's end is this process), so the trainer's rendezvous completes."""

    def join(body):
        joined.append(join_weights_group_in_child(body))

    async def handler(request):
        body = await request.json() if request.can_read_body else {}
        if request.path == refused_route:
            return web.json_response({"success": False, "message": "refused by the test engine"}, status=400)
        if request.path == "/init_weights_update_group":
            await asyncio.to_thread(join, body)
        if request.path == "/model_info":
            return web.json_response({"weight_version": "0"})
        return web.json_response({"success": True})

    return handler


@pytest.mark.parametrize("route", ["/init_weights_update_group", "/update_weights_from_distributed"])
def test_a_distributed_push_the_engine_refuses_stops_the_sender_with_the_refusal(threaded_http_server, route):
    # Issue 27: the trainer's end of the group (rendezvous, or the bucket's broadcast) waited for the engine's part,
    # which never came, for the group's 10-minute timeout; asyncio.run then joined that thread before raising.
    import threading

    from slime_rollout.engines.transport import EngineError

    joined = []
    url = threaded_http_server(_refusing_engine(route, joined))
    updater = DistributedWeightUpdater(
        _cfg(rollout_num_gpus_per_engine=1), RolloutClient([url]), master_address="127.0.0.1",
        master_port=find_free_port(start=29700), backend="gloo",
        # Its own name: the abandoned group stays registered in this process, where other tests make "slime-pp_0".
        group_name=f"slime-refused{route.replace('/', '-')}",
    )  # fmt: skip
    outcome = {}

    def push():
        try:
            updater.update(iter([[("w", torch.ones(4))]]), "1")
        except Exception as e:  # noqa: BLE001 - checked below
            outcome["error"] = e

    thread = threading.Thread(target=push, daemon=True)
    thread.start()
    thread.join(timeout=120)  # the refusal comes at once (well under 1 s); the hang was the group's 600 s timeout
    for child in joined:
        child.kill()
        child.wait()
    assert not thread.is_alive(), f"the sender still waits after the engine refused {route}"
    # A WeightPushError naming the engine (the driver restarts it under --use-fault-tolerance), caused by the refusal.
    from slime_rollout.weight_sync.updaters import WeightPushError

    assert isinstance(outcome["error"], WeightPushError) and list(outcome["error"].failed) == [url]
    error = outcome["error"].__cause__
    assert isinstance(error, EngineError) and error.endpoint == route and error.status_code == 400
    message = str(error)
    assert message.startswith(f"engine {url}{route} failed (HTTP 400): ") and "refused by the test engine" in message
    assert updater._group is None  # a group with a collective left half-done is never used again
