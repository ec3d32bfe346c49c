"""Two gloo ranks, pipeline parallelism 2, a layout whose first stage is dense: `router_metrics` on both stages.

Run by `test_router_metrics_cpu.py`: `python _router_pp2_worker.py PORT` prints `RESULT <json list, one dict per
rank>`. A 4-layer model whose MoE layers are 3 and 4 (`--moe-layer-freq [0,0,1,1]`), 2 layers a stage: stage 0
holds no router, so megatron-core's tracker stays empty there while stage 1 tracks both MoE layers' losses.
"""

import datetime
import json
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int, port: int) -> None:
    # gloo's own timeout bounds every collective: a rank left waiting fails here instead of hanging the test.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))  # fmt: skip
    from megatron.core import parallel_state
    from megatron.core.transformer.moe import moe_utils

    from slime_train_megatron.router_metrics import reset_router_losses, router_loss_metrics

    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2)
    assert parallel_state.get_pipeline_model_parallel_rank() == rank
    reset_router_losses()
    if rank == 1:  # the MoE stage, two micro-batches: what its routers record (loss / coefficient per layer)
        tp_cp = parallel_state.get_tensor_and_context_parallel_group()
        for micro_batch in range(2):
            for layer, value in ((3, 1.0), (4, 3.0)):
                moe_utils.save_to_aux_losses_tracker("load_balancing_loss", torch.tensor(value + micro_batch),
                                                     layer, 4, tp_cp)  # fmt: skip
                moe_utils.save_to_aux_losses_tracker("z_loss", torch.tensor(10.0 * layer), layer, 4)
    result = {"rank": rank, "router_metrics": router_loss_metrics(num_moe_layers=2, num_micro_batches=2)}
    result["tracker_after"] = sorted(moe_utils.get_moe_layer_wise_logging_tracker())
    out = [None, None]
    dist.all_gather_object(out, result)
    if rank == 0:
        print("RESULT " + json.dumps(out))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
