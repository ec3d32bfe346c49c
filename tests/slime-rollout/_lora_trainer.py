"""The trainer side of a LoRA run, for `test_sglang_lora.py`: `python _lora_trainer.py MODE CONFIG OUT [SAMPLES]`.

One trainer rank (NCCL on a GPU, gloo on CPU) builds `FSDPTrainBackend` from CONFIG (a JSON dict for
`SlimeArgs.from_dict`) as a run does: LoRA injected on the meta device, the checkpoint and the initial adapter
(B = 0) loaded, bf16 compute on a GPU. It runs in its own process as the run's trainer actor does, and exits
(freeing the GPU) before the engine takes its memory back.

MODE `adapter`: saves to OUT the buckets the first weight sync sends (`named_hf_weights`: PEFT names, float32).
MODE `log_probs`: saves to OUT `compute_log_probs` (the first-step log-probs, `--rollout-temperature`) of SAMPLES,
a torch file `{"tokens": [[int]], "response_lengths": [int]}`, packed two samples per micro-batch.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_train_fsdp import FSDPTrainBackend


def _batch(samples: dict) -> RolloutBatch:
    tokens = [torch.tensor(t) for t in samples["tokens"]]
    lengths = list(samples["response_lengths"])
    n = len(tokens)
    return RolloutBatch(
        tokens=tokens, response_lengths=lengths, loss_masks=[torch.ones(r) for r in lengths], rewards=[0.0] * n,
        raw_rewards=[0.0] * n, loss_denominators=[float(r) for r in lengths],
        micro_batches=[[list(range(i, min(i + 2, n))) for i in range(0, n, 2)]], sample_indices=list(range(n)),
        step_sample_counts=[n], step_token_counts=[float(sum(lengths))],
    )  # fmt: skip


def main(mode: str, config: str, out: str, samples: str | None = None) -> None:
    """Runs MODE (see the module docstring) on a one-rank process group."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        cfg = SlimeArgs.from_dict(json.loads(open(config).read()))
        backend = FSDPTrainBackend()
        backend.init(cfg, with_ref=False)
        if mode == "adapter":
            buckets = [[(n, t.detach().float().cpu()) for n, t in bucket] for bucket in backend.named_hf_weights()]
            torch.save(buckets, out)
        elif mode == "log_probs":
            torch.save(backend.compute_log_probs(_batch(torch.load(samples))), out)
        else:
            raise ValueError(f"mode must be 'adapter' or 'log_probs', got {mode!r}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
