"""Eval rollouts (`--eval-prompt-data name path [name path ...]` and/or `--eval-config FILE.yaml`).

Every eval dataset is generated with its own sampling parameters and `n_samples_per_eval_prompt`
samples per prompt, all datasets concurrently, and scored with the per-sample reward; ABORTED samples (no reward) are
left out, counted in `eval/{name}-aborted_ratio` and one warning. A setting is
resolved dataset entry → `eval.defaults` of the YAML → flags (`--eval-temperature`, ... falling back to
the rollout ones). Metrics: `eval/{name}` (mean reward, `--eval-reward-key`),
`eval/{name}-truncated_ratio`, `eval/{name}/response_len/{mean,median,max,min}`, `eval/{name}/repetition_frac`,
`eval/{name}/truncated_ratio`, with `--log-passrate` `eval/{name}-pass@{k}` (the original's names).

YAML layout::

    eval:
      defaults: {max_response_len: 512, temperature: 0.6}
      datasets:
        - {name: gsm8k, path: data/gsm8k_test.jsonl, rm_type: math, n_samples_per_eval_prompt: 4}

`datasets` may also be the original's mapping keyed by name (`datasets: {gsm8k: {path: ...}}`). Besides the sampling
keys above, `repetition_penalty`, `skip_special_tokens` and `no_stop_trim` go to the engine, and `metadata_overrides`
(a mapping) is merged into every sample's metadata, as in the original's `EvalDatasetConfig`.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import math
import pathlib
import statistics
from typing import TYPE_CHECKING, Any

import yaml

from slime_core.config.rollout import check_template_kwargs
from slime_core.config.validation_multimodal import check_multimodal_keys
from slime_core.sample import Sample, Status
from slime_rollout.base_types import RolloutFnEvalOutput
from slime_rollout.data.prompt_length import default_max_prompt_len
from slime_rollout.data.prompt_samples import rows_to_samples
from slime_rollout.data.rows import TRAINING_KEY_FLAGS, KeyFlags, has_message_prompts
from slime_rollout.data.source import get_tokenizer, load_prompt_rows
from slime_rollout.generation.generate import build_sampling_params
from slime_rollout.generation.group_rollout import RolloutState, generate_and_rm, seeded_params
from slime_rollout.runtime import async_utils
from slime_rollout.runtime.metrics import flatten_groups, pass_at_k, sample_set_metrics

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["DATASET_KEYS", "dataset_metrics", "eval_datasets", "eval_rollout", "eval_rollout_async"]

_SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "max_response_len", "min_new_tokens", "stop", "stop_token_ids",
    "repetition_penalty", "skip_special_tokens", "no_stop_trim",
)  # fmt: skip
DATASET_KEYS = frozenset(
    {
        "name",
        "path",
        "rm_type",
        "n_samples_per_eval_prompt",
        "input_key",
        "label_key",
        "tool_key",
        "metadata_key",
        "multimodal_keys",
        "apply_chat_template",
        "apply_chat_template_kwargs",
        "max_prompt_len",
        "custom_rm_path",
        "custom_generate_function_path",
        "metadata_overrides",
        *_SAMPLING_KEYS,
    }
)


def _check_keys(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(entry).__name__}")
    unknown = set(entry) - DATASET_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(DATASET_KEYS)}")
    if not isinstance(entry.get("metadata_overrides", {}), dict):
        raise ValueError(f"{where}: metadata_overrides must be a mapping, got {entry['metadata_overrides']!r:.60}")
    check_template_kwargs(entry.get("apply_chat_template_kwargs"), flag=f"{where}: apply_chat_template_kwargs")
    for key, value in entry.items():
        if isinstance(value, str) and "${" in value:
            # The original reads the file with OmegaConf, which resolves `${data_root}/aime.jsonl`; here it was the
            # literal path ("file not found: ${data_root}/aime.jsonl"), or the literal text in a stop string.
            raise ValueError(
                f"{where}: {key} {value!r:.80} holds an OmegaConf interpolation, which is not resolved here (the "
                "original reads --eval-config with OmegaConf); write the value itself"
            )
        check = _VALUE_CHECKS.get(key)
        if check is not None and value is not None and not check[0](value):
            raise ValueError(f"{where}: {key} must be {check[1]}, got {value!r:.60}")
    return dict(entry)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The values an --eval-config entry may hold, as the matching flags allow them: a typo ("4x", "hot") reached
# int() at the first eval or the engine's 400, naming no file or dataset.
_VALUE_CHECKS: dict[str, tuple[Any, str]] = {
    "n_samples_per_eval_prompt": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "max_response_len": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "max_prompt_len": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "min_new_tokens": (lambda v: _integer(v) and v >= 0, "an integer >= 0"),
    "top_k": (lambda v: _integer(v) and (v == -1 or v >= 1), "-1 (off) or an integer >= 1"),
    "temperature": (lambda v: _number(v) and v >= 0, "a number >= 0 (0: greedy)"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "repetition_penalty": (lambda v: _number(v) and v > 0, "a number > 0"),
    "apply_chat_template": (lambda v: isinstance(v, bool), "true or false"),
    "skip_special_tokens": (lambda v: isinstance(v, bool), "true or false"),
    "no_stop_trim": (lambda v: isinstance(v, bool), "true or false"),
    "stop": (lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
             "a string or a list of strings"),
    "stop_token_ids": (lambda v: isinstance(v, list) and all(_integer(x) for x in v), "a list of token ids"),
}  # fmt: skip


def _load_eval_config(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    try:
        raw = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"--eval-config file not found: {path}") from None
    except UnicodeDecodeError as e:  # it reached the user as "function takes exactly 5 arguments (1 given)"
        line = e.object[: e.start].count(b"\n") + 1
        byte = e.object[e.start]
        raise ValueError(f"--eval-config {path}:{line}: not UTF-8 (byte {byte:#04x}); re-encode it") from None
    except yaml.YAMLError as e:  # it ended the run in a traceback
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise ValueError(f"--eval-config {where}: invalid YAML ({getattr(e, 'problem', None) or e})") from None
    section = raw.get("eval", raw) if isinstance(raw, dict) else None
    if not isinstance(section, dict):
        raise ValueError(f"--eval-config {path}: expected a mapping with 'eval: {{defaults, datasets}}'")
    if "eval" in raw and (unknown := sorted(set(section) - {"defaults", "datasets"})):
        # Read by neither version: `dataset:` or `default:` (a typo) left its datasets or settings out unsaid.
        raise ValueError(f"--eval-config {path}: unknown key(s) {unknown} under eval (known: datasets, defaults)")
    defaults = _check_keys(section.get("defaults") or {}, f"--eval-config {path}: eval.defaults")
    raw_datasets = section.get("datasets") or []
    if isinstance(raw_datasets, dict):  # the original's mapping form: `datasets: {gsm8k: {path: ...}, ...}`
        raw_datasets = [{"name": name, **(entry or {})} if isinstance(entry, dict) or entry is None else entry
                        for name, entry in raw_datasets.items()]  # fmt: skip
    datasets = []
    for i, entry in enumerate(raw_datasets):
        entry = _check_keys(entry, f"--eval-config {path}: eval.datasets[{i}]")
        if not entry.get("name") or not entry.get("path"):
            raise ValueError(f"--eval-config {path}: eval.datasets[{i}] needs 'name' and 'path'")
        datasets.append(entry)
    return defaults, datasets


def _or(value: Any, fallback: Any) -> Any:
    """`value` unless it is None (an `--eval-*` flag falling back to its rollout counterpart)."""
    return value if value is not None else fallback


def eval_datasets(cfg: SlimeArgs) -> list[dict[str, Any]]:
    """The eval datasets with every setting resolved (dataset → YAML defaults → flags).

    Args:
        cfg: run config; reads `eval_prompt_data`, `eval_config`, and the flag fallbacks: `rm_type`,
            `n_samples_per_eval_prompt`, `eval_input_key` / `eval_label_key` / `eval_tool_key` (else the
            rollout's keys), `metadata_key`, `multimodal_keys`, `apply_chat_template(_kwargs)`,
            `eval_max_prompt_len` (default: `eval_max_context_len`, else the model's context, less one token:
            `slime_rollout.data.prompt_length.default_max_prompt_len`) and the eval sampling flags
            (`build_sampling_params`).

    Returns:
        One dict per dataset with the keys of `DATASET_KEYS` plus `sampling_params`, `key_flags` (the flag or
        `--eval-config` field that set each key, as errors about its rows name it: `_key_flags`) and
        `rm_type_given` (the dataset's `rm_type` came from `--eval-config`, so it overrides the rows' own).

    Raises:
        ValueError: odd `--eval-prompt-data`, duplicate names or one holding '/', a malformed `--eval-config` (or
            one without datasets, when `--eval-prompt-data` gives none either), or a dataset that nothing gives a
            response length (its `max_response_len`, `eval.defaults`', `--eval-max-response-len`,
            `--rollout-max-response-len`).
    """
    spec = list(cfg.eval_prompt_data or [])
    if len(spec) % 2:
        raise ValueError(f"--eval-prompt-data takes pairs 'name path', got {len(spec)} values: {spec}")
    defaults: dict[str, Any] = {}
    entries = from_flag = [{"name": n, "path": p} for n, p in zip(spec[0::2], spec[1::2], strict=True)]
    if cfg.eval_config:
        defaults, from_yaml = _load_eval_config(cfg.eval_config)
        if not from_yaml and not entries:
            # As the original refuses it when the config is read; here the run started and its first eval failed
            # as "eval rollout needs --eval-prompt-data name path [...] or --eval-config", with the flag given.
            raise ValueError(
                f"--eval-config {cfg.eval_config}: no datasets under eval.datasets (nor --eval-prompt-data)"
            )
        entries = from_yaml + entries
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"eval datasets: duplicate names in {names}")
    for entry in entries:
        # `eval/{name}/response_len/mean` is read back as dataset `name`'s statistic (the summary, the curve): a
        # slash would make "a/b" look like statistic "b" of a dataset "a".
        if "/" in str(entry["name"]):
            where = "--eval-prompt-data" if any(entry is e for e in from_flag) else f"--eval-config {cfg.eval_config}"
            raise ValueError(f"{where}: eval dataset name {entry['name']!r} contains '/', which metric names use "
                             "as a separator (eval/<name>/...): use e.g. '-' or '_'")  # fmt: skip

    flags = {
        "rm_type": cfg.rm_type,
        "n_samples_per_eval_prompt": cfg.n_samples_per_eval_prompt,
        "input_key": _or(cfg.eval_input_key, cfg.input_key),
        "label_key": _or(cfg.eval_label_key, cfg.label_key),
        "tool_key": _or(cfg.eval_tool_key, cfg.tool_key),
        "metadata_key": cfg.metadata_key,
        "multimodal_keys": cfg.multimodal_keys,
        "apply_chat_template": cfg.apply_chat_template,
        "apply_chat_template_kwargs": dict(cfg.apply_chat_template_kwargs),
        "max_prompt_len": default_max_prompt_len(cfg, evaluation=True),
        "custom_rm_path": None,
        "custom_generate_function_path": None,
        "metadata_overrides": {},
    }
    flag_length = _or(cfg.eval_max_response_len, cfg.rollout_max_response_len)
    resolved = []
    for entry in entries:
        dataset = {**flags, **defaults, **entry}
        # The dataset's own length (entry, then eval.defaults) comes before the flags, as the original resolves it,
        # so an eval-only run whose --eval-config gives every dataset its length needs no length flag.
        own_length = dataset.get("max_response_len")
        if own_length is None and flag_length is None:
            hint = "--eval-max-response-len or --rollout-max-response-len"
            if any(entry is e for e in from_flag):
                where = "--eval-prompt-data"
            else:
                where, hint = f"--eval-config {cfg.eval_config}", f"its max_response_len (or eval.defaults'), {hint}"
            raise ValueError(f"{where} dataset {entry['name']!r}: no response length: set {hint}")
        params = build_sampling_params(cfg, evaluation=True, max_new_tokens=own_length)
        for key in _SAMPLING_KEYS:
            if key != "max_response_len" and (key in defaults or key in entry):  # the length is in `params` already
                params[key] = dataset[key]
        dataset["sampling_params"] = params
        dataset["key_flags"] = _key_flags(cfg, defaults, entry)
        if "multimodal_keys" in entry or "multimodal_keys" in defaults:
            # The YAML's own value skips the flag's validation: a "video" key was dropped without a word.
            where = "dataset " + repr(entry["name"]) if "multimodal_keys" in entry else "eval.defaults"
            dataset["multimodal_keys"] = check_multimodal_keys(
                dataset["multimodal_keys"],
                flag=f"--eval-config {cfg.eval_config} {where} multimodal_keys",
                apply_chat_template=bool(dataset["apply_chat_template"]),
            )
        # A type the dataset names (entry or eval.defaults) overrides the rows' metadata["rm_type"], as the
        # original's EvalDatasetConfig.inject_metadata does; --rm-type only fills in for rows without one.
        dataset["rm_type_given"] = "rm_type" in entry or "rm_type" in defaults
        resolved.append(dataset)
    return resolved


def _key_flags(cfg: SlimeArgs, defaults: dict[str, Any], entry: dict[str, Any]) -> KeyFlags:
    """Which flag or `--eval-config` field set each key of one eval dataset (resolved as `eval_datasets` does).

    A row without `q` was reported as "no --input-key 'q'" when `--eval-input-key q` (or the dataset's own
    `input_key: q`) named it, sending the user to a flag that was not at fault.
    """

    def flag(key: str, eval_flag: str | None, value: Any) -> str:
        if key in entry:
            return f"--eval-config {cfg.eval_config} dataset {entry['name']!r} {key}"
        if key in defaults:
            return f"--eval-config {cfg.eval_config} eval.defaults {key}"
        return eval_flag if eval_flag and value is not None else "--" + key.replace("_", "-")

    return KeyFlags(
        input_key=flag("input_key", "--eval-input-key", cfg.eval_input_key),
        label_key=flag("label_key", "--eval-label-key", cfg.eval_label_key),
        metadata_key=flag("metadata_key", None, None),
        tool_key=flag("tool_key", "--eval-tool-key", cfg.eval_tool_key),
    )


@functools.cache
def _load_eval_prompts(path: str, input_key: str, label_key: str | None, metadata_key: str | None,
                       tool_key: str | None, hf_checkpoint: str | None, apply_chat_template: bool,
                       template_kwargs: str, max_prompt_len: int | None,
                       multimodal_keys: tuple = (),
                       key_flags: KeyFlags = TRAINING_KEY_FLAGS,
                       number_prompts: bool = False) -> tuple[Sample, ...]:  # fmt: skip
    rows = load_prompt_rows(path)
    # Message prompts are checked with the template the default generate renders them with, limit or not.
    messages = bool(hf_checkpoint) and has_message_prompts(rows, input_key)
    tokenizer = get_tokenizer(hf_checkpoint) if (apply_chat_template or max_prompt_len or messages) else None
    samples = rows_to_samples(
        rows,
        source=path,
        input_key=input_key,
        label_key=label_key,
        metadata_key=metadata_key,
        tool_key=tool_key,
        tokenizer=tokenizer,
        apply_chat_template=apply_chat_template,
        apply_chat_template_kwargs=json.loads(template_kwargs),
        max_prompt_len=max_prompt_len,
        multimodal_keys=dict(multimodal_keys) or None,
        processor_path=hf_checkpoint,
        max_prompt_len_flag="--eval-max-prompt-len",
        key_flags=key_flags,
        number_prompts=number_prompts,
    )
    return tuple(samples)


def _prompts(cfg: SlimeArgs, dataset: dict[str, Any]) -> list[Sample]:
    return list(
        _load_eval_prompts(
            str(dataset["path"]),
            dataset["input_key"],
            dataset["label_key"],
            dataset["metadata_key"],
            dataset["tool_key"],
            cfg.hf_checkpoint,
            bool(dataset["apply_chat_template"]),
            # As JSON: the cache key must be hashable, and kwargs may hold lists and dicts (a template's documents);
            # keys unsorted, since the template reads them back in that order.
            json.dumps(dict(dataset["apply_chat_template_kwargs"] or {})),
            dataset["max_prompt_len"],
            tuple(sorted(dict(dataset["multimodal_keys"] or {}).items())),
            dataset.get("key_flags", TRAINING_KEY_FLAGS),
            (dataset.get("custom_generate_function_path") or cfg.custom_generate_function_path) is not None,
        )
    )


async def _eval_dataset(
    args: SlimeArgs, dataset: dict[str, Any], state: RolloutState
) -> tuple[dict[str, Any], list[Sample]]:
    """Generates and scores one dataset: `({"rewards", "truncated", "samples"}, the ABORTED samples left out)`.

    An ABORTED sample (a generate function that marks it so, an engine that aborted the request) has no reward: it
    failed as "sample 1 has no reward yet", naming neither the dataset nor the generate function.
    """
    n = int(dataset["n_samples_per_eval_prompt"])
    samples = []
    for group_index, prompt in enumerate(_prompts(args, dataset)):
        for j in range(n):
            sample = copy.deepcopy(prompt)
            sample.group_index, sample.index = group_index, group_index * n + j
            sample.metadata.setdefault("source_name", dataset["name"])
            if dataset["rm_type"] and dataset.get("rm_type_given"):
                sample.metadata["rm_type"] = dataset["rm_type"]
            elif dataset["rm_type"]:
                sample.metadata.setdefault("rm_type", dataset["rm_type"])
            sample.metadata.update(dataset["metadata_overrides"] or {})  # the original's metadata_overrides
            sample.custom_rm_path = sample.custom_rm_path or dataset["custom_rm_path"]
            sample.generate_function_path = sample.generate_function_path or dataset["custom_generate_function_path"]
            samples.append(sample)
    params = dataset["sampling_params"]
    results = await asyncio.gather(
        *(
            generate_and_rm(
                args, s, state, seeded_params(args, state, s, params, prompt_position=s.group_index, position=s.index)
            )
            for s in samples
        )
    )
    flat = flatten_groups([list(results)])
    aborted = [s for s in flat if s.status is Status.ABORTED]
    flat = [s for s in flat if s.status is not Status.ABORTED]
    key = _or(args.eval_reward_key, args.reward_key)
    result = {
        # The reward itself, as the original's eval reads it: `metadata["raw_reward"]` is the training curve's.
        "rewards": [s.get_reward_value(key) for s in flat],
        "truncated": [s.status is Status.TRUNCATED for s in flat],
        "samples": flat,
    }
    return result, aborted


async def eval_rollout_async(args: SlimeArgs, rollout_id: int) -> RolloutFnEvalOutput:
    """Generates and scores every eval dataset concurrently.

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`); reads `eval_prompt_data`, `eval_config`,
            `n_samples_per_eval_prompt`, `eval_*` sampling/key overrides, `eval_reward_key` (else `reward_key`),
            `group_rm`, `log_passrate`, plus what generate and rewards read.
        rollout_id: the training rollout this eval follows.

    Returns:
        Per dataset `{"rewards", "truncated", "samples"}` and the `eval/*` metrics.

    Raises:
        ValueError: no eval datasets, or `--group-rm` (unsupported in eval, as in the original).
    """
    datasets = eval_datasets(args)
    if not datasets:
        raise ValueError("eval rollout needs --eval-prompt-data name path [...] or --eval-config")
    if args.group_rm:
        raise ValueError("--group-rm is not supported in eval rollouts")
    # Each dataset passes its own params; the state's are the first dataset's (flags alone may give no length).
    params = datasets[0]["sampling_params"]
    state = RolloutState.create(args, rollout_id=rollout_id, evaluation=True, sampling_params=params)
    results = await asyncio.gather(*(_eval_dataset(args, dataset, state) for dataset in datasets))
    data = {dataset["name"]: result for dataset, (result, _) in zip(datasets, results, strict=True)}
    metrics: dict[str, float] = {}
    for dataset, (name, result), (_, aborted) in zip(datasets, data.items(), results, strict=True):
        if aborted:  # counted and said: they have no reward, so they are left out of eval/{name}
            total = len(aborted) + len(result["samples"])
            metrics[f"eval/{name}-aborted_ratio"] = len(aborted) / total
            logger.warning(
                "eval %d: dataset %s: %d of %d samples came back ABORTED (from %s, or the engine aborted them; "
                "samples %s); they are left out of eval/%s",
                rollout_id, name, len(aborted), total, _generate_source(args, dataset), [s.index for s in aborted[:8]],
                name,
            )  # fmt: skip
            if not result["samples"]:
                continue
        if not result["samples"]:  # said, not silent: a dashboard would just lose the curve
            logger.warning(
                "eval %d: dataset %s has no samples (%s: every prompt was dropped, see the warning above, or the file "
                "has no rows); it has no eval/%s metric this time",
                rollout_id,
                name,
                dataset["path"],
                name,
            )
            continue
        # Left-out samples break the prompt groups pass@k is computed over (dataset_metrics says it skips it).
        group_size = 0 if aborted else int(dataset["n_samples_per_eval_prompt"])
        metrics.update(dataset_metrics(args, name, result, group_size))
    logger.info("eval %d: %s", rollout_id, {k: round(v, 4) for k, v in metrics.items() if "/" not in k[5:]})
    return RolloutFnEvalOutput(data=data, metrics=metrics)


def _generate_source(args: SlimeArgs, dataset: dict[str, Any]) -> str:
    """The generate function of an eval dataset's samples, as a message names it."""
    path = dataset.get("custom_generate_function_path")
    if path:
        return f"--eval-config dataset {dataset['name']!r} custom_generate_function_path {path}"
    if args.custom_generate_function_path:
        return f"--custom-generate-function-path {args.custom_generate_function_path}"
    return "the default generate function"


def dataset_metrics(args: SlimeArgs, name: str, result: dict[str, Any], group_size: int) -> dict[str, float]:
    """The `eval/*` metrics of one eval dataset's result, as the original's `log_eval_rollout_data` computes them.

    Args:
        args: the plugin view; reads `log_passrate`, `log_reward_category`, `use_critic`, `eval_reward_key`,
            `reward_key`.
        name: the dataset's name.
        result: `{"rewards": [float], "truncated": [bool] (optional), "samples": [Sample] (optional)}`, non-empty
            rewards.
        group_size: samples per prompt (`n_samples_per_eval_prompt`), for pass@k; 0 when the rewards are not in whole
            prompt groups (samples were left out).

    Returns:
        `eval/{name}` (mean reward), `eval/{name}-truncated_ratio`, `eval/{name}/response_len/{mean,median,max,min}`,
        `eval/{name}/repetition_frac`, `eval/{name}/truncated_ratio`, `eval/{name}/zero_std/count_{r}` (not under a
        critic estimator), with `--log-reward-category` `eval/{name}/error_cat/{c}`, with top-p replay
        `eval/{name}/top_p_kept_vocab_per_token` and with `--log-passrate` `eval/{name}-pass@{k}`, each where the
        result has what it needs.
    """
    rewards = result["rewards"]
    metrics = {f"eval/{name}": statistics.fmean(rewards)}
    if "truncated" in result and result["truncated"]:
        metrics[f"eval/{name}-truncated_ratio"] = statistics.fmean(map(float, result["truncated"]))
    if result.get("samples"):
        # The original's per-sample statistics of the set (`compute_metrics_from_samples` under `eval/{name}/`):
        # response_len/{mean,median,max,min}, repetition_frac, truncated_ratio, zero_std/count_<r> over the prompt
        # groups, error_cat/<c> (--log-reward-category), top_p_kept_vocab_per_token.
        key = _or(args.eval_reward_key, args.reward_key)
        metrics.update(sample_set_metrics(args, result["samples"], f"eval/{name}/", key))
    if args.log_passrate:
        if group_size > 0 and len(rewards) % group_size == 0:
            groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
            metrics.update({f"eval/{name}-{k}": v for k, v in pass_at_k(groups).items()})
        elif group_size <= 0:
            logger.warning("--log-passrate: eval %s left samples out (ABORTED); pass@k skipped", name)
        else:  # a fan-out generate function returned several samples per prompt
            logger.warning(
                "--log-passrate: eval %s has %d samples for groups of %d; skipped", name, len(rewards), group_size
            )
    return metrics


def eval_rollout(args: SlimeArgs, rollout_id: int) -> RolloutFnEvalOutput:
    """Synchronous `eval_rollout_async` (what `generate_rollout(..., evaluation=True)` returns)."""
    return async_utils.run(eval_rollout_async(args, rollout_id))
