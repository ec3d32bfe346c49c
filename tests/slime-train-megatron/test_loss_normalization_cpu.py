"""Each Megatron optimizer step's gradient over DP splits that do not divide the global batch, against the original's
loss (the cases and the reference of `tests/_loss_norm_cases.py`; the FSDP backend's test is its twin).

`_loss_norm_worker.py` runs the Megatron backend on 2 and 3 gloo ranks (DP = ranks, megatron-core's own schedules and
DP gradient reduction): per case (even split; a global batch DP does not divide, with an empty micro-batch slot;
dynamic batching giving ranks other real micro-batch counts; a rank holding only samples without a trainable token;
per-rollout denominators; a rank without samples) and loss mode (per sample, `--calculate-per-token-loss`), the
gradient of the embedding and the output layer that every step would apply is compared with the gradient of the
original's formula over the whole step on one process (plain transformers). Tolerances: 1e-5 relative to the step's
largest entry (fp32; packing and DP only reorder sums); metrics 1e-5 relative + 1e-7 absolute.
"""

import importlib.util
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

pytest.importorskip("megatron.core")

_here = pathlib.Path(__file__).resolve()
WORKER = _here.with_name("_loss_norm_worker.py")
_spec = importlib.util.spec_from_file_location("slime_tests_loss_norm_cases", _here.parents[1] / "_loss_norm_cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
_wspec = importlib.util.spec_from_file_location("slime_megatron_test_loss_norm_worker", WORKER)
worker = importlib.util.module_from_spec(_wspec)
_wspec.loader.exec_module(worker)
TOL = 1e-5


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, tiny_hf, tmp_path_factory) -> tuple[int, list[dict]]:
    world, (_, hf_dir) = request.param, tiny_hf("qwen3")
    out = tmp_path_factory.mktemp(f"megatron_loss_norm{world}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, str(WORKER), str(world), str(port), str(hf_dir), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return world, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.fixture(scope="module")
def reference(tiny_hf) -> dict:
    model, hf_dir = tiny_hf("qwen3")
    steps = cases.reference_steps(model, lambda name, per_token: worker.case_args(str(hf_dir), name, per_token),
                                  worker.VOCAB)  # fmt: skip
    keep = set(worker.COMPARED.values())
    return {key: [({n: g for n, g in grads.items() if n in keep}, m) for grads, m in s] for key, s in steps.items()}


@pytest.mark.slow  # 2 and 3 gloo ranks, each importing megatron-core and running 12 rollouts: ~2 min on 2 cores
def test_each_steps_gradient_and_loss_metrics_are_the_originals(ranks, reference):
    world, results = ranks
    # The premises (as the FSDP twin checks them): other real micro-batch counts, a rank without samples.
    dynamic = [cases.real_micro_batches(r["dynamic", False]["micro_batches"], 0) for r in results]
    assert dynamic == ([2, 1] if world == 2 else [1, 1, 1])
    assert world == 2 or [len(r["tiny", False]["sample_indices"]) for r in results] == [1, 1, 0]
    # Megatron pads the vocabulary rows of the embedding and output layer: the first rows are the model's.
    cases.assert_matches_reference(
        reference, results, lambda got, want: {n: got[n][: g.shape[0]] for n, g in want.items()}, TOL
    )
