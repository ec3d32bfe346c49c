"""`--true-on-policy-mode` through the real FSDP backend on CPU/gloo (one rank, tiny fp32 Qwen3).

The config turns the mode on; the backend must then run the mirrored forward (CPU fallback) for the old log-probs
and the training forward: log-probs equal plain transformers' within 1e-5 (fp32, summation order only), the
first on-policy step has ratio 1, and the step updates every parameter.
"""

from __future__ import annotations

import importlib.util
import pathlib
import shutil

import pytest
import torch

pytestmark = [
    pytest.mark.slow,  # multi-process: ranks forked
]

_LAUNCH = pathlib.Path(__file__).with_name("_launch.py")
_spec = importlib.util.spec_from_file_location("slime_fsdp_test_launch_top", _LAUNCH)
_launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_launch)
_ranks = _launch.RankLauncher(pathlib.Path(__file__).with_name("_true_on_policy_worker.py"))


@pytest.fixture(scope="module")
def mode_run(tmp_path_factory, qwen3_tokenizer_dir) -> dict:
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = tmp_path_factory.mktemp("top_qwen3")
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=False, architectures=["Qwen3ForCausalLM"])  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    for f in qwen3_tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, path / f.name)
    _ranks.workers()  # imports slime_train_fsdp once, before the rank is forked
    return _ranks.forked("mode", 1, tmp_path_factory.mktemp("top_run"), path)[0]


def test_backend_runs_the_mirrored_forward(mode_run):
    assert mode_run["mirrored"]
    assert mode_run["hf_diff"] <= 1e-5


def test_first_on_policy_step_has_unit_ratio_and_updates_every_parameter(mode_run):
    first = mode_run["steps"][0]
    # The training forward reproduces the old log-probs exactly (same mirrored forward, same weights).
    assert first["train/ppo_kl"] == 0.0
    assert first["train/pg_clipfrac"] == 0.0
    assert first["train/train_rollout_logprob_abs_diff"] == 0.0
    assert mode_run["changed"] == mode_run["num_params"]
