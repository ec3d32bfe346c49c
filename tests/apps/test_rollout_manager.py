"""The rollout manager starts its own engines, or uses external ones (`--rollout-external-engine-addrs`)."""

import pathlib
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "apps" / "train"))

import slime_rollout.engines  # noqa: E402
from slime_app.rollout_manager import expose_single_engine_as_router, launch_or_attach_engines  # noqa: E402
from slime_core.config import PluginArgs  # noqa: E402
from slime_core.config import parse_args as _parse_args  # noqa: E402

BASE = ["--train-backend", "fsdp", "--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--num-rollout", "1",
        "--rollout-batch-size", "1", "--rollout-max-response-len", "8", "--rollout-num-gpus", "2"]  # fmt: skip


def parse_args(argv):
    return PluginArgs.from_config(_parse_args(argv))


@pytest.fixture
def launches(monkeypatch):
    calls = []

    def fake_launch(args, **kw):
        calls.append(kw)
        return types.SimpleNamespace(urls=["http://127.0.0.1:15000", "http://127.0.0.1:15002"], router_url=None)

    monkeypatch.setattr(slime_rollout.engines, "launch_engines", fake_launch)
    return calls


def test_external_engine_addrs_are_used_and_nothing_is_started(launches):
    args = parse_args([*BASE, "--rollout-external-engine-addrs", "10.0.0.5:30000", "10.0.0.6:30000"])
    assert launch_or_attach_engines(args, []) is None
    assert launches == []
    assert args.rollout_engine_urls == ["http://10.0.0.5:30000", "http://10.0.0.6:30000"]


def test_without_external_engines_the_manager_launches_them(launches, tmp_path):
    args = parse_args([*BASE, "--output-dir", str(tmp_path)])
    engines = launch_or_attach_engines(args, [4, 5])
    assert engines is not None and len(launches) == 1
    assert launches[0]["num_engines"] == 2 and launches[0]["base_gpu_ids"] == [4, 5]
    assert args.rollout_engine_urls == ["http://127.0.0.1:15000", "http://127.0.0.1:15002"]


def test_one_engine_without_router_is_the_router_address_original_plugins_use():
    args = parse_args([*BASE, "--rollout-engine-urls", "http://10.0.0.5:30000"])
    expose_single_engine_as_router(args)
    assert f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate" == "http://10.0.0.5:30000/generate"


def test_router_fields_untouched_with_a_router_or_several_engines(caplog):
    args = parse_args([*BASE, "--rollout-engine-urls", "http://a:1", "http://b:2",
                       "--custom-generate-function-path", "m.gen"])  # fmt: skip
    with caplog.at_level("WARNING"):
        expose_single_engine_as_router(args)
    assert args.sglang_router_ip is None and args.sglang_router_port is None
    assert "2 engines and no router" in caplog.text
    args = parse_args(
        [*BASE, "--rollout-engine-urls", "http://a:1", "--sglang-router-ip", "r", "--sglang-router-port", "9"]
    )
    expose_single_engine_as_router(args)
    assert (args.sglang_router_ip, args.sglang_router_port) == ("r", 9)
