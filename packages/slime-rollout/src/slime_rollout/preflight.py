"""slime-rollout's pre-launch checks of its own flags: prompt data, chat template, images, SGLang/router flags.

`check(cfg)` is this package's `slime.preflight` entry point; the app's preflight runs it (and every other
installed package's) before anything starts, so a bad row or flag is one line naming it, not a failure in the
middle of a rollout. Each bad row names the flag, the file and where the row is (its JSONL line, 1-based with
blank lines counted; its Parquet row index, 0-based; see `slime_rollout.data.prompt_rows.PromptRows`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slime_core.config.base import ConfigError, field_to_flag
from slime_core.config.validation_multimodal import check_multimodal
from slime_core.extensions import REWARDS
from slime_core.registry import Problem
from slime_rollout.data import multimodal
from slime_rollout.data.chat_template import unread_template_kwargs
from slime_rollout.data.prompt_length import engine_context_len, sglang_context_arg
from slime_rollout.data.prompt_rows import PromptRows, load_prompt_rows
from slime_rollout.data.rows import (
    TRAINING_KEY_FLAGS,
    KeyFlags,
    messages_from_json,
    prompt_problem,
    row_metadata,
    row_tools,
)
from slime_rollout.data.sft import conversation_problem
from slime_rollout.data.sft_preflight import is_sft, sft_problems
from slime_rollout.data.source import DEFAULT_DATA_SOURCES, TOKENIZER_FILES, get_tokenizer
from slime_rollout.generation.preflight import (
    env_path_problems,
    partial_rollout_without_buffer,
    stop_problems,
    zero_std_filter_on_single_samples,
)
from slime_rollout.plugins import eval_function, load_function
from slime_rollout.rewards.label_checks import check_label_type, check_label_value, label_required, row_reward
from slime_rollout.rewards.preflight import row_reward_problems

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = ["check", "check_prompt_rows"]

# Where the pass-through flags go: `--sglang-<field>` to SGLang's ServerArgs, `--router-<field>` to sglang-router's
# RouterArgs (both dataclasses; the original slime builds its `--sglang-*` flags from the same fields).
_PASS_THROUGH_TARGETS = (
    ("sglang_args", "--sglang-", "sglang.srt.server_args", "ServerArgs"),
    ("router_args", "--router-", "sglang_router.router_args", "RouterArgs"),
)


def check(cfg: SlimeArgs) -> list[Problem]:
    """Every check of this package's flags; errors and notes as `Problem`s (the app raises the errors).

    Args:
        cfg: the validated config; reads `rm_type`, `rm_url`, `custom_rm_path`, `apply_chat_template`,
            `hf_checkpoint`, `multimodal_keys`, `sglang_args`, `router_args`, `prompt_data`,
            `load_debug_rollout_data`, `eval_datasets` and the keys `check_prompt_rows` reads.

    Returns:
        The problems: `FileNotFoundError` ones for a missing data file or image processor, `ValueError` ones for a
        malformed file or row, a remote reward without `--rm-url`, a missing chat template or an unknown
        `--sglang-*`/`--router-*` flag; notes for what could not be checked here.
    """
    problems = _reward_url(cfg) + _tokenizer_files(cfg) + _chat_template(cfg) + _image_processor(cfg)
    problems += _length_limits(cfg)
    problems += _pass_through_flags(cfg) + _group_rm_eval(cfg) + zero_std_filter_on_single_samples(cfg)
    problems += _response_budget(cfg) + _no_prompts_to_generate(cfg) + partial_rollout_without_buffer(cfg)
    problems += env_path_problems(cfg) + stop_problems(cfg)
    files = (
        []
        if not cfg.prompt_data or cfg.load_debug_rollout_data
        else [("--prompt-data", cfg.prompt_data, cfg, TRAINING_KEY_FLAGS, None)]
    )
    try:
        files += _eval_files(cfg)
    except (FileNotFoundError, ValueError) as e:  # a malformed --eval-prompt-data / --eval-config
        # Not type(e): a subclass such as UnicodeDecodeError cannot be built from one message.
        problems.append(Problem(message=str(e), exception=FileNotFoundError if isinstance(e, OSError) else ValueError))
    for flag, spec, file_cfg, key_flags, rm_type_override in files:
        if file_cfg.multimodal_keys and file_cfg.multimodal_keys != cfg.multimodal_keys:
            problems += _own_multimodal_keys(cfg, file_cfg.multimodal_keys, f"{flag} multimodal_keys")
        try:
            rm_types = _check_rows(spec, file_cfg, flag, key_flags, rm_type_override)
            problems += row_reward_problems(file_cfg, rm_types, f"{flag} {spec}", evaluation=flag != "--prompt-data",
                                            checked=cfg.rm_type)  # fmt: skip
        except FileNotFoundError as e:
            problems.append(Problem(message=str(e), exception=FileNotFoundError))
        except ValueError as e:  # a malformed file, row or image: one problem per file (its first bad row)
            problems.append(Problem(message=str(e)))
    return problems


def _response_budget(cfg: SlimeArgs) -> list[Problem]:
    """A built-in training rollout without `--rollout-max-response-len`, refused before the run starts.

    Its engine requests need the budget (SGLang's `max_new_tokens`; the original subtracted from None): the run
    started Ray, the engines and the trainer, then stopped at its first rollout. Replayed or trainer-only runs send no
    request.
    """
    if cfg.rollout_max_response_len is not None or cfg.load_debug_rollout_data or cfg.debug_train_only:
        return []
    if cfg.num_rollout == 0:
        return []  # an eval-only run: the eval files' check asks for its budget (--eval-max-response-len or this)
    if not _built_in_rollout(cfg):
        return []  # a custom rollout function decides its own requests
    return [Problem(message=(
        f"--rollout-max-response-len is not set: the rollout ({cfg.rollout_function_path}) sends it to the engines as "
        "max_new_tokens; give the longest response to generate, e.g. --rollout-max-response-len 1024"
    ))]  # fmt: skip


def _built_in_rollout(cfg: SlimeArgs) -> bool:
    """Whether `--rollout-function-path` is one of this package's training rollouts (default or fully async)."""
    # Imported here, as in _eval_files: the generation stack costs about 1.3 s cold, and only these checks need it.
    from slime_rollout.generation.fully_async import generate_rollout_fully_async
    from slime_rollout.generation.rollout import generate_rollout

    try:
        fn = load_function(cfg.rollout_function_path, flag="--rollout-function-path")
    except Exception:  # noqa: BLE001 - a plugin that cannot be imported is the app's plugin check's problem
        return False
    return fn in (generate_rollout, generate_rollout_fully_async)


def _no_prompts_to_generate(cfg: SlimeArgs) -> list[Problem]:
    """`--disable-rollout-global-dataset` where nothing makes the prompts (the data source serves empty ones).

    The default generate function sent them as they were: the run stopped at rollout 0 on the engine's "the prompt
    is empty" (the original's default rollout asserts `rollout_global_dataset` there).
    """
    if not cfg.disable_rollout_global_dataset or cfg.custom_generate_function_path or cfg.num_rollout == 0:
        return []
    replayed = cfg.load_debug_rollout_data or cfg.debug_train_only
    if replayed or cfg.data_source_path not in DEFAULT_DATA_SOURCES or not _built_in_rollout(cfg):
        return []
    return [Problem(message=(
        "--disable-rollout-global-dataset: the data source serves empty prompts, which the default generate function "
        "would send to the engines as they are; give --custom-generate-function-path (it makes each prompt), a "
        "--data-source-path or a --rollout-function-path, or drop the flag and give --prompt-data"
    ))]  # fmt: skip


def _group_rm_eval(cfg: SlimeArgs) -> list[Problem]:
    """`--group-rm` with evals run by the built-in eval rollout, which refuses it (as the original's asserts).

    It stopped the run at its first eval (after `--eval-interval` rollouts of training), not before it started.
    """
    if not (cfg.group_rm and cfg.eval_interval is not None):
        return []
    # Imported here, as in _eval_files: the generation stack costs about 1.3 s cold, and only this case needs it.
    from slime_rollout.generation.rollout import generate_rollout

    found = eval_function(cfg)
    if found is None or found[1] is not generate_rollout:
        return []
    return [Problem(message=(
        "--group-rm is not supported by the built-in eval rollout (as in the original), and --eval-interval "
        f"{cfg.eval_interval} runs it: drop --group-rm, the eval datasets, or give --eval-function-path"
    ))]  # fmt: skip


def _eval_files(cfg: SlimeArgs) -> list[tuple[str, str, SlimeArgs, KeyFlags, str | None]]:
    """Each eval dataset's file with the config its rows are read and graded with (`generation.eval.eval_datasets`).

    An eval dataset has its own keys and reward (`--eval-input-key`, `--eval-label-key`, an `--eval-config`
    dataset's `input_key`, `rm_type`, ...): checked with the training keys, a valid eval file was refused ("no
    --input-key 'q'") and an `--eval-config` dataset's file was not checked at all. Its messages name the flag
    that set each key (`--eval-input-key`, the dataset's `input_key`), not the training one.
    """
    if not (cfg.eval_prompt_data or cfg.eval_config):
        return []
    # Imported here: the eval module pulls in the generation stack (about 1.3 s cold), which runs without eval data
    # do not need.
    from slime_rollout.generation.eval import eval_datasets

    files = []
    for dataset in eval_datasets(cfg):
        flag = "--eval-prompt-data" if [dataset["name"], dataset["path"]] in _pairs(cfg.eval_prompt_data) else (
            f"--eval-config {cfg.eval_config} dataset {dataset['name']!r}"
        )  # fmt: skip
        names = ("input_key", "label_key", "metadata_key", "tool_key", "rm_type", "multimodal_keys")
        keys = {key: dataset[key] for key in names}
        keys["custom_rm_path"] = dataset["custom_rm_path"] or cfg.custom_rm_path
        # An --eval-config dataset's own rm_type grades every row, whatever the row's metadata names (eval.py).
        override = dataset["rm_type"] if dataset["rm_type_given"] else None
        files.append((flag, str(dataset["path"]), cfg.model_copy(update=keys), dataset["key_flags"], override))
    return files


def _pairs(values: Sequence[str] | None) -> list[list[str]]:
    values = list(values or [])
    return [list(pair) for pair in zip(values[0::2], values[1::2], strict=False)]


def _reward_url(cfg: SlimeArgs) -> list[Problem]:
    """A reward whose record says `needs_url` cannot score anything without `--rm-url`."""
    if not cfg.rm_type or cfg.custom_rm_path or cfg.rm_url:
        return []
    if not REWARDS.get(cfg.rm_type.removeprefix("boxed_")).needs_url:
        return []
    return [Problem(message=f"--rm-type {cfg.rm_type} calls a reward service: set --rm-url http://host:port/path")]


def _tokenizer_files(cfg: SlimeArgs) -> list[Problem]:
    """A local `--hf-checkpoint` must hold tokenizer files: without them transformers builds an empty tokenizer."""
    root = pathlib.Path(cfg.hf_checkpoint or "")
    if not cfg.hf_checkpoint or not (root / "config.json").is_file():
        return []  # not a local model directory: the flag's own check reports it
    if any((root / name).is_file() for name in TOKENIZER_FILES):
        return []
    return [
        Problem(
            message=f"--hf-checkpoint {root}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); every prompt would "
            "be encoded by an empty tokenizer; copy them from the model the checkpoint came from",
            exception=FileNotFoundError,
        )
    ]


def _length_limits(cfg: SlimeArgs) -> list[Problem]:
    """Length flags above the engine's context: the prompts they keep leave no room to generate.

    The default limit is the context less one token (`data.prompt_length.default_max_prompt_len`); a flag set above
    it kept prompts longer than the model's context, which the run trained on with 1-token responses. The context is
    `--sglang-context-length` when given (a model extended with RoPE scaling), else `max_position_embeddings` of a
    local `--hf-checkpoint`.
    """
    try:
        context = engine_context_len(cfg.hf_checkpoint, cfg.sglang_args)
    except ValueError as e:  # the flag is not a number, or a damaged config.json (the model loader names it too)
        return [Problem(message=str(e))]
    if context is None:
        return []
    engine = sglang_context_arg(cfg.sglang_args) is not None
    source = "--sglang-context-length" if engine else f"max_position_embeddings in {cfg.hf_checkpoint}/config.json"
    problems = []
    for context_flag, prompt_flag in (("rollout_max_context_len", "rollout_max_prompt_len"),
                                      ("eval_max_context_len", "eval_max_prompt_len")):  # fmt: skip
        given_context, given_prompt = getattr(cfg, context_flag), getattr(cfg, prompt_flag)
        if problems and context_flag == "eval_max_context_len" and given_context == cfg.rollout_max_context_len:
            continue  # derived from --rollout-max-context-len, already named
        if given_context is not None and given_context > context:
            flag, value, limit = field_to_flag(context_flag), given_context, context
        elif given_prompt is not None and given_prompt > context - 1:
            flag, value, limit = field_to_flag(prompt_flag), given_prompt, context - 1
        else:
            continue
        problems.append(
            Problem(
                message=f"{flag} {value} is more than the engine's context allows ({limit}; the context is {context} "
                f"tokens: {source}): a longer prompt leaves no room to generate; lower {flag}, or leave it out "
                "(prompts longer than the context less one token are then dropped)"
                + ("" if engine else ", or give the engine a longer one with --sglang-context-length")
            )
        )
    return problems


def _chat_template(cfg: SlimeArgs) -> list[Problem]:
    """A chat template where the run renders one; `--apply-chat-template` or eval data with the SFT rollout.

    `--apply-chat-template-kwargs` without `--apply-chat-template` is a note: as in the original only the data
    source's rendering reads them, so `{"enable_thinking": false}` left message prompts (which the default generate
    function renders) and SFT conversations in thinking mode, unannounced.
    """
    sft = is_sft(cfg)
    found = sft_problems(cfg) if sft else []
    if cfg.apply_chat_template_kwargs and not cfg.apply_chat_template:
        found.append(Problem(severity="note", message=(
            f"--apply-chat-template-kwargs {json.dumps(cfg.apply_chat_template_kwargs)} has no effect without "
            "--apply-chat-template (message prompts and SFT conversations are rendered without them)"
        )))  # fmt: skip
    if sft and cfg.apply_chat_template:
        return found  # sft_problems named it
    kwargs = dict(cfg.apply_chat_template_kwargs)
    if kwargs and cfg.apply_chat_template and cfg.hf_checkpoint and _has_chat_template(cfg.hf_checkpoint):
        try:
            unread = unread_template_kwargs(get_tokenizer(cfg.hf_checkpoint), kwargs)
        except (OSError, ValueError):  # no readable tokenizer there: _tokenizer_files names what is missing
            unread = None
        found += [Problem(severity="note", message=(
            f"--apply-chat-template-kwargs: the chat template of --hf-checkpoint {cfg.hf_checkpoint} reads no "
            f"{', '.join(map(repr, unread))}, so it has no effect on the prompts (check the spelling and the model)"
        ))] if unread else []  # fmt: skip
    if not ((cfg.apply_chat_template or sft) and cfg.hf_checkpoint) or _has_chat_template(cfg.hf_checkpoint):
        return found
    flag = "--apply-chat-template" if cfg.apply_chat_template else f"--loss-mask-type {cfg.loss_mask_type} (SFT)"
    return found + [
        Problem(
            message=f"{flag}: the tokenizer of --hf-checkpoint {cfg.hf_checkpoint} has no chat template (no "
            "'chat_template' in tokenizer_config.json, no chat_template.jinja); add one"
            + (" or drop the flag" if cfg.apply_chat_template else "")
        )
    ]


def _has_chat_template(model_dir: str) -> bool:
    """Whether the HF tokenizer files in `model_dir` carry a chat template (True when it cannot tell)."""
    if any(os.path.exists(os.path.join(model_dir, f)) for f in ("chat_template.jinja", "chat_template.json")):
        return True
    config = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.exists(config):
        return True  # no tokenizer files here: the tokenizer's own loader reports that
    with open(config, encoding="utf-8") as f:
        return bool(json.load(f).get("chat_template"))


def _image_processor(cfg: SlimeArgs, keys: Any = None, flag: str = "--multimodal-keys") -> list[Problem]:
    """`--hf-checkpoint` has an image processor when `keys` (default: the flag's) name an image column."""
    keys = cfg.multimodal_keys if keys is None else keys
    if not (keys and cfg.hf_checkpoint) or _has_image_processor(cfg.hf_checkpoint):
        return []
    message = (
        f"{flag}: --hf-checkpoint {cfg.hf_checkpoint} has no preprocessor_config.json "
        "(no image processor: not a vision-language checkpoint)"
    )
    return [Problem(message=message, exception=FileNotFoundError)]


def _own_multimodal_keys(cfg: SlimeArgs, keys: dict[str, str], flag: str) -> list[Problem]:
    """An eval dataset's own `multimodal_keys` get the flag's checks: the checkpoint's processor and the backend.

    On a run without `--multimodal-keys` they were skipped: a text-only checkpoint failed at the first eval.
    """
    try:
        check_multimodal(cfg, keys=keys, flag=flag)
    except ConfigError as e:
        return [Problem(message=str(e))]
    return _image_processor(cfg, keys, flag)


def _has_image_processor(model_dir: str) -> bool:
    """Whether `model_dir` holds an image processor config (a vision-language checkpoint's processor)."""
    names = ("preprocessor_config.json", "processor_config.json")
    if not any(os.path.exists(os.path.join(model_dir, n)) for n in names):
        return False
    if os.path.exists(os.path.join(model_dir, "preprocessor_config.json")):
        return True
    with open(os.path.join(model_dir, "processor_config.json"), encoding="utf-8") as f:
        return "image_processor" in json.load(f)


def _dataclass_fields(module_name: str, class_name: str) -> set[str] | None:
    """Field names of a dataclass of an installed package, or None when it cannot be imported here."""
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
        return {f.name for f in dataclasses.fields(cls)}
    except Exception:  # not installed (CPU runs), or an engine environment other than the driver's
        return None


def _pass_through_flags(cfg: SlimeArgs) -> list[Problem]:
    """`--sglang-*` / `--router-*` names against the installed SGLang / sglang-router, as the original checks them.

    A flag the target does not have is an error (naming it, with the closest match); a target that is not
    installed where the driver runs is a note.
    """
    problems = []
    for field, prefix, module_name, class_name in _PASS_THROUGH_TARGETS:
        given = getattr(cfg, field)
        if not given:
            continue
        known = _dataclass_fields(module_name, class_name)
        if known is None:
            problems.append(Problem(message=f"{prefix}* flags not checked: {module_name} is not importable here",
                                    severity="note"))  # fmt: skip
            continue
        for key in given:
            name = key.replace("-", "_").removeprefix("router_") if field == "router_args" else key.replace("-", "_")
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"; did you mean {prefix}{close[0].replace('_', '-')}?" if close else ""
                problems.append(Problem(
                    message=f"{prefix}{key.replace('_', '-')}: {module_name}.{class_name} has no field {name!r}{hint}"
                ))  # fmt: skip
    return problems


def _check_rows(
    spec: str, cfg: SlimeArgs, flag: str, key_flags: KeyFlags = TRAINING_KEY_FLAGS, rm_type_override: str | None = None
) -> set[str]:
    """Loads one prompt file named by `flag`, checks its rows (and images): returns their reward types.

    `rm_type_override`: the reward type that grades every row (an `--eval-config` dataset's), or None.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file, a row or an image is malformed (the message names the flag, file and row).
    """
    try:
        located = load_prompt_rows(spec)
    except FileNotFoundError:
        raise FileNotFoundError(f"{flag}: file not found: {spec}") from None
    except ValueError as e:  # e.g. "file.jsonl:5: invalid JSON": say which flag named the file
        raise ValueError(f"{flag}: {e}") from None
    if not located:
        raise ValueError(f"{flag} {spec}: no rows")
    rm_types = check_prompt_rows(located, cfg, where=f"{flag} {spec}", key_flags=key_flags,
                                 rm_type_override=rm_type_override)  # fmt: skip
    image_key = multimodal.image_column(cfg.multimodal_keys)
    if not image_key:
        return rm_types
    base_dir = pathlib.Path(spec.split("@[", 1)[0]).parent
    num_images = 0
    for position, row in zip(located.positions, located, strict=True):
        where = f"{flag} {spec} {located.unit} {position} (--multimodal-keys column {image_key!r})"
        num_images += multimodal.check_row_images(
            row, input_key=cfg.input_key, image_key=image_key, base_dir=base_dir, where=where
        )
    logger.info("%s %s: %d rows, %d images decoded", flag, spec, len(located), num_images)
    return rm_types


def check_prompt_rows(
    rows: Sequence[Mapping[str, Any]],
    cfg: SlimeArgs,
    *,
    where: str,
    key_flags: KeyFlags = TRAINING_KEY_FLAGS,
    rm_type_override: str | None = None,
) -> set[str]:
    """Checks every row of a prompt file before the run starts; returns the reward types its rows name.

    The `--input-key` must be there and not empty; a reward that compares with the label (its record's
    `grades_label`: the built-in graders) needs a `--label-key`, which must be there and not null; a row's own
    reward (`metadata["rm_type"]`, which overrides `--rm-type`) must be registered, as `--rm-type` is. With the SFT
    rollout, each training row must be a conversation it can train on (`data.sft.conversation_problem`): found at
    the rollout that reached it, a bad row stopped the run there, named by its sample index only.

    Args:
        rows: the rows of one data file (`load_prompt_rows`: named by line or row index; plain rows: "row N").
        cfg: run config; reads `input_key`, `label_key`, `metadata_key`, `tool_key`, `rm_type`, `custom_rm_path`.
        where: `"{flag} {path}"` for the messages.
        key_flags: the flags that set the keys, as messages name them (an eval dataset's: `--eval-input-key`, ...).
        rm_type_override: the reward type that grades every row over its `metadata["rm_type"]` (an `--eval-config`
            dataset's `rm_type`, as the eval rollout applies it), or None.

    Raises:
        ValueError: naming `where`, the row and the problem.
    """
    located = PromptRows.of(rows)
    sft = key_flags is TRAINING_KEY_FLAGS and is_sft(cfg)  # SFT conversations (an SFT run has no eval)
    rm_types: set[str] = set()
    for position, row in zip(located.positions, located, strict=True):
        at = f"{where} {located.unit} {position}"
        if cfg.input_key not in row:
            raise ValueError(f"{at}: no {key_flags.input_key} {cfg.input_key!r} (keys: {sorted(row)})")
        value = row[cfg.input_key]
        # conversation_problem runs prompt_problem first (each SFT row's text was checked twice).
        if not sft:
            value = messages_from_json(value) or value  # JSON text of messages: read as the data source reads it
        problem = (conversation_problem(value, cfg.loss_mask_type, cfg.input_key) if sft
                   else prompt_problem(value, cfg.input_key, key_flags.input_key))  # fmt: skip
        if problem is not None:
            raise ValueError(f"{at}: {problem}")
        # Read once per row, as the data source reads them; these raise naming the row.
        metadata = row_metadata(dict(row), cfg.metadata_key, at, key_flags.metadata_key)
        row_tools(dict(row), cfg.tool_key, at, key_flags.tool_key)
        if sft:
            continue  # the SFT rollout grades nothing: its rows need no label
        if rm_type_override:
            metadata = {**metadata, "rm_type": rm_type_override}
        rm_type, spec = row_reward(cfg, metadata, at)  # the reward that scores the row
        rm_types.add(rm_type)
        required = label_required(spec, metadata)
        if not cfg.label_key:
            if required:  # every sample's label would be None: graded against nothing
                raise ValueError(
                    f"{at}: --rm-type {rm_type} grades against a label, but no "
                    f"{key_flags.label_key} is set (name the column that holds the answer)"
                )
        else:
            if cfg.label_key not in row:
                raise ValueError(f"{at}: no {key_flags.label_key} {cfg.label_key!r} (keys: {sorted(row)})")
            label = row[cfg.label_key]
            if label is None and required:
                raise ValueError(
                    f"{at}: null {key_flags.label_key} {cfg.label_key!r}, which --rm-type {rm_type} grades against"
                )
            check_label_type(spec, label, at, key_flags.label_key, cfg.label_key)
            if label is not None and required:
                check_label_value(spec, label, rm_type, at, key_flags.label_key, cfg.label_key)
    return rm_types
