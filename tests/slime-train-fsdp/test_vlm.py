"""Vision-language models on the FSDP backend (CPU/gloo, tiny random Qwen2.5-VL and Qwen3-VL, fp32).

Scenarios run in forked processes (`_vlm_workers.py`). Tolerances: 1e-5 absolute on log-probs, 1e-5 relative to
the largest gradient entry on gradients (same fp32 kernels, different summation order), 1e-4 on parameters after
a DP step (Adam divides by sqrt(v)).
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

# The tiny checkpoints' Qwen-VL processors need torchvision, which slime-rollout brings (the trainer itself
# gets pixel values and does not): slime-train-fsdp's isolated test run has no processor to build them with.
pytest.importorskip("torchvision", reason="the test checkpoints' VL processors need torchvision (slime-rollout)")

WORKER = pathlib.Path(__file__).with_name("_vlm_workers.py")
TOL = 1e-5


_LAUNCH = pathlib.Path(__file__).with_name("_launch.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch", _LAUNCH)
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(WORKER, timeout_s=900)
_load_workers = _ranks.workers
launch = _ranks.forked


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vlm(request, make_tiny_vlm, tmp_path_factory):
    path = make_tiny_vlm(tmp_path_factory.mktemp(request.param) / "ckpt", request.param)
    _load_workers()  # the worker module's import errors show here, not in a rank
    return request.param, path


@pytest.fixture(scope="module")
def single(vlm, tmp_path_factory):
    return launch("single", 1, tmp_path_factory.mktemp("single"), vlm[1])[0]


def _checkpoint_names(path: pathlib.Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return sorted(f.keys())


def test_log_probs_match_plain_transformers(single):
    # Positions, image features and the packed attention against transformers' own unpacked forward.
    assert single["hf_diff"] <= TOL


def test_the_fused_head_matches_the_exact_head_on_rows_with_images(single):
    # `--log-probs-head fused` (the CUDA default) against `fp32` on the same packed row, images included.
    f = single["fused"]
    assert f["lp_diff"] <= 1e-6 and f["ent_diff"] <= 1e-6  # same fp32 logits, other summation order
    assert f["same_grads"] and f["vision_grads"] > 0  # the vision tower gets its gradient through either head
    assert f["grad_diff"] <= TOL * max(f["grad_scale"], 1.0)  # relative to the largest entry, as below


def test_image_tokens_sampled_in_a_response_are_text_as_in_the_engine(single):
    # Against transformers' own prefill + KV-cache decode (no image features, text positions there).
    assert single["response_image_token_diff"] <= TOL


def test_packed_rows_with_images_equal_one_sample_at_a_time(single):
    p = single["packed"]
    assert p["position_rows"] == 4  # text positions + 3-D rotary positions
    assert p["lp_diff"] <= TOL
    assert p["vision_grad_scale"] > 1e-6  # the vision tower is trained through the packed row
    assert p["num_grads"][0] == p["num_grads"][1]
    # Gradients reach O(10) here (random 151936-row embedding): compared relative to their largest entry.
    assert p["grad_diff"] <= TOL * max(p["grad_scale"], 1.0)


def test_weights_are_pushed_under_checkpoint_names_and_all_train(vlm, single):
    family, path = vlm
    names = _checkpoint_names(path)  # what save_pretrained wrote: what SGLang loads
    assert single["pushed_names"] == names
    if family == "qwen2_5_vl":
        assert any(n.startswith("visual.") for n in names) and any(n.startswith("model.layers.") for n in names)
    assert any("visual" in n for n in single["changed"])
    assert any("layers" in n and "visual" not in n for n in single["changed"])


def test_export_reloads_in_transformers(single):
    assert single["export_diff"] <= TOL


def test_frozen_vision_tower_stays_and_is_pushed_once(vlm, tmp_path_factory):
    res = launch("frozen", 1, tmp_path_factory.mktemp("frozen"), vlm[1])[0]
    vision = [n for n in res["first_names"] if "visual" in n]
    assert vision and res["vision_requires_grad"] == [False]
    assert res["optimized"] == res["num_params"] - len(vision)
    assert res["second_names"] == [n for n in res["first_names"] if "visual" not in n]
    assert res["changed"] and not any("visual" in n for n in res["changed"])


def test_data_parallel_ranks_without_images_still_step_together(vlm, tmp_path_factory):
    work = tmp_path_factory.mktemp("dp")
    ranks = launch("dp", 2, work, vlm[1])
    ref = launch("dp_ref", 1, work, vlm[1])[0]
    assert ranks[0]["metrics"]["train/loss"] == pytest.approx(ref["metrics"]["train/loss"], abs=TOL)
    assert any("visual" in n for n in ranks[0]["changed"])
    for name, want in ref["after"].items():
        for r in ranks:
            torch.testing.assert_close(r["after"][name], want, atol=1e-4, rtol=0)
