"""`--ref-load`: checked against the backend before starting, and converted to HF once for FSDP.

The original's scripts give `--ref-load` as a torch_dist directory (converted from the HF checkpoint with
`convert_hf_to_torch_dist.py`). The Megatron backend reads it as it is; the FSDP backend needs HF weights, so the
run converts it once into `<--output-dir>/ref_load_hf` (reused while the source is unchanged).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib

from slime_app.checkpoint_kinds import checkpoint_kind, with_article
from slime_app.dcp_shards import check_shards, checkpoint_state_dirs
from slime_app.fp8_rollout import serving_fp8
from slime_core.config import SlimeArgs
from slime_core.extensions import train_backend_spec

logger = logging.getLogger(__name__)

__all__ = ["check_ref_load", "fsdp_reference_dir"]


def check_ref_load(cfg: SlimeArgs, notes: list[str]) -> None:
    """`--ref-load` against what the backend reads (Megatron: torch_dist; FSDP: HF, or torch_dist converted once).

    Appends one note to `notes` saying how it is read (or that it is not).

    Raises:
        FileNotFoundError: no checkpoint there.
        ValueError: a kind the backend cannot read, a torch_dist shard lacking bytes, or a model slime-convert
            cannot convert for FSDP (each names the flag and what to give instead).
    """
    kind = checkpoint_kind(cfg.ref_load)
    if kind in ("missing", "empty"):
        raise FileNotFoundError(f"--ref-load {cfg.ref_load}: no checkpoint there ({kind})")
    if kind == "torch_dist":  # read by Megatron, or converted for FSDP: either way every shard (metadata only)
        root = pathlib.Path(cfg.ref_load)
        check_shards("--ref-load", root, checkpoint_state_dirs(root, kind, None), "give a complete copy of it")
    same_as_hf = cfg.hf_checkpoint and os.path.realpath(cfg.ref_load) == os.path.realpath(cfg.hf_checkpoint)
    fp8 = serving_fp8(cfg) is not None  # FP8 serving: --ref-load holds the trainer's BF16 start weights
    if train_backend_spec(cfg).reads_torch_dist:
        if kind == "torch_dist" or same_as_hf or (fp8 and kind == "hf"):
            notes.append(f"--ref-load {cfg.ref_load}: {kind}, the initial and reference weights")
            return
        raise ValueError(
            f"--ref-load {cfg.ref_load}: {with_article(kind)}; the Megatron backend reads --ref-load as torch_dist "
            "(slime-convert hf-to-mcore), or leave it out to start from --hf-checkpoint"
        )
    if not cfg.with_ref and not fp8:
        # FSDP starts from --hf-checkpoint; --ref-load only feeds the reference model of a KL term.
        notes.append(f"--ref-load {cfg.ref_load}: not read (no KL term, so no reference model under FSDP)")
    elif kind == "hf":
        notes.append(
            f"--ref-load {cfg.ref_load}: HF weights of the {'trainer (FP8 serving)' if fp8 else 'reference model'}"
        )
    elif kind == "torch_dist":
        _convertible(cfg)
        notes.append(
            f"--ref-load {cfg.ref_load}: torch_dist; the FSDP {'trainer' if fp8 else 'reference model'} reads it "
            "converted to HF in "
            f"{_converted_dir(cfg)} (converted once, before the run)"
        )
    else:
        raise ValueError(f"--ref-load {cfg.ref_load}: {with_article(kind)}; FSDP needs HF weights or torch_dist")


def _converted_dir(cfg: SlimeArgs) -> pathlib.Path:
    return pathlib.Path(cfg.output_dir) / "ref_load_hf"


def _convertible(cfg: SlimeArgs) -> None:
    from slime_convert.model_args import SUPPORTED_MODEL_TYPES, ModelArgs

    if not cfg.hf_checkpoint:
        raise ValueError(f"--ref-load {cfg.ref_load}: converting torch_dist to HF needs --hf-checkpoint (its config)")
    try:
        ModelArgs.from_hf_dir(cfg.hf_checkpoint, make_vocab_size_divisible_by=cfg.make_vocab_size_divisible_by)
    except ValueError as e:
        raise ValueError(
            f"--ref-load {cfg.ref_load} is torch_dist and FSDP needs HF weights, but slime-convert cannot convert this "
            f"model ({e}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}): give --ref-load as an HF directory, or leave "
            "it out (the reference model is then --hf-checkpoint)"
        ) from None


def _source_stamp(cfg: SlimeArgs) -> dict[str, object]:
    from slime_convert.torch_dist import resolve_iteration_dir

    source = resolve_iteration_dir(cfg.ref_load)
    return {"source": str(source.resolve()), "mtime": (source / ".metadata").stat().st_mtime}


def fsdp_reference_dir(cfg: SlimeArgs, *, convert: bool) -> str | None:
    """For FSDP with a torch_dist `--ref-load`: the HF directory the reference model reads (else None).

    Args:
        cfg: the run config.
        convert: write the conversion now (reused when `ref_load_hf/source.json` names the same source); False
            only names the directory (dry runs).

    Returns:
        The directory to use as `--ref-load`, or None when no conversion is needed.
    """
    # FP8 serving: the trainer's own start weights are the BF16 --ref-load (slime_app.fp8_rollout), KL or not.
    needs_ref = cfg.with_ref or serving_fp8(cfg) is not None
    if train_backend_spec(cfg).reads_torch_dist or not cfg.ref_load or not needs_ref:
        return None
    if checkpoint_kind(cfg.ref_load) != "torch_dist":
        return None
    out = _converted_dir(cfg)
    if not convert:
        return str(out)
    stamp = _source_stamp(cfg)
    marker = out / "source.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        logger.info("--ref-load %s: reusing its HF conversion in %s", cfg.ref_load, out)
        return str(out)
    from slime_convert import mcore_to_hf

    logger.info(
        "--ref-load %s is torch_dist: converting it to HF in %s for the FSDP reference model", cfg.ref_load, out
    )
    # mcore_to_hf writes a config stating the exported dtype and no quantization_config (even from an FP8 origin).
    mcore_to_hf(cfg.ref_load, out, cfg.hf_checkpoint, force=True, progress=False)
    marker.write_text(json.dumps(stamp))
    return str(out)
