"""The reference engine's app as assembled from its route groups (`engines/reference/routes/`)."""

import pytest

pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi (absent on the GPU trainer path)")
from fastapi.testclient import TestClient  # noqa: E402

from slime_rollout.engines.reference.model import ReferenceModel  # noqa: E402
from slime_rollout.engines.reference.server import build_app  # noqa: E402

# SGLang 0.5.16's routes the engine serves (tests/fixtures/sglang-wire/README.md), with their methods.
SGLANG_ROUTES = {
    "/generate": {"POST"}, "/abort_request": {"POST"}, "/flush_cache": {"GET", "POST"},
    "/pause_generation": {"POST"}, "/continue_generation": {"POST"},
    "/release_memory_occupation": {"GET", "POST"}, "/resume_memory_occupation": {"GET", "POST"},
    "/update_weights_from_disk": {"POST"}, "/update_weights_from_tensor": {"POST"},
    "/init_weights_update_group": {"POST"}, "/update_weights_from_distributed": {"POST"},
    "/destroy_weights_update_group": {"POST"}, "/get_weight_version": {"GET"}, "/update_weight_version": {"POST"},
    "/get_weights_by_name": {"GET", "POST"}, "/weights_checker": {"GET", "POST"},
    "/load_lora_adapter": {"POST"}, "/unload_lora_adapter": {"POST"},
    "/health": {"GET"}, "/health_generate": {"GET"}, "/v1/loads": {"GET"},
    "/model_info": {"GET"}, "/get_model_info": {"GET"}, "/server_info": {"GET"}, "/get_server_info": {"GET"},
}  # fmt: skip


def test_every_route_group_is_mounted_with_sglangs_methods(tiny_qwen3_dir):
    app = build_app(ReferenceModel(str(tiny_qwen3_dir)), max_running_requests=2, random_seed=0, server_args={})
    served = {path: {m.upper() for m in methods} for path, methods in app.openapi()["paths"].items()}
    # Plus one route of slime's own: `--update-weight-mode delta` over tensors (SGLang has no such endpoint).
    assert served == {**SGLANG_ROUTES, "/update_weights_from_delta": {"POST"}}


def test_two_apps_keep_their_own_state(tiny_qwen3_dir):
    # The routers are module-level objects shared by every app: each route must read its own app's engine.
    model = ReferenceModel(str(tiny_qwen3_dir))
    first = build_app(model, max_running_requests=2, random_seed=0, server_args={"weight_version": "a"})
    second = build_app(model, max_running_requests=3, random_seed=0, server_args={"weight_version": "b"})
    with TestClient(first) as one, TestClient(second) as two:
        assert one.post("/update_weight_version", json={"new_version": "a2"}).json()["new_version"] == "a2"
        assert one.get("/model_info").json()["weight_version"] == "a2"
        assert two.get("/model_info").json()["weight_version"] == "b"
        assert two.get("/server_info").json()["weight_version"] == "b"
        assert [one.get("/v1/loads").json()["loads"][0]["max_running_requests"],
                two.get("/v1/loads").json()["loads"][0]["max_running_requests"]] == [2, 3]  # fmt: skip
        assert one.post("/pause_generation", json={}).status_code == 200
        assert two.get("/server_info").json()["internal_states"][0]["paused"] is False
        assert one.get("/server_info").json()["internal_states"][0]["paused"] is True


