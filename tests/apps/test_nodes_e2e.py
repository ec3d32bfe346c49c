"""A run over two Ray nodes of one machine, submitted with `ray job submit` (CPU: reference engines, FSDP on gloo).

`ray.cluster_utils.Cluster` starts a head node on this machine's address (with the dashboard that the job API
needs; its job agent finds its node by that address) and a second node on a loopback address, 127.0.0.2, one CPU
each. The run has two trainer ranks and two engines, colocated: one bundle per node, so each node holds a trainer
rank and an engine, the engine started there by its engine host and listening on that node's address. Weights go
from rank 0 to both engines through a gloo broadcast group (`--weight-sync distributed`), so one engine is reached
from the other node.
"""

import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
GSM8K = REPO / "tests" / "fixtures" / "gsm8k" / "test-50.jsonl"
SECOND_NODE_IP = "127.0.0.2"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_nodes():
    """A two-node local cluster (head with the dashboard, a node on 127.0.0.2); yields (job API URL, head IP)."""
    try:
        with socket.socket() as s:
            s.bind((SECOND_NODE_IP, 0))
    except OSError:
        pytest.skip(f"{SECOND_NODE_IP} is not a local address here")
    # What slime_app.cluster sets for a local instance: a loaded 2-core machine starts Ray's processes slowly.
    for key, value in {
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        "RAY_raylet_start_wait_time_s": "300",
        "RAY_agent_register_timeout_ms": "300000",
        "RAY_worker_register_timeout_seconds": "300",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_prestart_worker_first_driver": "0",
    }.items():
        os.environ.setdefault(key, value)
    from ray.cluster_utils import Cluster

    dashboard_port = _free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": dashboard_port,
            # Not Ray's fixed default (52365): a local Ray of a run on the other xdist worker may hold it, and the
            # head's job agent then never comes up ("No available agent to submit job").
            "dashboard_agent_listen_port": _free_port(),
        },
    )
    try:
        cluster.add_node(num_cpus=1, node_ip_address=SECOND_NODE_IP)
        yield f"http://127.0.0.1:{dashboard_port}", cluster.head_node.node_ip_address
    finally:
        cluster.shutdown()


def test_job_over_two_nodes_places_ranks_and_engines_on_both_and_completes(two_nodes, tiny_qwen3, tmp_path):
    out = tmp_path / "run"
    run = [
        sys.executable, str(REPO / "apps" / "train"),
        "--train-backend", "fsdp", "--hf-checkpoint", str(tiny_qwen3),
        "--prompt-data", str(GSM8K), "--input-key", "question", "--label-key", "answer", "--apply-chat-template",
        "--rm-type", "math", "--advantage-estimator", "grpo",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
        "--rollout-max-response-len", "8", "--rollout-temperature", "1.0",
        "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "2", "--colocate",
        "--weight-sync", "distributed", "--lr", "1e-4", "--num-rollout", "2", "--output-dir", str(out),
        "--save-debug-rollout-data", str(out / "dumps" / "rollout_{rollout_id}.pt"),
    ]  # fmt: skip
    ray_cli = str(pathlib.Path(sys.executable).parent / "ray")
    job_api, head_ip = two_nodes
    assert head_ip != SECOND_NODE_IP
    submit = [ray_cli, "job", "submit", "--address", job_api, "--", *run]  # the cluster runs this venv
    deadline = time.monotonic() + 120
    while True:
        result = subprocess.run(submit, capture_output=True, text=True, timeout=540, cwd=REPO)
        log = result.stdout + result.stderr
        # The dashboard takes submissions before the head's job agent has registered (slow on a loaded machine):
        # the job was refused, nothing started, and Ray says to try again.
        if result.returncode == 0 or "No available agent to submit job" not in log or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert result.returncode == 0 and "succeeded" in log, log[-6000:]

    # One bundle on each node: a trainer rank and an engine on each, the engine listening on its node's address.
    assert "on 2 node(s)" in log, log[-6000:]
    ranks = dict(re.findall(r"trainer rank (\d+): pid \d+ on ([\d.]+)", log))
    assert sorted(ranks) == ["0", "1"] and sorted(ranks.values()) == sorted([head_ip, SECOND_NODE_IP]), ranks
    engines = re.findall(r"started engine pid \d+ at http://([\d.]+):\d+", log)
    assert sorted(engines) == sorted([head_ip, SECOND_NODE_IP]), engines
    for rollout_id in range(2):
        samples = torch.load(out / "dumps" / f"rollout_{rollout_id}.pt", weights_only=False)["samples"]
        assert len(samples) == 4, (rollout_id, len(samples))
        # Generated with the weights pushed across nodes before this rollout (version = rollout id).
        assert {tuple(s["weight_versions"]) for s in samples} == {(str(rollout_id),)}, rollout_id
