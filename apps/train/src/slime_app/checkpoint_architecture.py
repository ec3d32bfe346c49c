"""The checkpoints a run reads against `--hf-checkpoint`'s architecture (config fields, then every key's shape).

`architecture_check` compares fields (`slime_app.checkpoint_shapes`); `key_shapes_check` every stored key the
loaders read (`slime_convert.load_shapes`). Both read headers and `.metadata` only, no tensor.
"""

from __future__ import annotations

import os
import pathlib

from slime_app.checkpoint_kinds import checkpoint_kind, iteration_dir
from slime_core.config import SlimeArgs
from slime_core.error_text import first_sentence
from slime_core.extensions import train_backend_spec

__all__ = ["architecture_check", "grouped", "key_shapes_check"]


def key_shapes_check(cfg: SlimeArgs) -> list[str]:
    """Every stored key the loaders read against the shape `--hf-checkpoint`'s config implies (headers only).

    The field comparison above reads a few tensors (the first layer's projections, the layer count from the highest
    index); this is the check the Megatron backend runs before it loads (`slime_convert.load_shapes`), so a missing
    middle layer or one tensor of another width stops here, before any GPU work, and not in the loader.
    Models slime-convert has no mapping for are compared by fields only (a note says so); FSDP checkpoints and
    `--critic-load` (a value head) are left to the field comparison.

    Raises:
        ValueError: naming the flag, the path, the first mismatching keys and the config fields.
    """
    from slime_convert.load_shapes import check_hf_checkpoint, check_torch_dist_checkpoint
    from slime_convert.model_args import ModelArgs

    if not cfg.hf_checkpoint or not (pathlib.Path(cfg.hf_checkpoint) / "config.json").is_file():
        return []
    try:
        args = ModelArgs.from_hf_dir(cfg.hf_checkpoint, make_vocab_size_divisible_by=cfg.make_vocab_size_divisible_by)
    except ValueError as e:
        return [f"--hf-checkpoint {cfg.hf_checkpoint}: tensor shapes not checked key by key ({first_sentence(e)})"]
    checked = []
    for flag, path in (("--hf-checkpoint", cfg.hf_checkpoint), ("--ref-load", cfg.ref_load), ("--load", cfg.load)):
        kind = checkpoint_kind(path) if path else None
        if kind == "hf" and any(pathlib.Path(path).glob("*.safetensors")):
            if not check_hf_checkpoint(flag, path, args, config_dir=cfg.hf_checkpoint, mapped_only=True):
                continue
        elif kind == "torch_dist":
            step = cfg.ckpt_step if flag == "--load" else None
            # The Megatron model's rows must be the checkpoint's; an export to HF (FSDP) drops any padding.
            tp = cfg.tensor_model_parallel_size if train_backend_spec(cfg).reads_torch_dist else None
            check_torch_dist_checkpoint(
                flag, path, args, config_dir=cfg.hf_checkpoint, ckpt_step=step, tensor_model_parallel_size=tp
            )
        else:
            continue
        checked.append(flag)
    return (
        [f"{', '.join(checked)}: every tensor's shape checked against --hf-checkpoint's config.json"] if checked else []
    )


def grouped(mismatches: list[str]) -> str:
    """`"A vs B: fact"` lines as one clause per checkpoint pair, each fact once.

    A 2-layer `--ref-load` against a 36-layer model gave 13 clauses repeating both paths, and the same size twice
    (`config.json hidden_size 16 vs 2560`, then `hidden_size 16 vs 2560` read from the weights).
    """
    groups: dict[str, list[str]] = {}
    for line in mismatches:
        pair, _, fact = line.rpartition(": ")
        facts = groups.setdefault(pair, [])
        if fact not in facts and f"config.json {fact}" not in facts:
            facts.append(fact)
    return "; ".join(f"{pair}: {', '.join(facts)}" for pair, facts in groups.items())


def _fields_of(flag: str, path: str, kind: str) -> dict[str, int | None] | None:
    """The architecture fields of the checkpoint at `path` (`slime_app.checkpoint_shapes`); None for other kinds.

    Raises:
        ValueError: its `.metadata` cannot be read (message names the flag).
    """
    from slime_app.checkpoint_shapes import config_fields, dcp_shapes, tensor_fields

    root = pathlib.Path(path)
    if kind == "hf":
        return config_fields(root)
    if kind == "torch_dist":
        from slime_convert.torch_dist import resolve_iteration_dir

        state = resolve_iteration_dir(root)
    elif kind == "fsdp":
        state = (iteration_dir(root) or root) / "model_and_optim"
        if not (state / ".metadata").is_file():
            return None
    else:
        return None
    try:
        return tensor_fields(dcp_shapes(state))
    except Exception as e:  # noqa: BLE001 - torch's reader raises pickle/EOF errors on a truncated file
        raise ValueError(f"{flag} {path}: cannot read {state / '.metadata'} ({type(e).__name__}: {e})") from None