def test_lora_routes_refuse_a_malformed_body_as_sglang_does(tiny_qwen3_dir):
    # SGLang 0.5.16 declares `obj: Annotated[UnloadLoRAAdapterReqInput, Body()]` (lora_name required) and answers a
    # refused body with HTTP 400 and its ErrorResponse, whose message lists the errors (`test_reference_malformed`
    # holds every route to an independent copy of that). Issue 27: a body without `lora_name` was an HTTP 500.
    app = build_app(ReferenceModel(str(tiny_qwen3_dir)), max_running_requests=2, random_seed=0, server_args={})
    missing = "'type': 'missing'"
    string = "'type': 'string_type'"
    with TestClient(app, raise_server_exceptions=False) as client:
        for route, body, field, kind in [
            ("/unload_lora_adapter", {}, "lora_name", missing),
            ("/unload_lora_adapter", {"lora_id": "x"}, "lora_name", missing),
            ("/load_lora_adapter", {"lora_name": "a"}, "lora_path", missing),
            ("/load_lora_adapter", {"lora_path": "/a"}, "lora_name", missing),
            ("/load_lora_adapter", {"lora_name": 7, "lora_path": "/a"}, "lora_name", string),
            ("/unload_lora_adapter", {"lora_name": ["a"]}, "lora_name", string),
        ]:  # fmt: skip
            reply = client.post(route, json=body)
            assert reply.status_code == 400, (route, body, reply.text)
            sglang_name = {"/load_lora_adapter": "LoadLoRAAdapterReqInput"}.get(route, "UnloadLoRAAdapterReqInput")
            loc = f"'loc': ('body', 'function-after[build_struct(), {sglang_name}]', '{field}')"
            message = reply.json()["message"]
            assert f"{{{kind}, {loc}" in message and reply.json()["type"] == "Bad Request", (route, body, message)
        empty = client.post("/unload_lora_adapter")
        assert empty.status_code == 400 and "'loc': ('body',)" in empty.json()["message"]
        # A well-formed request for an adapter that is not loaded: SGLang's 400 LoRAUpdateOutput, its exact text.
        gone = client.post("/unload_lora_adapter", json={"lora_name": "wire-lora"})
        assert gone.status_code == 400
        assert gone.json() == {
            "success": False, "error_message": "LoRA with name wire-lora does not exist. Loaded LoRAs: odict_keys([])",
            "http_worker_ipc": None, "rid": None, "loaded_adapters": None,
        }  # fmt: skip
        absent = client.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": "/nonexistent/adapter"})
        assert absent.status_code == 400 and absent.json()["success"] is False
        assert absent.json()["loaded_adapters"] is None


def test_health_generate_while_paused_waits_for_the_resume_then_answers_503_as_sglang(tiny_qwen3_dir, monkeypatch):
    # SGLang 0.5.16 holds the probe's one-token request while paused and answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT
    # (20 s) without output. Was: the reference engine answered 200 at once, so a CPU run never met what a GPU run
    # does when the health monitor probes an engine paused for a weight push.
    import threading
    import time

    monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", "0.5")
    app = build_app(ReferenceModel(str(tiny_qwen3_dir)), max_running_requests=2, random_seed=0, server_args={})
    with TestClient(app) as client:
        assert client.get("/health_generate").status_code == 200
        assert client.post("/pause_generation", json={"mode": "abort"}).status_code == 200
        start = time.monotonic()
        assert client.get("/health_generate").status_code == 503
        assert time.monotonic() - start >= 0.5
        resume = threading.Timer(0.2, lambda: client.post("/continue_generation", json={}))
        resume.start()
        assert client.get("/health_generate").status_code == 200  # resumed within the window: the probe generates
        resume.join()


def test_health_generate_of_a_wedged_engine_answers_503_as_sglang(tiny_qwen3_dir, monkeypatch):
    """SGLang answers 200 only when output arrives after the probe began; the reference engine answered 200 whenever
    requests were running, so an engine whose model thread was stuck (HTTP alive) passed every health check, and an
    idle one with its model held waited on the probe's own generation forever."""
    import threading

    model = ReferenceModel(str(tiny_qwen3_dir))
    app = build_app(model, max_running_requests=2, random_seed=0, server_args={})
    stuck, release = threading.Event(), threading.Event()
    decode = model._decode

    def wedged_decode(batch):
        stuck.set()
        release.wait(30)  # the model thread hangs mid-generation
        return decode(batch)

    def probe(client, timeout_s: float) -> int:
        # The engine reads its deadline per probe: a short one where 503 is expected, a long one where a healthy
        # engine's own generation must fit (0.5 s did not on a loaded CI machine).
        monkeypatch.setenv("SGLANG_HEALTH_CHECK_TIMEOUT", str(timeout_s))
        return client.get("/health_generate").status_code

    with TestClient(app) as client:
        assert probe(client, 30) == 200
        monkeypatch.setattr(model, "_decode", wedged_decode)
        body = {"input_ids": [785, 4226, 374], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
        worker = threading.Thread(target=lambda: client.post("/generate", json=body))
        worker.start()
        try:
            assert stuck.wait(30)
            assert app.state.engine.scheduler.num_running == 1
            assert probe(client, 0.5) == 503  # running, but no step since the probe began
        finally:
            release.set()
        worker.join(30)
        assert probe(client, 30) == 200
        with model.lock:  # idle, but the model is held (a stuck weight load): the probe's generation cannot run
            assert probe(client, 0.5) == 503
        assert probe(client, 30) == 200
