"""Prompt data sources (`--data-source-path`, default `RolloutDataSourceWithBuffer`).

Reads `--prompt-data` (JSONL or Parquet, optional `path@[start:end]` row slice), builds one `Sample` per prompt
(`data.prompt_samples`: chat template applied if `--apply-chat-template`; with `--multimodal-keys` the row's images are
checked, kept in `Sample.multimodal_inputs` and placed by the processor's template), drops prompts longer than
`--rollout-max-prompt-len` tokens (by default the model's context less one token, `default_max_prompt_len`; each
dropped row is named in one counted warning), shuffles per epoch as the original does (`data.epoch_order`), and
hands out groups of `n_samples_per_prompt` copies with fresh `group_index`/`index`. Partial groups returned by
the rollout (`add_samples`) are served first. The cursor is saved with the checkpoint so a resumed run
sees exactly the prompts it would have seen.
"""

from __future__ import annotations

import copy
import logging
import os
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from slime_core.checkpoint_dirs import save_root
from slime_core.plugins import PluginError
from slime_core.sample import Sample
from slime_rollout.data.buffer_filter import take_from_buffer
from slime_rollout.data.cursor_file import (
    cursor_path,
    keep_groups_of_size,
    read_cursor,
    resumed_epoch_flags,
    warn_other_prompt_count,
    write_cursor,
)
from slime_rollout.data.epoch_order import LEGACY_NUMPY, ORIGINAL, epoch_order
from slime_rollout.data.prompt_length import default_max_prompt_len, encode_prompt
from slime_rollout.data.prompt_rows import PromptRows, count_rows, load_prompt_rows
from slime_rollout.data.prompt_samples import rows_to_samples
from slime_rollout.data.rows import has_message_prompts
from slime_rollout.data.sft import generate_sft_rollout
from slime_rollout.data.tokenizer import TOKENIZER_FILES, get_tokenizer
from slime_rollout.plugins import load_function
from slime_rollout.runtime.deadlines import call_in_thread_with_deadline, plugin_bounds

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DATA_SOURCES",
    "RolloutDataSource",
    "RolloutDataSourceWithBuffer",
    "TOKENIZER_FILES",  # re-exported from `slime_rollout.data.tokenizer`, as is `get_tokenizer`
    "count_prompts",
    "get_tokenizer",
    "encode_prompt",  # re-exported from `slime_rollout.data.prompt_length` (generate functions import it from here)
    "PromptRows",  # re-exported from `slime_rollout.data.prompt_rows`, as is `load_prompt_rows`
    "load_prompt_rows",
    "rows_to_samples",  # re-exported from `slime_rollout.data.prompt_samples` (eval, the dry run, users' code)
]


#: `--data-source-path` values of this module's data sources (the default, and the one without a buffer).
DEFAULT_DATA_SOURCES = frozenset(
    f"slime_rollout.data.source.{name}" for name in ("RolloutDataSource", "RolloutDataSourceWithBuffer")
)


def count_prompts(args: SlimeArgs) -> int:
    """Number of prompts one epoch of the run's data source serves (what `--num-epoch` multiplies).

    The default data sources without a prompt-length limit (`default_max_prompt_len`) serve every row: the rows are
    counted (a parquet file's metadata, a JSONL file's non-blank lines) without building samples. Otherwise the
    data source is built as the run will build it and asked for its `len()`.

    Args:
        args: the plugin view; reads `prompt_data`, `data_source_path`, `rollout_max_prompt_len`,
            `rollout_max_context_len`, `hf_checkpoint` (+ what the data source reads).

    Raises:
        TypeError: a custom data source without `__len__`.
    """
    limit = default_max_prompt_len(args)
    if args.data_source_path in DEFAULT_DATA_SOURCES and limit is None and args.prompt_data:
        return count_rows(args.prompt_data)
    cls = load_function(args.data_source_path, flag="--data-source-path")
    what = f"the data source's construction (--data-source-path {args.data_source_path}), counting --num-epoch"
    source = call_in_thread_with_deadline(cls, args, what=what, **plugin_bounds(args))
    if not hasattr(source, "__len__"):
        raise TypeError(f"--num-epoch: the data source {args.data_source_path} has no len(); give --num-rollout")
    return len(source)


