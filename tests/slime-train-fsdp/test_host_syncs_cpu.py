"""Host-device syncs of FSDP's `train()` and the PPO critic's `train_critic()` stay flat in micro-batches (issue 26).

On a GPU a read of a device tensor (`.item()`, `.tolist()`, `float(t)`, `.cpu()`, `if t:`, `nonzero`, boolean-mask
indexing) and a blocking host → device copy make the host wait until the GPU has run everything queued so far; inside
the micro-batch loop the GPU then idles while the host queues the next kernels. `_sync_workers.py` counts them on one
gloo rank (how `SyncCounter` tells "device" tensors on CPU: tests/_sync_counter.py), for a schedule of 2 optimizer
steps of 1 micro-batch × 2 samples and one of 2 steps of 3 micro-batches × 4 samples: the counts must be the same, and
what is left is read once per `train()`: the old / reference log-probs and the critic's values, each in one copy after
their forwards; every step's metric sums and grad norm in one read after the last step. (The data-parallel
reductions' reads of what `to_device` copied, `trainer_parts.reduce_metric_sums` and `all_reduce_sum`, once per
`train()`, are not seen on CPU.)
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
_ranks = _launch.RankLauncher(pathlib.Path(__file__).with_name("_sync_workers.py"))

pytestmark = pytest.mark.slow  # ranks forked from the forkserver (_launch.py)


@pytest.fixture(scope="module")
def counts(tmp_path_factory, qwen3_tokenizer_dir) -> dict:
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = tmp_path_factory.mktemp("sync_qwen3")
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                      tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    for f in qwen3_tokenizer_dir.glob("tokenizer*.json"):
        shutil.copy(f, path / f.name)
    _ranks.workers()  # the worker module's import errors show here, not in a rank
    return _ranks.forked("syncs", 1, tmp_path_factory.mktemp("syncs"), path)[0]


def test_actor_train_syncs_do_not_grow_with_micro_batches(counts):
    few, many = counts["actor"]
    assert few == many, f"syncs that differ with the micro-batches: small {few}, large {many}"
    assert few == {
        ("cpu", "slime_core/host_to_device.py:per_sample_on_host"): 2,  # old and reference log-probs, a copy each
        ("tolist", "slime_core/step_metrics.py:_read_to_host"): 1,  # both steps' metric sums and grad norms
    }


def test_critic_train_syncs_do_not_grow_with_micro_batches(counts):
    few, many = counts["critic"]
    assert few == many, f"syncs that differ with the micro-batches: small {few}, large {many}"
    assert few == {
        ("cpu", "slime_core/host_to_device.py:per_sample_on_host"): 1,  # the values before the update, one copy
        ("tolist", "slime_core/step_metrics.py:_read_to_host"): 1,
    }
