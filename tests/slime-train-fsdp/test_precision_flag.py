"""`--bf16` on a CPU FSDP trainer says once that it has no effect (`model_loading.note_precision_flag`).

The CPU trainer computes in float32 whatever `--bf16` says (`compute_dtype`); before, the flag was accepted and
dropped without a word, while the Megatron backend does train in bf16 on CPU (issue 27).
"""

import torch

from slime_core.config import SlimeArgs
from slime_train_fsdp.model_loading import compute_dtype, note_precision_flag

BASE = {"rollout_batch_size": 1, "n_samples_per_prompt": 2, "num_rollout": 1, "train_backend": "fsdp"}
MESSAGE = (
    "--bf16 has no effect on the FSDP trainer's cpu device: it computes in float32 there (bf16 compute is its CUDA "
    "behaviour, with or without the flag)"
)


def test_bf16_on_a_cpu_trainer_is_named_once(monkeypatch, caplog):
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())  # warn_once remembers keys per process
    assert compute_dtype(torch.device("cpu")) == torch.float32
    cfg = SlimeArgs.from_dict({**BASE, "bf16": True})
    with caplog.at_level("WARNING", logger="slime_core.config.base"):
        note_precision_flag(cfg, torch.device("cpu"))
        note_precision_flag(cfg, torch.device("cpu"))
    assert [r.getMessage() for r in caplog.records] == [MESSAGE]


def test_no_note_where_the_flag_is_what_runs(monkeypatch, caplog):
    from slime_core.config import base as config_base

    monkeypatch.setattr(config_base, "_WARNED", set())
    bf16, plain = SlimeArgs.from_dict({**BASE, "bf16": True}), SlimeArgs.from_dict(BASE)
    with caplog.at_level("WARNING", logger="slime_core.config.base"):
        note_precision_flag(bf16, torch.device("cuda"))  # a device name only: nothing touches a GPU
        note_precision_flag(plain, torch.device("cpu"))
    assert caplog.records == []
