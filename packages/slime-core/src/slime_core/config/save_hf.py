"""`--save-hf`: the path template an HF export is written to, checked before the run starts.

The template is filled in at each export as the original does (`save_hf.format(rollout_id=rollout_id)`), and the
exporter replaces whatever directory is there. So a template is refused when:

* a replacement field is anything but `rollout_id` with an optional conversion and format spec (`{step}`, `{}`,
  `{rollout_id.x}`, `{rollout_id[0]}`), or formatting raises anything (an unbalanced brace, `{rollout_id:s}`);
* a format spec holds a width or precision over 255 (checked before formatting: a huge one would allocate GBs);
* it formats to an empty path, a path with a NUL or other control character (`{rollout_id:c}` at rollout 0), or a
  path component longer than 255 bytes (the usual filesystem name limit);
* a formatted path equals, contains or lies inside a directory the run reads or writes checkpoints in
  (`--save`, `--load`, `--hf-checkpoint`, `--ref-load`, `--critic-load`, `--critic-save`, `--opd-teacher-load`,
  `--update-weight-disk-dir`), compared as absolute, symlink-resolved paths: replacing it would delete those
  checkpoints or the source model;
* a formatted path equals or contains any other path the run reads or writes (`--prompt-data`, each
  `--eval-prompt-data` file, `--output-dir`, dumps, config files, ...: `CONTAINED_PATH_FLAGS`), the current working
  directory or the home directory (an export inside them is fine);
* a formatted path (or its `.tmp`/`.old` sibling) already exists and is a file, a link or a non-empty folder that
  slime did not write (`slime_core.dir_swap.refusal`): an export never deletes a user's folder.

Formatted with the rollout ids `SAMPLE_ROLLOUT_IDS` and, when `--num-rollout` is known, every id up to it (at most
`_MAX_ENUMERATED` of them), so a collision at a later rollout is found too.
"""

from __future__ import annotations

import os
import re
import string
from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError
from slime_core.dir_swap import old_dir, refusal, staging_dir
from slime_core.error_text import preview

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = ["CONTAINED_PATH_FLAGS", "PROTECTED_PATH_FLAGS", "SAMPLE_ROLLOUT_IDS", "check_save_hf", "save_hf_paths"]

SAMPLE_ROLLOUT_IDS = (0, 1, 12345)
# The checkpoint directories an export must not replace, by config field.
PROTECTED_PATH_FLAGS = (
    "save",
    "load",
    "hf_checkpoint",
    "ref_load",
    "critic_load",
    "critic_save",
    "opd_teacher_load",
    "update_weight_disk_dir",
)
# Every other path the run reads or writes, by config field: an export must not be or contain one (it may lie
# inside a directory one of them names, e.g. `--save-hf outputs/hf` beside `--output-dir outputs`).
CONTAINED_PATH_FLAGS = (
    "prompt_data",
    "eval_prompt_data",
    "eval_config",
    "output_dir",
    "tensorboard_dir",
    "wandb_dir",
    "dump_details",
    "save_debug_rollout_data",
    "load_debug_rollout_data",
    "save_debug_train_data",
    "memory_snapshot_dir",
    "ci_save_grad_norm",
    "ci_load_grad_norm",
    "custom_config_path",
    "sglang_config",
    "megatron_config_path",
    "engine_python",
)
_SLICE = re.compile(r"@\[[^\]]*\]$")  # `--prompt-data path@[start:end]`
_MAX_ENUMERATED = 10_000
_NAME_MAX = 255  # bytes per path component on ext4/xfs/btrfs


