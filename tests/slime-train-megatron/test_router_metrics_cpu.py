"""`router_metrics` across pipeline stages on two gloo ranks (CPU): a stage without MoE layers joins the reduction."""

import json
import pathlib
import socket
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_router_metrics_with_a_dense_pipeline_stage_agree_on_both_stages():
    """PP 2, stage 0 dense, stage 1 with MoE layers 3 and 4 over 2 micro-batches.

    Stage 1 tracked load-balancing losses (1 + 3) + (2 + 4) = 10 and z-losses 2 × (30 + 40) = 140, so over 2
    micro-batches and 2 MoE layers: 10 / 2 / 2 = 2.5 and 140 / 2 / 2 = 35.0, on both ranks. Before, stage 0 (empty
    tracker) returned at once and stage 1 waited in the pipeline all-reduce: a hang (here: gloo's 30 s timeout).
    """
    worker = pathlib.Path(__file__).with_name("_router_pp2_worker.py")
    proc = subprocess.run([sys.executable, str(worker), str(_free_port())], capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    for r in ranks:
        assert r["router_metrics"] == {"train/load_balancing_loss": 2.5, "train/z_loss": 35.0}, r
        assert r["tracker_after"] == [], r  # cleared on both stages, names included
