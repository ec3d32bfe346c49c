"""The reference engine's `/server_info` against SGLang 0.5.16's recorded reply (`fixtures/sglang-wire/text.json`).

`test_sglang_wire.py` compares `/server_info` by top-level type only (SGLang has ~300 server args); here the keys the
two share must have SGLang's types, and the batch sizes must be what the scheduler runs.
"""

import json
import pathlib

import pytest

pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi (absent on the GPU trainer path)")
from fastapi.testclient import TestClient  # noqa: E402

from slime_rollout.engines.reference.__main__ import parse_args  # noqa: E402
from slime_rollout.engines.reference.model import ReferenceModel  # noqa: E402
from slime_rollout.engines.reference.server import build_app  # noqa: E402

_RECORDED = pathlib.Path(__file__).parents[1] / "fixtures" / "sglang-wire" / "text.json"


def _serve(model_dir, *flags):
    """`/server_info` and `/v1/loads` of an app built from `flags` as `__main__.main` builds it, and its scheduler."""
    args = parse_args(["--model-path", str(model_dir), *flags])
    app = build_app(ReferenceModel(args.model_path), max_running_requests=args.max_running_requests,
                    random_seed=args.random_seed, server_args=vars(args))  # fmt: skip
    with TestClient(app) as client:
        return client.get("/server_info").json(), client.get("/v1/loads").json(), app.state.scheduler


@pytest.mark.parametrize(("flags", "batch"), [
    # Issue 27: the engine ran one request at a time but reported max_running_requests 8 (64 without the flag).
    (["--enable-deterministic-inference", "--max-running-requests", "8"], 1),
    (["--enable-deterministic-inference"], 1),
    (["--max-running-requests", "8"], 8),
])  # fmt: skip
def test_server_info_reports_the_batch_the_scheduler_runs(tiny_qwen3_dir, flags, batch):
    info, loads, scheduler = _serve(tiny_qwen3_dir, *flags)
    assert scheduler.max_running_requests == batch
    assert info["max_running_requests"] == batch
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == batch
    assert info["internal_states"][0]["max_running_requests"] == batch
    assert loads["loads"][0]["max_running_requests"] == batch


def test_server_info_keys_shared_with_sglang_have_its_types(tiny_qwen3_dir):
    recorded = json.loads(_RECORDED.read_text())["server_info"]["reply"]
    info, _, _ = _serve(tiny_qwen3_dir, "--enable-deterministic-inference")
    # SGLang resolves an unset tokenizer path to the model's (recorded: the same directory), as the engine loads it.
    assert recorded["tokenizer_path"] == recorded["model_path"] and info["tokenizer_path"] == str(tiny_qwen3_dir)
    for have, want, where in [
        (info, recorded, "top level"),
        (info["internal_states"][0], recorded["internal_states"][0], "internal_states[0]"),
    ]:
        shared = sorted(set(have) & set(want))
        assert "max_running_requests" in shared and len(shared) >= 18, (where, shared)
        # None where SGLang's value is Optional and unset (max_running_requests, context_length).
        wrong = {k: (have[k], want[k]) for k in shared
                 if None not in (have[k], want[k]) and type(have[k]) is not type(want[k])}  # fmt: skip
        assert wrong == {}, where
    assert {"effective_max_running_requests_per_dp", "last_gen_throughput"} <= set(info["internal_states"][0])
