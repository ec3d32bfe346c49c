"""Eval rollouts (`--eval-prompt-data name path [name path ...]`).

Every eval dataset is generated with the eval sampling parameters (`--eval-temperature`,
`--eval-top-p`, `--eval-max-response-len`, ... falling back to the rollout ones),
`--n-samples-per-eval-prompt` samples per prompt, all datasets concurrently, and scored with the
per-sample reward. Metrics: `eval/{name}` (mean reward, `--eval-reward-key`), `eval/{name}-truncated_ratio`,
`eval/{name}/response_len/mean`.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import statistics
from typing import Any

from slime_core.sample import Sample, Status

from slime_rollout import async_utils
from slime_rollout.base_types import RolloutFnEvalOutput
from slime_rollout.data_source import _chat_template_kwargs, get_tokenizer, load_prompt_rows, rows_to_samples
from slime_rollout.metrics import flatten_groups, reward_value
from slime_rollout.rollout import RolloutState, generate_and_rm

logger = logging.getLogger(__name__)

__all__ = ["eval_datasets", "eval_rollout", "eval_rollout_async"]


def eval_datasets(args: Any) -> list[tuple[str, str]]:
    """`(name, path)` pairs of `--eval-prompt-data`.

    Raises:
        ValueError: an odd number of entries or a duplicate name.
    """
    spec = list(getattr(args, "eval_prompt_data", None) or [])
    if len(spec) % 2:
        raise ValueError(f"--eval-prompt-data takes pairs 'name path', got {len(spec)} values: {spec}")
    pairs = list(zip(spec[0::2], spec[1::2], strict=True))
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"--eval-prompt-data: duplicate dataset names in {names}")
    return pairs


def _eval_arg(args: Any, name: str, default: Any = None) -> Any:
    value = getattr(args, f"eval_{name}", None)
    return value if value is not None else getattr(args, name, default)


@functools.cache
def _load_eval_prompts(path: str, input_key: str, label_key: str | None, metadata_key: str | None,
                       tool_key: str | None, hf_checkpoint: str | None, apply_chat_template: bool,
                       template_kwargs: tuple, max_prompt_len: int | None) -> tuple[Sample, ...]:  # fmt: skip
    tokenizer = get_tokenizer(hf_checkpoint) if (apply_chat_template or max_prompt_len) else None
    samples = rows_to_samples(
        load_prompt_rows(path),
        source=path,
        input_key=input_key,
        label_key=label_key,
        metadata_key=metadata_key,
        tool_key=tool_key,
        tokenizer=tokenizer,
        apply_chat_template=apply_chat_template,
        apply_chat_template_kwargs=dict(template_kwargs),
        max_prompt_len=max_prompt_len,
    )
    return tuple(samples)


def _prompts(args: Any, path: str) -> list[Sample]:
    return list(
        _load_eval_prompts(
            path,
            _eval_arg(args, "input_key", "input"),
            _eval_arg(args, "label_key"),
            getattr(args, "metadata_key", "metadata"),
            _eval_arg(args, "tool_key", "tools"),
            getattr(args, "hf_checkpoint", None),
            bool(getattr(args, "apply_chat_template", False)),
            tuple(sorted(_chat_template_kwargs(args).items())),
            getattr(args, "eval_max_prompt_len", None),
        )
    )


async def _eval_dataset(args: Any, name: str, path: str, state: RolloutState) -> dict[str, Any]:
    n = int(getattr(args, "n_samples_per_eval_prompt", 1))
    samples = []
    for group_index, prompt in enumerate(_prompts(args, path)):
        for j in range(n):
            sample = copy.deepcopy(prompt)
            sample.group_index, sample.index = group_index, group_index * n + j
            sample.metadata.setdefault("source_name", name)
            samples.append(sample)
    results = await asyncio.gather(*(generate_and_rm(args, s, state) for s in samples))
    flat = flatten_groups([list(results)])
    key = _eval_arg(args, "reward_key")
    return {
        "rewards": [reward_value(s, key) for s in flat],
        "truncated": [s.status is Status.TRUNCATED for s in flat],
        "samples": flat,
    }


async def eval_rollout_async(args: Any, rollout_id: int) -> RolloutFnEvalOutput:
    """Generates and scores every eval dataset concurrently.

    Args:
        args: reads `eval_prompt_data`, `n_samples_per_eval_prompt`, `eval_*` sampling/key overrides,
            `eval_reward_key` (else `reward_key`), plus what generate and rewards read.
        rollout_id: the training rollout this eval follows.

    Returns:
        Per dataset `{"rewards", "truncated", "samples"}` and the `eval/*` metrics.

    Raises:
        ValueError: no eval datasets, or `--group-rm` (unsupported in eval, as in the original).
    """
    pairs = eval_datasets(args)
    if not pairs:
        raise ValueError("eval rollout needs --eval-prompt-data name path [name path ...]")
    if getattr(args, "group_rm", False):
        raise ValueError("--group-rm is not supported in eval rollouts")
    state = RolloutState.create(args, rollout_id=rollout_id, evaluation=True)
    results = await asyncio.gather(*(_eval_dataset(args, name, path, state) for name, path in pairs))
    data = {name: result for (name, _), result in zip(pairs, results, strict=True)}
    metrics: dict[str, float] = {}
    for name, result in data.items():
        if not result["samples"]:
            continue
        metrics[f"eval/{name}"] = statistics.fmean(result["rewards"])
        metrics[f"eval/{name}-truncated_ratio"] = statistics.fmean(map(float, result["truncated"]))
        metrics[f"eval/{name}/response_len/mean"] = statistics.fmean(
            s.effective_response_length for s in result["samples"]
        )
    logger.info("eval %d: %s", rollout_id, {k: round(v, 4) for k, v in metrics.items() if "/" not in k[5:]})
    return RolloutFnEvalOutput(data=data, metrics=metrics)


def eval_rollout(args: Any, rollout_id: int) -> RolloutFnEvalOutput:
    """Synchronous `eval_rollout_async` (what `generate_rollout(..., evaluation=True)` returns)."""
    return async_utils.run(eval_rollout_async(args, rollout_id))
