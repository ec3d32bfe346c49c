"""Do the attention heads split evenly over the parallel ranks? Checked from config.json before anything starts.

A run whose engine or trainer splits the heads unevenly otherwise starts Ray, the engines and the trainer, then
stops deep in start-up (SGLang: `num_attention_heads must be divisible by tp_size`; Ulysses CP at the first
micro-batch). The rules, with `H` = `num_attention_heads` and `G` = `num_key_value_heads` of the language model:

* an SGLang engine of `T`-way TP (`--rollout-num-gpus-per-engine` divided by `--sglang-pp-size`; with
  `--sglang-enable-dp-attention`, attention runs on `T / --sglang-dp-size` of them): `H % T == 0`, and
  `G % T == 0` when `G >= T`, else `T % G == 0` (SGLang replicates a KV head over `T / G` ranks), as SGLang's
  attention layers assert;
* Megatron's tensor parallelism (`--tensor-model-parallel-size T`): `H % T == 0` and `G % T == 0` (megatron-core
  splits query groups across TP ranks);
* FSDP's context parallelism (`--context-parallel-size C`, DeepSpeed-Ulysses all-to-all over heads;
  `slime_train_fsdp.context_parallel`): `H % C == 0` and `G % C == 0`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["head_split_problems"]


def _heads(hf_config: dict[str, Any]) -> tuple[int, int] | None:
    """(H, G) of the language model (a VLM's `text_config` / `llm_config`), or None when config.json does not say."""
    for part in (hf_config.get("text_config") or {}, hf_config.get("llm_config") or {}, hf_config):
        heads = part.get("num_attention_heads")
        if isinstance(heads, int) and heads > 0:
            groups = part.get("num_key_value_heads")
            return heads, groups if isinstance(groups, int) and groups > 0 else heads
    return None


def _engine_problem(heads: int, groups: int, tp: int, how: str) -> str | None:
    if heads % tp:
        return f"{how}: num_attention_heads {heads} is not divisible by {tp}"
    if (groups >= tp and groups % tp) or (groups < tp and tp % groups):
        return f"{how}: num_key_value_heads {groups} does not split over {tp} (nor {tp} over it)"
    return None


def head_split_problems(
    hf_config: dict[str, Any],
    *,
    engine_tp: int | None,
    engine_dp_attention: int = 1,
    engine_pp: int = 1,
    megatron_tp: int | None = None,
    ulysses_cp: int | None = None,
) -> list[str]:
    """One line per parallel split the heads of `hf_config` do not allow (module docstring).

    Args:
        hf_config: parsed config.json of `--hf-checkpoint`.
        engine_tp: GPUs per SGLang engine, or None when the engine is not SGLang.
        engine_dp_attention: `--sglang-dp-size` with `--sglang-enable-dp-attention` (attention TP is `engine_tp`
            divided by it), else 1.
        engine_pp: `--sglang-pp-size`: the engine's TP is `engine_tp` divided by it.
        megatron_tp: Megatron's `--tensor-model-parallel-size`, or None for another backend.
        ulysses_cp: FSDP's `--context-parallel-size`, or None for another backend.

    Returns:
        Lines naming the flag, its value and the head count; empty when every split is even or config.json gives
        no head count.
    """
    found = _heads(hf_config)
    if found is None:
        return []
    heads, groups = found
    problems = []
    if engine_tp and engine_tp > 1:
        attention_tp = max(engine_tp // max(engine_pp, 1) // max(engine_dp_attention, 1), 1)
        how = f"--rollout-num-gpus-per-engine {engine_tp}" + (
            f" (attention on {attention_tp} GPUs with --sglang-pp-size {engine_pp} / --sglang-dp-size "
            f"{engine_dp_attention})"
            if attention_tp != engine_tp
            else ""
        )
        problem = _engine_problem(heads, groups, attention_tp, how)
        if problem:
            problems.append(problem)
    for flag, size in (("--tensor-model-parallel-size", megatron_tp), ("--context-parallel-size", ulysses_cp)):
        if size and size > 1:
            counts = (("num_attention_heads", heads), ("num_key_value_heads", groups))
            bad = [f"{name} {n}" for name, n in counts if n % size]
            if bad:
                problems.append(f"{flag} {size}: {' and '.join(bad)} not divisible by {size}")
    return problems
