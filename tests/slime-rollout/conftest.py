"""Fixtures for slime-rollout tests: a tiny random-weight Qwen3 and a reference engine serving it.

`tiny_qwen3_dir` is a session-wide HF directory (2 layers, hidden 64, real Qwen3 tokenizer and vocab);
`reference_engine` is one CPU reference engine subprocess on a free port, shared by the session.

`_rollout_fakes.py` (the rollout loop's test doubles) is importable as module `slime_rollout_fakes`, and
`_multi_turn_fakes.py` (the multi-turn tests' scripted engine) as `slime_multi_turn_fakes`, `_data_source_helpers.py`
as `slime_data_source_helpers`, `_preflight_helpers.py` as `slime_preflight_helpers`: registered
here, before any test module is imported (pytest runs with `--import-mode=importlib`, so this folder is not on
`sys.path`); its functions are also plugin paths the rollout imports by name.
"""

import importlib.util
import os
import pathlib
import random
import shutil
import sys
import tempfile

import pytest

from slime_core.config import SlimeArgs

for _name, _file in (
    ("slime_rollout_fakes", "_rollout_fakes.py"),
    ("slime_multi_turn_fakes", "_multi_turn_fakes.py"),
    ("slime_data_source_helpers", "_data_source_helpers.py"),
    ("slime_preflight_helpers", "_preflight_helpers.py"),
):
    _spec = importlib.util.spec_from_file_location(_name, pathlib.Path(__file__).with_name(_file))
    sys.modules[_name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_name])

# A random port range per session: concurrent test sessions would otherwise race for 15000.
ENGINE_BASE_PORT = random.Random(os.getpid()).randrange(20000, 40000, 100)


@pytest.fixture(scope="session")
def private_tmp():
    """A session temp dir outside pytest's basetemp, which concurrent pytest sessions may prune."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="slime-rollout-test-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(private_tmp, make_tiny_qwen3) -> pathlib.Path:
    """HF directory of a tiny random Qwen3 (fp32, seed 0) with the Qwen3 tokenizer files."""
    return make_tiny_qwen3(private_tmp / "tiny-qwen3")


def _reference_args(model_dir, **kw) -> SlimeArgs:
    fields = dict(
        rollout_batch_size=1,
        num_rollout=1,
        rollout_engine="reference",
        hf_checkpoint=str(model_dir),
        seed=1234,
        sglang_args={"num_threads": "1"},
    )
    fields.update(kw)
    return SlimeArgs.from_dict(fields)


@pytest.fixture(scope="session")
def reference_args():
    """Factory: `reference_args(model_dir, **overrides)` -> a validated run config for reference engines."""
    return _reference_args


@pytest.fixture(scope="session")
def engine_base_port() -> int:
    """`launch_engines(..., base_port=)` of this session's engines."""
    return ENGINE_BASE_PORT


@pytest.fixture(scope="session")
def reference_engine(tiny_qwen3_dir, private_tmp):
    """One running reference engine (an `EngineGroup`); shut down at the end of the session."""
    from slime_rollout.engines.launch import launch_engines

    group = launch_engines(
        _reference_args(tiny_qwen3_dir),
        num_engines=1,
        gpus_per_engine=1,
        startup_timeout_s=300,
        log_dir=private_tmp / "engine-logs",
        base_port=ENGINE_BASE_PORT,
    )
    yield group
    group.shutdown()


async def _serve(handler, port: int = 0):
    """Serves `async handler(request) -> aiohttp.web.Response` for every path on 127.0.0.1."""
    from aiohttp import web

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    # Cleanup cancels handlers still running after 1 s (aiohttp waits 60 s by default): the hung-engine
    # handlers of the timeout tests sleep far longer than their requests wait.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner


@pytest.fixture
async def http_server():
    """Factory: `await http_server(handler, port=0)` -> base URL of a real aiohttp server on this loop."""
    runners = []

    async def start(handler, port: int = 0) -> str:
        url, runner = await _serve(handler, port)
        runners.append(runner)
        return url

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def threaded_http_server():
    """Factory: `threaded_http_server(handler)` -> base URL of a server on its own loop and thread.

    For synchronous tests whose clients run on several event loops (each `asyncio.run`).
    """
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners = []

    def start(handler) -> str:
        url, runner = asyncio.run_coroutine_threadsafe(_serve(handler), loop).result(timeout=30)
        runners.append(runner)
        return url

    yield start
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    loop.close()


@pytest.fixture
def use_client(monkeypatch):
    """`use_client(client) -> client`: the default generate function talks to `client` (e.g. `FakeClient`)."""
    from slime_rollout.generation import generate as generate_mod

    def install(client):
        monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
        return client

    return install


@pytest.fixture
def tok(qwen3_tokenizer_dir):
    """The real Qwen3 tokenizer (`get_tokenizer` of `qwen3_tokenizer_dir`)."""
    from slime_rollout.data.source import get_tokenizer

    return get_tokenizer(str(qwen3_tokenizer_dir))
