"""Pre-launch checks of the rollout's flags: the dynamic filter, partial rollout, the env, the stop strings and ids.

Run by `slime_rollout.preflight.check` (so by `--dry-run` too): a combination that fails at the end of the first
rollout is one line before anything starts.
"""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING

from slime_core.registry import Problem
from slime_rollout.data.source import RolloutDataSource
from slime_rollout.plugins import load_function

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = [
    "env_path_problems",
    "partial_rollout_without_buffer",
    "stop_problems",
    "zero_std_filter_on_single_samples",
]


def partial_rollout_without_buffer(cfg: SlimeArgs) -> list[Problem]:
    """`--partial-rollout` with the default rollout and a data source that keeps no buffer, when groups are left over.

    The default rollout hands the unfinished groups of each rollout back with `add_samples`, which
    `RolloutDataSource` (and any subclass keeping its `add_samples`) refuses. Groups are left over when more are
    generated than a batch takes: `--over-sampling-batch-size` above `--rollout-batch-size`, or a dynamic filter
    whose drops are refilled by a whole `--over-sampling-batch-size`. Without either, none are (the flag is then
    harmless), and the fully-async rollout keeps its unfinished groups itself: neither is refused.
    """
    if not cfg.partial_rollout or cfg.num_rollout == 0 or cfg.load_debug_rollout_data or cfg.debug_train_only:
        return []
    surplus = cfg.over_sampling_batch_size > cfg.rollout_batch_size or cfg.dynamic_sampling_filter_path
    if not surplus:
        return []
    # Imported here, as in slime_rollout.preflight: the generation stack costs about 1.3 s cold.
    from slime_rollout.generation.rollout import generate_rollout

    try:
        rollout_fn = load_function(cfg.rollout_function_path, flag="--rollout-function-path")
        source = load_function(cfg.data_source_path, flag="--data-source-path")
    except Exception:  # noqa: BLE001 - a plugin that cannot be imported is the app's plugin check's problem
        return []
    bufferless = isinstance(source, type) and getattr(source, "add_samples", None) is RolloutDataSource.add_samples
    if rollout_fn is not generate_rollout or not bufferless:
        return []
    why = (
        f"--over-sampling-batch-size {cfg.over_sampling_batch_size} > --rollout-batch-size {cfg.rollout_batch_size}"
        if cfg.over_sampling_batch_size > cfg.rollout_batch_size
        else f"--dynamic-sampling-filter-path {cfg.dynamic_sampling_filter_path} refills what it drops"
    )
    return [Problem(message=(
        f"--partial-rollout hands each rollout's unfinished groups back to the data source ({why}), which "
        f"--data-source-path {cfg.data_source_path} cannot keep (it has no buffer): use "
        "slime.rollout.data_source.RolloutDataSourceWithBuffer (the default), or drop --partial-rollout"
    ))]  # fmt: skip


def zero_std_filter_on_single_samples(cfg: SlimeArgs) -> list[Problem]:
    """`check_reward_nonzero_std` with `--n-samples-per-prompt 1`, refused.

    A group of one has no spread, so every group is dropped and the rollout could only stop after
    `--dynamic-sampling-max-empty-rounds` refills (the original samples forever).
    """
    path = cfg.dynamic_sampling_filter_path
    if not path or cfg.n_samples_per_prompt != 1:
        return []
    # Imported here, as in slime_rollout.preflight: the generation stack costs about 1.3 s cold, and only this case
    # needs it.
    from slime_rollout.generation.filters import check_reward_nonzero_std

    try:
        fn = load_function(path, flag="--dynamic-sampling-filter-path")
    except Exception:  # noqa: BLE001 - a plugin that cannot be imported is the app's plugin check's problem
        return []
    if fn is not check_reward_nonzero_std:
        return []
    return [Problem(message=(
        f"--dynamic-sampling-filter-path {path} drops every group of --n-samples-per-prompt 1 (one reward has no "
        "spread), so no rollout could fill its batch: use --n-samples-per-prompt 2 or more, or another filter"
    ))]  # fmt: skip


def env_path_problems(cfg: SlimeArgs) -> list[Problem]:
    """`--env-path` must name an installed environment or an importable factory.

    A multi-turn generate function looks it up for its first sample, after Ray, the engines and the trainer started;
    an unknown name ended the run there. Without a `--custom-generate-function-path` the flag has no effect (a
    warning says so when the config is read) and is not looked up.
    """
    if not cfg.env_path or not cfg.custom_generate_function_path:
        return []
    # Imported here: the generation stack costs about 1.3 s cold, and only runs with an env need it.
    from slime_rollout.generation.multi_turn import env_factory

    try:
        env_factory(cfg.env_path)
    except KeyError as e:
        return [Problem(message=str(e.args[0]) if e.args else str(e))]
    except ImportError as e:  # PluginError is one; the flag is named by the loader or here
        message = str(e)
        return [Problem(message=message if "--env-path" in message else f"--env-path {cfg.env_path}: {message}")]
    return []


def stop_problems(cfg: SlimeArgs) -> list[Problem]:
    """`--rollout-stop` strings and `--rollout-stop-token-ids` that cannot stop a response as meant.

    Both go to every engine request (`build_sampling_params`). SGLang finds an empty stop string in any text, so each
    response ended after its first token (`--rollout-stop ""`, from a script's unset variable); an id below 0 or past
    the model's vocabulary (`vocab_size` of `--hf-checkpoint`'s config.json) is never sampled, so it stopped nothing.
    Neither was said.
    """
    problems = []
    if "" in (cfg.rollout_stop or []):
        problems.append(Problem(message=(
            f"--rollout-stop {cfg.rollout_stop}: an empty stop string is found in any text, so the engines end every "
            "response after its first token; drop it"
        )))  # fmt: skip
    vocab = _vocab_size(cfg.hf_checkpoint)
    never = [i for i in cfg.rollout_stop_token_ids or [] if i < 0 or (vocab is not None and i >= vocab)]
    if never:
        within = f"0 to {vocab - 1}, the vocabulary of --hf-checkpoint" if vocab is not None else "0 or more"
        problems.append(Problem(message=(
            f"--rollout-stop-token-ids {never}: not token ids the model samples ({within}), so they stop nothing; "
            "give the ids of the stop tokens (tokenizer.convert_tokens_to_ids)"
        )))  # fmt: skip
    return problems


def _vocab_size(hf_checkpoint: str | None) -> int | None:
    """`vocab_size` of a local checkpoint's config.json (a multimodal model's `text_config`), or None."""
    path = pathlib.Path(hf_checkpoint or "") / "config.json"
    if not hf_checkpoint or not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # an unreadable config.json is named by the checks that need it
        return None
    for part in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        if isinstance(part, dict) and isinstance(part.get("vocab_size"), int):
            return part["vocab_size"]
    return None
