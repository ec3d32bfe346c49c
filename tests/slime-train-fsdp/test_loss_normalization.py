"""Each FSDP optimizer step's gradient over DP splits that do not divide the global batch, against the original's loss.

The `loss_norm` scenario (`_scenario_loss_norm.py`) runs on 2 and 3 gloo ranks: per case of `tests/_loss_norm_cases.py`
(even split; a global batch DP does not divide, with an empty micro-batch slot; dynamic batching giving ranks other
real micro-batch counts; a rank holding only samples without a trainable token; per-rollout denominators; a rank
without samples) and loss mode (per sample, `--calculate-per-token-loss`), `build_rollout_batches` splits the rollout
as a run does and every step's summed gradient is captured before it would be applied. The reference is that module's
`reference_steps`: the original's formula over the whole step on one process (plain transformers). Tolerances:
gradients 1e-5 relative to the step's largest entry (fp32; packing and DP only reorder sums), metrics 1e-5 relative
+ 1e-7 absolute.
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import pytest
import torch

_LAUNCH = pathlib.Path(__file__).with_name("_launch.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch", _LAUNCH)
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(pathlib.Path(__file__).with_name("_workers.py"))
TOL = 1e-5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, qwen3_tokenizer_dir) -> pathlib.Path:
    """A 2-layer Qwen3 (vocab 64, hidden 32), untied, with the real tokenizer files."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = tmp_path_factory.mktemp("tiny_qwen3_loss_norm")
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    for f in qwen3_tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def scenario():
    """The scenario module as the ranks import it (`cases`: the shared cases and reference; `case_args`)."""
    return _ranks.workers()._loss_norm


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request, ckpt, tmp_path_factory) -> tuple[int, list[dict]]:
    world = request.param
    return world, _ranks.forked("loss_norm", world, tmp_path_factory.mktemp(f"loss_norm{world}"), ckpt)


@pytest.fixture(scope="module")
def reference(scenario, ckpt) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="eager")
    return scenario.cases.reference_steps(model, lambda name, per_token: scenario.case_args(str(ckpt), name, per_token))


def test_the_cases_split_the_global_batch_as_they_claim(ranks, scenario):
    """The premises: uneven sample counts, empty micro-batches, ranks with other real micro-batch counts, a rank
    holding only samples without a trainable token, a rank without samples (else the test below would test less)."""
    world, results = ranks
    cases = scenario.cases
    per_rank = {name: [len(r[name, False]["sample_indices"]) for r in results] for name in cases.CASES}
    assert len(set(per_rank["even"])) == 1
    assert per_rank["uneven"] == ([6, 4] if world == 2 else [4, 4, 2])  # 5 a step: 3 + 2 (+ an empty slot), 2 + 2 + 1
    assert any(not mb for r in results for mb in r["uneven", False]["micro_batches"][0])
    dynamic = [cases.real_micro_batches(r["dynamic", False]["micro_batches"], 0) for r in results]
    assert dynamic == ([2, 1] if world == 2 else [1, 1, 1])
    if world == 2:
        masked_rank = results[1]["masked", False]
        step0 = [masked_rank["sample_indices"][i] for mb in masked_rank["micro_batches"][0] for i in mb]
        assert step0 == [2, 3]  # this rank trains no token in step 0
    else:
        assert per_rank["tiny"] == [1, 1, 0]


def test_each_steps_gradient_and_loss_metrics_are_the_originals(scenario, ranks, reference):
    _, results = ranks
    # FSDP's compiled layers name their weights `..._orig_mod...`; the reference has plain HF names.
    scenario.cases.assert_matches_reference(
        reference, results, lambda got, want: {n.replace("_orig_mod.", ""): g for n, g in got.items()}, TOL
    )
