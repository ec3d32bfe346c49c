"""The placement's capacity check and its bounded wait (`slime_app.cluster`), with Ray's calls faked, the CLI's
one line for a layout the local node cannot hold (a real local Ray node), and the GPU placement on a real local Ray
node that declares GPUs."""

import os
import pathlib
import subprocess
import sys
import types

import pytest

from slime_app import cluster
from slime_app.demo import default_demo_argv
from slime_core.config import SlimeArgs

REPO = pathlib.Path(__file__).resolve().parents[2]


def _cfg(**fields) -> SlimeArgs:
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "actor_num_gpus_per_node": 1, **fields})


def _no_group(*args, **kwargs):
    pytest.fail("no placement group may be made for a layout the node cannot hold")


@pytest.fixture
def local_node(monkeypatch):
    """A local run (no Ray address) whose node has `resources` (set by the test); no group may be made."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    node = types.SimpleNamespace(resources={})
    monkeypatch.setattr(cluster.ray, "cluster_resources", lambda: node.resources)
    monkeypatch.setattr(cluster, "placement_group", _no_group)
    return node


def test_more_cpu_bundles_than_the_local_node_has_are_refused_before_the_group(local_node, monkeypatch):
    # Issue 27: --rollout-num-gpus 9 next to one trainer rank on a CPU machine (8 slots) made a group of 10 bundles
    # that stayed pending: the run said nothing for 600 s, then ended in GetTimeoutError's traceback.
    monkeypatch.setattr(cluster, "has_gpu", lambda: False)
    local_node.resources = {"CPU": 8.0}
    with pytest.raises(cluster.PlacementError) as e:
        cluster.create_placement(_cfg(rollout_num_gpus=9))
    assert str(e.value) == (
        "the run needs 10 CPU bundle(s): --actor-num-nodes 1 × --actor-num-gpus-per-node 1 + --rollout-num-gpus 9 "
        "(not colocated), and the local Ray node has 8 CPU slots (no CUDA here: each GPU the flags name takes one "
        "slot, max(cores, 8) of them); lower those flags"
    )


def test_more_gpus_than_the_machine_has_are_refused_naming_the_colocated_layout(local_node, monkeypatch):
    # --actor-num-nodes 2 on a one-node machine of 8 GPUs: colocated, max(16, 16) = 16 bundles.
    monkeypatch.setattr(cluster, "has_gpu", lambda: True)
    local_node.resources = {"GPU": 8.0, "CPU": 64.0}
    with pytest.raises(cluster.PlacementError) as e:
        cluster.create_placement(_cfg(actor_num_nodes=2, actor_num_gpus_per_node=8, colocate=True))
    assert str(e.value) == (
        "the run needs 16 GPU bundle(s): max(--actor-num-nodes 2 × --actor-num-gpus-per-node 8, --rollout-num-gpus "
        "16) (--colocate), and this machine has 8 GPU(s) (CUDA_VISIBLE_DEVICES); lower those flags"
    )


def test_a_gpu_machine_with_fewer_cpus_than_gpu_bundles_is_refused_too(local_node, monkeypatch):
    # Each GPU bundle is {"GPU": 1, "CPU": 1}: 8 GPUs in a container limited to 4 CPUs left the group pending.
    monkeypatch.setattr(cluster, "has_gpu", lambda: True)
    local_node.resources = {"GPU": 8.0, "CPU": 4.0}
    with pytest.raises(cluster.PlacementError) as e:
        cluster.create_placement(_cfg(actor_num_gpus_per_node=8, colocate=True))
    assert str(e.value) == (
        "the run needs 8 GPU bundle(s): max(--actor-num-nodes 1 × --actor-num-gpus-per-node 8, --rollout-num-gpus 8) "
        "(--colocate), and the local Ray node has 4 CPUs (each GPU bundle also takes one; Ray counts the CPU limit); "
        "lower those flags"
    )


def test_a_group_the_cluster_does_not_place_ends_after_the_bounded_wait(monkeypatch, caplog):
    # On a cluster nodes may join (an autoscaler): a shortfall is a warning, and the wait is bounded.
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(cluster, "has_gpu", lambda: True)
    monkeypatch.setattr(cluster, "PLACEMENT_GROUP_TIMEOUT_S", 90)
    monkeypatch.setattr(cluster.ray, "cluster_resources", lambda: {"GPU": 4.0, "CPU": 64.0})
    monkeypatch.setattr(cluster.ray, "available_resources", lambda: {"GPU": 1.0})
    waits, removed = [], []
    group = types.SimpleNamespace(ready=lambda: "ready-ref")
    monkeypatch.setattr(cluster, "placement_group", lambda bundles, strategy: group)
    monkeypatch.setattr(cluster, "remove_placement_group", removed.append)

    def never_ready(refs, timeout):
        waits.append(timeout)
        return [], refs

    monkeypatch.setattr(cluster.ray, "wait", never_ready)
    with caplog.at_level("INFO", logger="slime_app.cluster"), pytest.raises(cluster.PlacementTimeout) as e:
        cluster.create_placement(_cfg(actor_num_gpus_per_node=8, rollout_num_gpus=8))
    assert waits == [30, 30, 30]  # 90 s in steps of PLACEMENT_LOG_S, then given up
    assert removed == [group]  # not left pending on the cluster
    assert str(e.value) == (
        "the run's placement group (16 GPU bundle(s): --actor-num-nodes 1 × --actor-num-gpus-per-node 8 + "
        "--rollout-num-gpus 8 (not colocated)) was not placed within 90 s: the cluster has 4 GPU registered, 1 free"
    )
    said = [r.getMessage() for r in caplog.records]
    assert "waiting up to 90 s for nodes to join" in said[0]
    assert said[1:] == [
        "waiting for the placement group of 16 GPU bundle(s) (30 s): the cluster has 4 GPU registered, 1 free",
        "waiting for the placement group of 16 GPU bundle(s) (60 s): the cluster has 4 GPU registered, 1 free",
    ]


def test_the_cli_refuses_the_layout_in_one_line_with_exit_2(tmp_path):
    # The real driver on this CPU machine (a local Ray node of max(cores, 8) slots): refused right after the Ray
    # start-up (the subprocess timeout is far below the 600 s wait it had), before any engine started.
    slots = max(os.cpu_count() or 1, 8)  # init_ray's CPU slots: one more bundle than that with the trainer rank's
    argv = [a for a in default_demo_argv(tmp_path / "run") if a != "--colocate"] + ["--rollout-num-gpus", str(slots)]
    script = "import sys\nfrom slime_app.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=240, cwd=REPO,
        env={**os.environ, "RAY_ADDRESS": ""},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("slime: error:")]
    assert errors == [
        f"slime: error: the run needs {slots + 1} CPU bundle(s): --actor-num-nodes 1 × --actor-num-gpus-per-node 1 + "
        f"--rollout-num-gpus {slots} (not colocated), and the local Ray node has {slots} CPU slots (no CUDA here: each "
        "GPU the flags name takes one slot, max(cores, 8) of them); lower those flags"
    ]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "engine_logs").exists()  # no engine was started


@pytest.fixture
def gpu_node(monkeypatch) -> dict:
    """A local 8-GPU node whose placement group and bundle probes are faked: bundle i is GPU i of node-a.

    Returns the dict where the group's bundle count lands (`"bundles"`).
    """
    made = {}

    def fake_group(specs, strategy):
        made["bundles"] = len(specs)
        return types.SimpleNamespace(ready=lambda: "ready-ref")

    def fake_info_options(num_gpus, scheduling_strategy):
        index = scheduling_strategy.placement_group_bundle_index
        return types.SimpleNamespace(remote=lambda: ("10.0.0.1", "node-a", index))

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "has_gpu", lambda: True)
    monkeypatch.setattr(cluster, "placement_group", fake_group)
    monkeypatch.setattr(cluster, "_bundle_info", types.SimpleNamespace(options=fake_info_options))
    monkeypatch.setattr(cluster.ray, "get", lambda refs, timeout=None: refs)
    monkeypatch.setattr(cluster.ray, "wait", lambda refs, timeout=None: (refs, []))
    monkeypatch.setattr(cluster.ray, "cluster_resources", lambda: {"GPU": 8, "CPU": 64})
    return made


@pytest.mark.parametrize(
    ("fields", "bundles"),
    [
        ({"rollout_num_gpus": 4}, 2),  # disaggregated: the actor's 2 only, not 2 + 4
        ({"rollout_num_gpus": 4, "colocate": True}, 2),  # colocated: not max(2, 4)
        ({"rollout_num_gpus": 2, "colocate": True}, 2),
    ],
)
def test_external_engines_get_no_bundles(gpu_node, caplog, fields, bundles):
    # Issue 27: with --rollout-external-engine-addrs (engines started elsewhere), --rollout-num-gpus still reserved
    # bundles that no engine would ever use: 6 GPUs for a 2-rank trainer (on an 8-GPU machine with the original's
    # script, 16 bundles: the run waited for GPUs it did not need). The original places the actor's only.
    made = gpu_node
    cfg = _cfg(actor_num_gpus_per_node=2, rollout_engine_urls=["http://10.0.0.9:30000"], **fields)
    with caplog.at_level("WARNING", logger="slime_app.cluster"):
        placement = cluster.create_placement(cfg)
    assert made["bundles"] == bundles
    assert (placement.actor_bundles, placement.rollout_bundles) == ([0, 1], [])
    warned = [r.getMessage() for r in caplog.records]
    reserved = fields["rollout_num_gpus"] > (2 if fields.get("colocate") else 0)
    assert warned == (
        [f"--rollout-num-gpus {fields['rollout_num_gpus']}: no GPUs are reserved for engines given by "
         "--rollout-engine-urls (--rollout-external-engine-addrs); they run where they were started"]
        if reserved else []
    )  # fmt: skip


def test_separate_sglang_engines_without_rollout_num_gpus_get_gpus_of_their_own(gpu_node):
    # Issue 27: not colocated and without --rollout-num-gpus, the placement reserved the trainer's GPUs only and the
    # SGLang engine (on no bundle) started on GPU 0, trainer rank 0's; --dry-run said "1 × 2 GPU(s), on their own
    # GPUs". The engine now gets --rollout-num-gpus-per-engine GPUs after the trainer's.
    from slime_app.engine_hosts import engine_sites

    cfg = _cfg(actor_num_gpus_per_node=2, rollout_engine="sglang", rollout_num_gpus_per_engine=2)
    placement = cluster.create_placement(cfg)
    assert gpu_node["bundles"] == 4
    assert (placement.actor_bundles, placement.rollout_bundles, placement.rollout_gpu_ids) == ([0, 1], [2, 3], [2, 3])
    (site,) = engine_sites(cfg, placement.rollout_bundles, placement.rollout_gpu_ids)
    assert (site.bundle, site.base_gpu_id) == (2, 2)


def test_cpu_bundles_are_located_from_the_group_table_without_a_task(monkeypatch):
    # A task per bundle started one Ray worker each (~2.5 CPU-s on the 2-core CI machine) that sat idle for the whole
    # run: a worker that ran a task never hosts an actor. Without GPUs the group's table says where each bundle is.
    group = types.SimpleNamespace(ready=lambda: "ready-ref")

    def no_task(**_):
        pytest.fail("no task may run in a CPU bundle")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "has_gpu", lambda: False)
    monkeypatch.setattr(cluster, "placement_group", lambda specs, strategy: group)
    monkeypatch.setattr(cluster, "_bundle_info", types.SimpleNamespace(options=no_task))
    monkeypatch.setattr(cluster.ray, "wait", lambda refs, timeout=None: (refs, []))
    monkeypatch.setattr(cluster.ray, "cluster_resources", lambda: {"CPU": 8})
    tables = {id(group): {"bundles_to_node_id": {0: "node-b", 1: "node-b", 2: "node-a"}}}
    monkeypatch.setattr(cluster, "placement_group_table", lambda g: tables[id(g)])
    nodes = [{"NodeID": f"node-{n}", "NodeManagerAddress": f"10.0.0.{i}"} for i, n in ((1, "a"), (2, "b"))]
    monkeypatch.setattr(cluster.ray, "nodes", lambda: nodes)
    placement = cluster.create_placement(_cfg(rollout_num_gpus=2))
    # Sorted by node address, as the task's answers were: the trainer on 10.0.0.1's bundle, the engines on the other's.
    assert (placement.actor_bundles, placement.rollout_bundles, placement.rollout_gpu_ids) == ([2], [0, 1], [])
    assert placement.bundle_nodes == ["node-b", "node-b", "node-a"]


@pytest.mark.slow
def test_gpu_placement_on_a_real_ray_node(monkeypatch):
    # The GPU branch of `create_placement` with Ray itself (the tests above fake `placement_group`, `_bundle_info`,
    # `ray.get` and `ray.wait`): a local node that declares 4 GPUs, one `_bundle_info` task in each GPU bundle
    # reading the GPU id Ray gave it, bundles sorted by it. Only torch's CUDA check is replaced.
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cluster, "has_gpu", lambda: True)
    ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)
    try:
        placement = cluster.create_placement(_cfg(actor_num_gpus_per_node=2, rollout_num_gpus=2))
        assert placement.use_gpu and len(set(placement.bundle_nodes)) == 1
        assert sorted(placement.actor_bundles + placement.rollout_bundles) == [0, 1, 2, 3]
        # One node: the trainer takes the two lowest GPU ids, the engines the next two.
        assert placement.rollout_gpu_ids == [2, 3]
        assert ray.available_resources().get("GPU", 0) == pytest.approx(0.0)  # all four held by the group
    finally:
        ray.shutdown()