def save_hf_paths(template: str, rollout_ids: list[int] | tuple[int, ...]) -> dict[int, str]:
    """Formats `template` for each rollout id and checks the result is a usable path.

    Args:
        template: the `--save-hf` value.
        rollout_ids: the ids to format with.

    Returns:
        rollout id -> formatted path.

    Raises:
        ConfigError: formatting raised (any exception), or a result is empty, holds a control character or a
            component over 255 bytes; the one-line message names `--save-hf`.
    """
    out = {}
    for rollout_id in rollout_ids:
        try:
            parsed = [(field, spec) for _, field, spec, _ in string.Formatter().parse(template) if field is not None]
            fields = [field for field, _ in parsed]
            if any(field != "rollout_id" for field in fields):  # attribute/index access reaches into the int
                raise KeyError(next(field for field in fields if field != "rollout_id"))
            # A width or precision past a name's length is refused before it is built: `{rollout_id:1000000000}`
            # would allocate a 1 GB string per rollout id (70 s and GBs of memory to then refuse it).
            sizes = [int(n) for _, spec in parsed for n in re.findall(r"\d+", spec or "")]
            if any(n > _NAME_MAX for n in sizes):
                raise ValueError(f"a width or precision of {max(sizes)} (a path component is at most {_NAME_MAX})")
            path = template.format(rollout_id=rollout_id)
        except Exception as e:  # noqa: BLE001 - a user's template may raise anything str.format can
            raise ConfigError(
                f"--save-hf {template!r}: cannot be filled in with rollout_id={rollout_id} "
                f"({type(e).__name__}: {e}); only {{rollout_id}} (with an optional format spec such as "
                "{rollout_id:05d}) can be filled in; write a literal brace as {{ or }}"
            ) from None
        if not path:
            raise ConfigError(f"--save-hf {template!r}: the path is empty at rollout {rollout_id}")
        bad = sorted({c for c in path if ord(c) < 0x20 or ord(c) == 0x7F})
        if bad:
            raise ConfigError(
                f"--save-hf {template!r}: the path at rollout {rollout_id} is {path!r}, which holds control "
                f"character(s) {', '.join(repr(c) for c in bad)}"
            )
        long = [part for part in path.split(os.sep) if len(part.encode("utf-8", "surrogatepass")) > _NAME_MAX]
        if long:
            raise ConfigError(
                f"--save-hf {template!r}: at rollout {rollout_id} a path component is {len(long[0])} characters "
                f"(at most {_NAME_MAX} bytes): {preview(long[0], 43)}"
            )
        out[rollout_id] = path
    return out


def _contains(outer: str, inner: str) -> bool:
    """Whether absolute, normalized `inner` is `outer` or lies inside it."""
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _overlap(a: str, b: str) -> bool:
    """Whether two absolute, normalized paths are equal or one lies inside the other."""
    return _contains(a, b) or _contains(b, a)


def _paths_of(args: SlimeArgs, field: str) -> list[str]:
    """The filesystem paths a path flag names: a slice suffix dropped, the fixed part of a `{rollout_id}` template."""
    value = getattr(args, field, None)
    if not value:
        return []
    values = list(value[1::2]) if field == "eval_prompt_data" else [value]  # name path [name path ...]
    out = []
    for v in values:
        v = _SLICE.sub("", str(v))
        if "{" in v:  # a dump template: the directory before the first field
            v = os.path.dirname(v.split("{", 1)[0]) or "."
        out.append(v)
    return out


def _overlap_error(template: str, rollout_id: int, here: str, what: str, other: str, how: str) -> ConfigError:
    return ConfigError(
        f"--save-hf {template!r} (at rollout {rollout_id}: {here}) {how} {what} ({other}): each export replaces "
        "its whole directory; give --save-hf a directory of its own"
    )


def check_save_hf(args: SlimeArgs) -> None:
    """Refuses a `--save-hf` template that cannot be formatted or whose export would delete data (see the module doc).

    Raises:
        ConfigError: one line naming `--save-hf` (and the other flag or folder for an overlap).
    """
    template = args.save_hf
    if template is None:
        return
    ids = set(SAMPLE_ROLLOUT_IDS)
    if args.num_rollout is not None:
        ids.update(range(min(args.num_rollout, _MAX_ENUMERATED)))
    paths = save_hf_paths(template, sorted(ids))
    strict = [(f, p, os.path.realpath(p)) for f in PROTECTED_PATH_FLAGS for p in _paths_of(args, f)]
    contained = [(f, p, os.path.realpath(p)) for f in CONTAINED_PATH_FLAGS for p in _paths_of(args, f)]
    places = [("the current working directory", os.getcwd()), ("the home directory", os.path.expanduser("~"))]
    seen: set[str] = set()
    for rollout_id, path in paths.items():
        if path in seen:  # a template without {rollout_id} is one path
            continue
        seen.add(path)
        here = os.path.realpath(path)
        for what, place in places:
            if _contains(here, os.path.realpath(place)):
                raise _overlap_error(template, rollout_id, here, what, place, "is or contains")
        for field, other, resolved in strict:
            if _overlap(here, resolved):
                what = f"--{field.replace('_', '-')} {other}"
                raise _overlap_error(template, rollout_id, here, what, resolved, "overlaps")
        for field, other, resolved in contained:
            if _contains(here, resolved):
                what = f"--{field.replace('_', '-')} {other}"
                raise _overlap_error(template, rollout_id, here, what, resolved, "is or contains")
        for p in (path, staging_dir(path), old_dir(path)):
            reason = refusal(p)
            if reason is not None:
                raise ConfigError(
                    f"--save-hf {template!r} (at rollout {rollout_id}): {p} {reason}; an export replaces its "
                    "folder, so give --save-hf a new or empty folder of its own (or move that one away)"
                )
