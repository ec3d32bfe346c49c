"""Do the decoder layers split over Megatron's pipeline stages, and the experts over its expert-parallel ranks?

Checked from config.json before anything starts (preflight) and again by the Megatron backend before it builds the
model. Without it megatron-core stops each rank deep in model construction with a bare assert
(`num_layers should be divisible by pipeline_model_parallel_size`, `num_moe_experts % ep_size == 0`) or a
`Mismatch: 1 middle layers remaining but 0 middle PP stages`, after Ray, the engines and the process groups are up.

The rules are megatron-core's (`TransformerConfig.__post_init__`, `transformer_block.get_num_layers_to_build`,
`MoELayer`), with `L` layers, `P` = `--pipeline-model-parallel-size`, `F`/`La` =
`--decoder-first/last-pipeline-num-layers`, `E` experts and `--expert-model-parallel-size` `EP`:

* without `F`/`La`: `L % P == 0`;
* with them: `L - F - La` layers over the `P - (stages given)` middle stages, evenly, and none left without a stage;
* `F`/`La` need `P > 1` (with one stage they either break the split or do nothing);
* `E % EP == 0`.
"""

from __future__ import annotations

__all__ = ["layer_split_problems"]


def layer_split_problems(
    num_layers: int,
    num_experts: int | None,
    *,
    pipeline: int,
    first: int | None = None,
    last: int | None = None,
    expert: int = 1,
) -> list[str]:
    """One line per split of layers or experts that megatron-core would refuse (module docstring).

    Args:
        num_layers: decoder layers of the model (`num_hidden_layers`).
        num_experts: routed experts per MoE layer, None or 0 for a dense model.
        pipeline: `--pipeline-model-parallel-size`.
        first: `--decoder-first-pipeline-num-layers`, or None.
        last: `--decoder-last-pipeline-num-layers`, or None.
        expert: `--expert-model-parallel-size`.

    Returns:
        Lines naming the flags, their values and the counts; empty when every split is even.
    """
    problems = []
    given = [(flag, n) for flag, n in (("first", first), ("last", last)) if n is not None]
    uneven = " ".join(f"--decoder-{flag}-pipeline-num-layers {n}" for flag, n in given)
    if given and pipeline == 1:
        problems.append(f"{uneven} needs --pipeline-model-parallel-size > 1 (there is one stage)")
    elif given:
        middle_layers = num_layers - sum(n for _, n in given)
        middle_stages = pipeline - len(given)
        where = f"{uneven} with --pipeline-model-parallel-size {pipeline} and num_hidden_layers {num_layers}"
        if middle_stages and middle_layers <= 0:
            problems.append(f"{where}: no layers are left for the other {middle_stages} stage(s)")
        elif middle_layers and not middle_stages:
            problems.append(f"{where}: the stages hold {num_layers - middle_layers} layers, not {num_layers}")
        elif middle_stages and middle_layers % middle_stages:
            problems.append(
                f"{where}: the other {middle_layers} layers do not split evenly over the other {middle_stages} stage(s)"
            )
    elif num_layers % pipeline:
        problems.append(
            f"--pipeline-model-parallel-size {pipeline}: num_hidden_layers {num_layers} is not divisible by {pipeline} "
            "(set --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for uneven stages)"
        )
    if num_experts and num_experts % expert:
        problems.append(f"--expert-model-parallel-size {expert}: {num_experts} experts are not divisible by {expert}")
    return problems