def _serves_sft(args: Any) -> bool:
    """Whether `--rollout-function-path` is the SFT rollout, which trains on each row's whole conversation."""
    try:
        return load_function(args.rollout_function_path, flag="--rollout-function-path") is generate_sft_rollout
    except PluginError:  # a bad path is the plugin check's error, reported where the rollout function is loaded
        return False


def _needs_tokenizer(args: Any, max_prompt_len: int | None, rows: Sequence[dict[str, Any]]) -> bool:
    """Whether reading `rows` needs the `--hf-checkpoint` tokenizer: to template or measure prompts, or to check them.

    Message prompts are rendered by the default generate function even without `--apply-chat-template`, so they are
    checked with the template while read (`rows_to_samples`); without a length limit (a config without
    `max_position_embeddings`) no tokenizer was loaded and a role the template drops reached the engine unchecked.

    Args:
        args: reads `apply_chat_template`, `hf_checkpoint`, `input_key` (an eval dataset's: the caller's view).
        max_prompt_len: the limit in force, or None.
        rows: the rows to read.
    """
    if args.apply_chat_template or max_prompt_len:
        return True
    return bool(args.hf_checkpoint) and has_message_prompts(rows, args.input_key)


class RolloutDataSource:
    """The global prompt dataset with an epoch/offset cursor (original `RolloutDataSource`).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`; a data source is a `--data-source-path` plugin,
            built as `cls(args)`); reads `prompt_data`, `input_key`, `label_key`, `metadata_key`, `tool_key`,
            `multimodal_keys`, `apply_chat_template`, `apply_chat_template_kwargs`, `rollout_max_prompt_len`
            (default: `slime_rollout.data.prompt_length.default_max_prompt_len`), `rollout_max_context_len`,
            `hf_checkpoint`, `rollout_shuffle`, `rollout_seed`, `n_samples_per_prompt`,
            `disable_rollout_global_dataset`, `num_rollout`, `save`, `load`, `buffer_filter_path`.

        rows: the rows of `prompt_data` when the caller read them already (`load_prompt_rows`; the dry run, which
            also shows the first one); None reads the file.

    Raises:
        ValueError: no `--prompt-data` (and no `--disable-rollout-global-dataset`, and not an eval-only run:
            `--num-rollout 0`), or no prompt left.
    """

    def __init__(self, args: SlimeArgs, *, rows: PromptRows | None = None) -> None:
        self.args = args
        self.n_samples_per_prompt = args.n_samples_per_prompt
        self.epoch_id = 0
        self.sample_offset = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.metadata: dict[str, Any] = {}
        self.prompts: list[Sample] = []
        self._order: np.ndarray = np.arange(0)
        self._shuffle_order = ORIGINAL  # a resumed cursor may name the order its run began with
        # (--rollout-shuffle, --rollout-seed) of the epoch being served: a cursor resumed mid-epoch under other values
        # finishes that epoch in its saved order (another permutation at the saved offset repeats and skips prompts).
        self._epoch_flags: tuple[bool, int] = (bool(args.rollout_shuffle), int(args.rollout_seed))
        if args.disable_rollout_global_dataset or (args.num_rollout == 0 and not args.prompt_data):
            return  # no prompts: custom generate functions make them, or an eval-only run (--num-rollout 0) needs none
        if not args.prompt_data:
            raise ValueError("--prompt-data is required (or --disable-rollout-global-dataset)")
        max_prompt_len = default_max_prompt_len(args)
        flag = "--rollout-max-prompt-len"
        if args.rollout_max_prompt_len is None and max_prompt_len is not None:
            flag += " (default: the context less one token)"
            logger.info("--rollout-max-prompt-len not set: prompts longer than %d tokens are dropped", max_prompt_len)
        rows = load_prompt_rows(args.prompt_data) if rows is None else rows
        tokenizer = get_tokenizer(args.hf_checkpoint) if _needs_tokenizer(args, max_prompt_len, rows) else None
        self.prompts = rows_to_samples(
            rows,
            source=str(args.prompt_data),
            input_key=args.input_key,
            label_key=args.label_key,
            metadata_key=args.metadata_key,
            tool_key=args.tool_key,
            tokenizer=tokenizer,
            apply_chat_template=args.apply_chat_template,
            apply_chat_template_kwargs=dict(args.apply_chat_template_kwargs),
            max_prompt_len=max_prompt_len,
            multimodal_keys=args.multimodal_keys,
            processor_path=args.hf_checkpoint,
            max_prompt_len_flag=flag,
            number_prompts=args.custom_generate_function_path is not None,
            conversations=_serves_sft(args),
        )
        if not rows:
            raise ValueError(f"--prompt-data {args.prompt_data}: no rows")
        if not self.prompts:  # bad rows raise above: only the length limit drops rows
            raise ValueError(
                f"--prompt-data {args.prompt_data}: no prompts left: all {len(rows)} are longer than {flag}="
                f"{max_prompt_len} tokens"
            )
        if args.rollout_batch_size > len(self.prompts):  # allowed (an overfit run), but said: GRPO groups repeat
            logger.warning(
                "--rollout-batch-size %d is more than the %d prompts of --prompt-data %s: each rollout wraps past the "
                "end of an epoch and holds the same prompt up to %d times",
                args.rollout_batch_size, len(self.prompts), args.prompt_data,
                -(-args.rollout_batch_size // len(self.prompts)),
            )  # fmt: skip
        elif (args.over_sampling_batch_size or 0) > len(self.prompts):
            # One draw (`get_samples(--over-sampling-batch-size)`) then holds a prompt twice: said, as above.
            logger.warning(
                "--over-sampling-batch-size %d is more than the %d prompts of --prompt-data %s: each over-sampling "
                "draw wraps past the end of an epoch and holds the same prompt up to %d times",
                args.over_sampling_batch_size, len(self.prompts), args.prompt_data,
                -(-args.over_sampling_batch_size // len(self.prompts)),
            )  # fmt: skip
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        shuffle, seed = self._epoch_flags
        return epoch_order(len(self.prompts), shuffle=shuffle, seed=seed, epoch=epoch, kind=self._shuffle_order)

    def __len__(self) -> int:
        return len(self.prompts)

    def _next_prompt(self) -> Sample:
        if self.sample_offset >= len(self.prompts):
            self.epoch_id += 1
            self.sample_offset = 0
            self._epoch_flags = (bool(self.args.rollout_shuffle), int(self.args.rollout_seed))  # this run's, from now
            self._order = self._epoch_order(self.epoch_id)
        prompt = self.prompts[int(self._order[self.sample_offset])]
        self.sample_offset += 1
        return prompt

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` groups of `n_samples_per_prompt` fresh samples each."""
        groups = []
        for _ in range(num_groups):
            prompt = Sample() if not self.prompts else self._next_prompt()
            group = []
            for _ in range(self.n_samples_per_prompt):
                sample = copy.deepcopy(prompt)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Not supported without a buffer."""
        raise RuntimeError("RolloutDataSource has no buffer; use RolloutDataSourceWithBuffer for --partial-rollout")

    # ---- cursor ------------------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return {
            "epoch_id": self.epoch_id,
            "sample_offset": self.sample_offset,
            "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index,
            "metadata": self.metadata,
            "shuffle_order": self._shuffle_order,
            "epoch_shuffle": self._epoch_flags[0],
            "epoch_seed": self._epoch_flags[1],
            "num_prompts": len(self.prompts),
        }

    def _set_state(self, state: dict[str, Any]) -> None:
        self.epoch_id = int(state["epoch_id"])
        self.sample_offset = int(state["sample_offset"])
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
        self.metadata = dict(state.get("metadata", {}))
        self._shuffle_order = str(state.get("shuffle_order", LEGACY_NUMPY))  # absent: written before the field was
        self._epoch_flags = resumed_epoch_flags(state, self.args, self.sample_offset, len(self.prompts))
        self._order = self._epoch_order(self.epoch_id)
        warn_other_prompt_count(state, len(self.prompts), self.args.prompt_data)

    def _buffered(self) -> list[Sample]:
        """The samples the cursor holds (none here; it had no buffer, so `save` raised AttributeError)."""
        return []

    @staticmethod
    def state_path(root: str | os.PathLike[str], rollout_id: int) -> pathlib.Path:
        """Where the cursor of `rollout_id` lives under a checkpoint root (`data.cursor_file.cursor_path`)."""
        return cursor_path(root, rollout_id)

    def save(self, rollout_id: int) -> None:
        """Writes the cursor to `{--save}/rollout/data_source_{rollout_id}.json` atomically (no-op without --save).

        Raises:
            TypeError: if buffered samples hold values JSON cannot store.
        """
        root = self.args.save
        if not root:
            return
        path = self.state_path(root, rollout_id)
        write_cursor(path, self._state(), self._buffered())
        logger.info("saved data-source cursor to %s", path)

    def load(self, rollout_id: int | None = None) -> None:
        """Restores the cursor saved under `--load` for `rollout_id` (no-op without --load or file).

        Without this version's file, the original slime's is read (`slime_rollout.data.cursor_file.read_cursor`).

        Raises:
            ValueError: the file exists but is not a valid cursor.
        """
        root = self.args.load
        if not root or rollout_id is None:
            return
        found = read_cursor(root, rollout_id)
        if found is None:
            logger.warning(
                "no data-source cursor at %s; starting from the beginning", self.state_path(save_root(root), rollout_id)
            )
            return
        path, state = found
        try:
            self._set_state(state)
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"{path}: bad data-source cursor ({e})") from e
        logger.info(
            "restored data-source cursor from %s (epoch %d, offset %d)", path, self.epoch_id, self.sample_offset
        )


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """`RolloutDataSource` plus a buffer of partial/aborted groups that is served first.

    `--buffer-filter-path fn(args, rollout_id, buffer, num_groups) -> list[list[Sample]]` picks what to
    take from the buffer (it must remove them from `buffer`); by default the oldest groups go first.
    """

    def __init__(self, args: SlimeArgs, *, rows: PromptRows | None = None) -> None:
        super().__init__(args, rows=rows)
        self.buffer: list[list[Sample]] = []

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """Buffered groups first, then fresh groups from the dataset."""
        taken = self._take_from_buffer(num_groups)
        return taken + super().get_samples(num_groups - len(taken))

    def _take_from_buffer(self, num_groups: int) -> list[list[Sample]]:
        if not self.buffer or num_groups <= 0:
            return []
        return take_from_buffer(self.args, self.buffer, num_groups)  # checks --buffer-filter-path's contract

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Appends unfinished groups (partial rollout) to the buffer.

        Raises:
            ValueError: a group does not have `n_samples_per_prompt` samples.
        """
        for group in groups:
            if len(group) != self.n_samples_per_prompt:
                raise ValueError(f"add_samples: group of {len(group)} samples, expected {self.n_samples_per_prompt}")
            self.buffer.append(group)

    def _buffered(self) -> list[Sample]:
        return [s for group in self.buffer for s in group]

    # The original's accessors, which its rollout-buffer example (`slime_plugins/rollout_buffer`) and rollout
    # functions written from it call on the data source they are handed.

    def get_buffer_length(self) -> int:
        """Number of groups in the buffer (groups, not samples, as in the original)."""
        return len(self.buffer)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merges `metadata` into the cursor's metadata, saved with the checkpoint (JSON values, string keys)."""
        self.metadata.update(metadata)

    def get_metadata(self) -> dict[str, Any]:
        """The cursor's metadata (the dict itself, as in the original)."""
        return self.metadata

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        state["buffer"] = [[s.to_dict() for s in group] for group in self.buffer]
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self.buffer = [[Sample.from_dict(d) for d in group] for group in state.get("buffer", [])]

    def load(self, rollout_id: int | None = None) -> None:
        """`RolloutDataSource.load`; buffered groups of another `--n-samples-per-prompt` are dropped, counted."""
        super().load(rollout_id)
        if self.buffer and self.args.load and rollout_id is not None:
            where = self.state_path(save_root(self.args.load), rollout_id)
            self.buffer = keep_groups_of_size(self.buffer, self.n_samples_per_prompt, where)