def _vocab_divisor(cfg: SlimeArgs, path: str, kind: str) -> int:
    """The padding divisor a checkpoint's embedding rows are compared by.

    A torch_dist checkpoint's recorded divisor, else the run's `--make-vocab-size-divisible-by`. A recorded divisor
    other than the run's is the Megatron loader's error (`key_shapes_check`, one line naming both); an export to HF
    (FSDP) drops the padding whatever it is.
    """
    if kind == "torch_dist":
        from slime_convert.torch_dist import resolve_iteration_dir
        from slime_convert.vocab_padding import read_recorded_divisor

        recorded = read_recorded_divisor(resolve_iteration_dir(path))
        if recorded is not None:
            return recorded
    return cfg.make_vocab_size_divisible_by


def architecture_check(cfg: SlimeArgs) -> tuple[list[str], list[str]]:
    """Compares `--ref-load`, `--load` and `--critic-load` with `--hf-checkpoint` (`slime_app.checkpoint_shapes`).

    An HF directory is compared by config.json (`ARCHITECTURE_FIELDS`) and by shapes, and its safetensors weights
    are checked against its own config.json; `--hf-checkpoint`'s weights too.

    Returns:
        (one line per differing field, naming both flags; one note per checkpoint saying what was compared).
    """
    from slime_app.checkpoint_shapes import architecture_mismatches, config_fields, config_mismatches, read_config

    if not cfg.hf_checkpoint or not (pathlib.Path(cfg.hf_checkpoint) / "config.json").is_file():
        return [], []
    expected = config_fields(cfg.hf_checkpoint)
    expected_config = read_config(cfg.hf_checkpoint)
    mismatches = _weights_vs_config("--hf-checkpoint", cfg.hf_checkpoint, cfg.hf_checkpoint)
    loaded = [("--ref-load", cfg.ref_load), ("--load", cfg.load)]
    if cfg.use_critic and cfg.critic_load:
        loaded.append(("--critic-load", cfg.critic_load))
    notes: list[str] = []
    for flag, path in loaded:
        if not path or os.path.realpath(path) == os.path.realpath(cfg.hf_checkpoint):
            continue
        kind = checkpoint_kind(path)
        if kind == "hf" and (pathlib.Path(path) / "config.json").is_file():
            mismatches += _weights_vs_config(flag, path, cfg.hf_checkpoint)
        # An HF critic under FSDP is built from its own config.json (slime_train_fsdp.critic_backend).
        if flag == "--critic-load" and kind == "hf" and not train_backend_spec(cfg).reads_torch_dist:
            notes.append(f"--critic-load {path}: HF, the FSDP value model is built from its own config.json")
            continue
        if kind == "hf" and (pathlib.Path(path) / "config.json").is_file():
            mismatches += [
                f"{flag} {path} vs --hf-checkpoint {cfg.hf_checkpoint}: config.json {field} {have!r} vs {want!r}"
                for field, have, want in config_mismatches(expected_config, read_config(path))
            ]
        found = _fields_of(flag, path, kind)
        if found is None:
            continue
        mismatches += architecture_mismatches(
            expected, found, flag=flag, path=path, hf_checkpoint=cfg.hf_checkpoint,
            vocab_divisor=_vocab_divisor(cfg, path, kind),
        )  # fmt: skip
        shared = [f for f, v in found.items() if v is not None and expected.get(f) is not None]
        notes.append(
            f"{flag} {path}: {', '.join(shared)} compared with --hf-checkpoint" if shared
            else f"{flag} {path}: no architecture field to compare (no config.json or known tensor names)"
        )  # fmt: skip
    return mismatches, notes


def _weights_vs_config(flag: str, path: str, hf_checkpoint: str) -> list[str]:
    """An HF directory's safetensors shapes (headers only) against its own config.json, one line per field.

    Raises:
        ValueError: a safetensors header cannot be read (names the flag and the file).
    """
    from slime_app.checkpoint_shapes import architecture_mismatches, config_fields, safetensors_shapes, tensor_fields

    try:
        found = tensor_fields(safetensors_shapes(path))
    except ValueError as e:
        raise ValueError(f"{flag} {path}: {e}") from None
    return architecture_mismatches(
        config_fields(path), found, flag=flag, path=f"{path} (weights)", hf_checkpoint=hf_checkpoint,
        against="its own config.json",
    )  # fmt: skip
